"""`posenc bench` end to end (micro preset) and its bad-input errors."""

from __future__ import annotations

import json

import pytest

from posenc import list_encodings
from posenc.bench import figures, load_results
from posenc.bench.data import load_corpus
from posenc.bench.report import mean_reciprocal_rank
from posenc.bench.runner import PRESETS, settings_for
from posenc.cli import main

FAST = ["--preset", "micro", "--no-progress", "--encodings", "none", "learned"]


def test_micro_smoke_resume_and_overwrite(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["bench", *FAST, "--tasks", "copy", "passkey", "lm", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "none" in table and "learned" in table and "MRR" in table
    results = load_results(out)
    runs = {(r["task"], r["encoding"]) for r in results["runs"]}
    assert runs == {(t, e) for t in ("copy", "passkey", "lm") for e in ("none", "learned")}
    lm = next(r for r in results["runs"] if r["task"] == "lm")
    assert [p["length"] for p in lm["points"]] == [16, 32]  # L and 2L in the micro preset
    assert (out / "results.csv").read_text().startswith("task,encoding,variant,seed")
    for name in ("task_copy", "task_passkey", "task_lm", "passkey_depth"):
        assert (out / "plots" / f"{name}.png").stat().st_size > 1000
    assert set(figures(results)) >= {"task_copy", "task_lm"}

    # an earlier run is never silently replaced
    assert main(["bench", *FAST, "--tasks", "copy", "--out", str(out)]) == 2
    assert "--resume" in capsys.readouterr().err
    # --resume skips finished runs and adds the new ones
    assert main(["bench", *FAST, "--tasks", "copy", "--seeds", "2", "--out", str(out), "--resume"]) == 0
    again = load_results(out)
    first = next(r for r in results["runs"] if r["task"] == "copy" and r["encoding"] == "none")
    assert first in again["runs"] and len(again["runs"]) == 4
    # other settings cannot resume into the same directory
    assert main(["bench", *FAST, "--steps", "5", "--out", str(out), "--resume"]) == 2
    assert "settings differ" in capsys.readouterr().err
    assert main(["bench", *FAST, "--tasks", "copy", "--out", str(out), "--overwrite"]) == 0
    assert len(load_results(out)["runs"]) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks", "multiply"], "unknown task 'multiply'; valid tasks: copy, reverse, sort, addition, parity, summation, passkey, lm"),
        (["--encodings", "nope"], "unknown encoding 'nope'; valid encodings: "),
        (["--tasks", "lm", "--data", "/no/such/path"], "argument --data: must be an existing file or directory, got '/no/such/path'"),
        (["--steps", "0"], "argument --steps: must be a positive int, got 0"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, capsys, args, message):
    assert main(["bench", "--preset", "micro", "--no-progress", *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err
    if "valid encodings" in message:
        assert all(name in err for name in list_encodings())
    assert not (tmp_path / "o").exists()


def test_empty_data_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_text("")
    for p in (tmp_path / "empty", tmp_path / "blank.txt"):
        assert main(["bench", "--preset", "micro", "--tasks", "lm", "--data", str(p), "--out", str(tmp_path / "o")]) == 2
        assert "holds no usable text" in capsys.readouterr().err


def test_corpus_split_by_file_is_deterministic(tmp_path):
    for i in range(20):
        (tmp_path / f"f{i:02d}.txt").write_text(f"file {i}\n" * 3)
    (tmp_path / ".hidden").write_text("never read")
    c = load_corpus(tmp_path)
    val = bytes(c.val.tolist()).decode()
    assert "file 9\n" in val and "file 19\n" in val and "file 8\n" not in val  # every 10th file
    assert "never" not in bytes(c.train.tolist()).decode()
    assert load_corpus(tmp_path).train.equal(c.train)
    one = load_corpus(tmp_path / "f00.txt")  # a single file: its last tenth is validation
    assert len(one.train) + len(one.val) == len("file 0\n" * 3)
    default = load_corpus(None, max_bytes=5000)
    assert len(default.train) == 5000 and "standard library" in default.source


def test_preset_skips_unregistered_encodings(capsys):
    s = settings_for("full")
    assert set(s.encodings) <= set(list_encodings())
    if set(PRESETS["full"]["encodings"]) - set(list_encodings()):
        assert "skipping encodings not registered yet" in capsys.readouterr().err
    with pytest.raises(ValueError, match="valid presets: micro, quick, full"):
        settings_for("huge")


def test_mean_reciprocal_rank_by_hand():
    rows = [
        # task a (accuracy, higher is better): x 0.9 (rank 1), y 0.5 (2), z 0.5 (2, tie)
        dict(task="a", encoding="x", variant="base", metric="accuracy", beyond_mean=0.9),
        dict(task="a", encoding="y", variant="base", metric="accuracy", beyond_mean=0.5),
        dict(task="a", encoding="z", variant="base", metric="accuracy", beyond_mean=0.5),
        # task b (perplexity, lower is better): z 3 (1), y 4 (2), x 9 (3)
        dict(task="b", encoding="x", variant="base", metric="ppl", beyond_mean=9.0),
        dict(task="b", encoding="y", variant="base", metric="ppl", beyond_mean=4.0),
        dict(task="b", encoding="z", variant="base", metric="ppl", beyond_mean=3.0),
        dict(task="b", encoding="x", variant="yarn", metric="ppl", beyond_mean=1.0),  # not ranked
    ]
    mrr = mean_reciprocal_rank(rows)
    assert mrr == pytest.approx({"x": (1 + 1 / 3) / 2, "y": (1 / 2 + 1 / 2) / 2, "z": (1 / 2 + 1) / 2})
    assert list(mrr) == ["z", "x", "y"]


def test_two_seeds_with_rope_scalings_end_to_end(tmp_path, capsys):
    """Issue: with 2 seeds the summary crashed on the NaN "inside" values of the RoPE-scaling
    variants (statistics.stdev raises on NaN). Mean and std are now checked against the runs."""
    import math
    import statistics

    from posenc.bench.report import summarise

    out = tmp_path / "b"
    assert main(["bench", *FAST, "--encodings", "none", "rope", "--tasks", "reverse", "--seeds", "2",
                 "--out", str(out)]) == 0
    assert "MRR" in capsys.readouterr().out
    runs = load_results(out)["runs"]
    assert len(runs) == 4
    rows = summarise(runs)
    assert any(r["variant"] != "base" for r in rows), "no RoPE-scaling variant was evaluated"
    base = next(r for r in rows if r["encoding"] == "rope" and r["variant"] == "base")
    L = runs[0]["train_length"]
    inside = [statistics.fmean(p["value"] for p in r["points"] if p["variant"] == "base" and p["length"] <= L)
              for r in runs if r["encoding"] == "rope"]
    assert base["seeds"] == 2
    assert math.isclose(base["in_mean"], statistics.fmean(inside), abs_tol=1e-12)
    assert math.isclose(base["in_std"], statistics.stdev(inside), abs_tol=1e-12)
