"""`posenc bench` end to end (micro preset) and its bad-input errors."""

from __future__ import annotations

import json

import pytest

from posenc import list_encodings
from posenc.bench import figures
from posenc.results import read_results
from posenc.bench.data import load_corpus
from posenc.bench.summary import mean_reciprocal_rank
from posenc.bench.settings import PRESETS, settings_for
from posenc.cli import main

FAST = ["--preset", "micro", "--no-progress", "--encodings", "none", "learned"]


def test_micro_smoke_resume_and_overwrite(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["bench", *FAST, "--tasks", "copy", "passkey", "lm", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "none" in table and "learned" in table and "MRR" in table
    results = read_results(out)
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
    again = read_results(out)
    first = next(r for r in results["runs"] if r["task"] == "copy" and r["encoding"] == "none")
    assert first in again["runs"] and len(again["runs"]) == 4
    # other settings cannot resume into the same directory
    assert main(["bench", *FAST, "--steps", "5", "--out", str(out), "--resume"]) == 2
    assert "settings differ" in capsys.readouterr().err
    assert main(["bench", *FAST, "--tasks", "copy", "--out", str(out), "--overwrite"]) == 0
    assert len(read_results(out)["runs"]) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks", "multiply"], "unknown task 'multiply'; valid tasks: copy, reverse, sort, addition, parity, summation, passkey, selective_copy, count, lm"),
        (["--encodings", "nope"], "unknown encoding 'nope'; valid encodings: "),
        (["--tasks", "lm", "--data", "/no/such/path"], "argument --data: must be an existing file or directory, got '/no/such/path'"),
        (["--steps", "0"], "argument --steps: must be an int in [1, 100000000], got 0"),
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


def test_unknown_preset():
    from posenc.bench.settings import ROPE_VARIANTS, sequence_encodings

    # every registered 1-D encoding, and RoPE's variants
    assert settings_for("paper").encodings == sequence_encodings() + tuple(ROPE_VARIANTS.values())
    with pytest.raises(ValueError, match="valid presets: micro, quick, "):
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

    from posenc.bench.summary import summarise

    out = tmp_path / "b"
    assert main(["bench", *FAST, "--encodings", "none", "rope", "--tasks", "reverse", "--seeds", "2",
                 "--out", str(out)]) == 0
    assert "MRR" in capsys.readouterr().out
    runs = read_results(out)["runs"]
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


# ---- the harness as users extend it: variants, size flags, user modules, the docs' examples --

import dataclasses  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from posenc.cli.bench import SIZE_FLAGS, _OWN_FLAGS, _overrides  # noqa: E402
from posenc.bench.build import build_model  # noqa: E402
from posenc.bench.settings import BenchSettings  # noqa: E402
from posenc.cli import build_parser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--d-model", "16", "--layers", "1", "--heads", "2", "--steps", "2", "--batch-size", "4",
        "--eval-examples", "2", "--synthetic-length", "3"]


def test_every_setting_has_a_flag_and_reaches_the_settings(tmp_path):
    """Each BenchSettings field (but the lists with their own flags) is settable from the
    command line, and the value given is the value the settings hold."""
    given = {
        "--d-model": ["48"], "--layers": ["3"], "--heads": ["6"], "--steps": ["7"], "--batch-size": ["5"],
        "--lr": ["0.01"], "--warmup-steps": ["0"], "--synthetic-length": ["11"], "--eval-examples": ["9"],
        "--passkey-length": ["40"], "--passkey-eval-factors": ["1", "2.5", "7"], "--passkey-depths": ["0", "0.3"],
        "--passkey-examples": ["3"], "--lm-length": ["20"], "--lm-batch-size": ["2"], "--lm-eval-factors": ["1", "3"],
        "--lm-train-bytes": ["999"], "--lm-eval-tokens": ["77"], "--scalings": ["ntk", "yarn"], "--eval-seed": ["5"],
        "--embedding": ["gpt2"],
    }
    expected = dict(d_model=48, n_layer=3, n_head=6, steps=7, batch_size=5, lr=0.01, warmup_steps=0, synthetic_length=11,
                    eval_examples=9, passkey_length=40, passkey_eval_factors=(1.0, 2.5, 7.0), passkey_depths=(0.0, 0.3),
                    passkey_examples=3, lm_length=20, lm_batch_size=2, lm_eval_factors=(1, 3), lm_train_bytes=999,
                    lm_eval_tokens=77, scalings=("ntk", "yarn"), eval_seed=5, embedding="gpt2")
    assert set(expected) == set(SIZE_FLAGS)
    parser = build_parser([])
    args = parser.parse_args(["bench", "--out", str(tmp_path / "o"), *[x for k, v in given.items() for x in (k, *v)]])
    s = settings_for("micro", **_overrides(args))
    assert {k: getattr(s, k) for k in expected} == expected
    # completeness: every other field has a generic flag (a new setting is settable at once)
    dests = {a.dest for a in parser._subparsers._group_actions[0].choices["bench"]._actions}
    fields = [f.name for f in dataclasses.fields(BenchSettings)]
    assert fields
    missing = [f for f in fields if f not in _OWN_FLAGS and f"set_{f}" not in dests]
    assert not missing, f"BenchSettings fields without a flag: {missing}"
    # --scalings with no value: no scaled rows
    args = parser.parse_args(["bench", "--out", str(tmp_path / "o"), "--scalings"])
    assert settings_for("micro", **_overrides(args)).scalings == ()


def test_variants_sizes_and_resume_end_to_end(tmp_path, capsys):
    out = tmp_path / "v"
    argv = ["bench", "--preset", "micro", "--no-progress", "--encodings", "rope", "rope:base=5e5", "rope:base=10000",
            "--tasks", "reverse", *TINY, "--out", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "rope@base=500000.0" in table
    stored = json.loads((out / "bench.json").read_text())
    assert stored["encodings"] == ["rope", "rope@base=500000.0"]  # rope:base=10000 is rope: run once
    assert stored["d_model"] == 16 and stored["synthetic_length"] == 3
    runs = read_results(out)["runs"]
    assert sorted(r["encoding"] for r in runs) == ["rope", "rope@base=500000.0"]
    assert [p["length"] for p in runs[0]["points"] if p["variant"] == "base"] == [1, 2, 3, 4, 5, 6]  # 1..2L
    done = out / "runs" / "reverse" / "rope@base=500000.0" / "seed0" / "result.json"
    before = done.stat().st_mtime_ns
    # the variant's model really has the base it names, and the sizes given
    s = settings_for("micro", encodings=stored["encodings"], tasks=["reverse"], d_model=16, n_layer=1, n_head=2)
    model = build_model(s, "rope@base=500000.0", "reverse", 0)
    assert [e.config.base for e in model.encodings] == [500000.0]
    assert model.cfg.d_model == 16 and len(model.blocks) == 1
    # --resume with the same flags (and another spelling of the variant) retrains nothing
    argv[argv.index("rope:base=5e5")] = "rope:base=500000"
    assert main([*argv, "--resume"]) == 0
    assert done.stat().st_mtime_ns == before
    assert len(read_results(out)["runs"]) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--encodings", "rope:rotary_dim=64"], "encoding 'rope@rotary_dim=64' cannot be built with these settings: rotary_dim"),
        (["--encodings", "none", "--heads", "3"], "--d-model (16) must be divisible by --heads (3)"),
        (["--encodings", "none", "--tasks", "addition", "--synthetic-length", "0"], "argument --synthetic-length: must be an int in [1, 1048576], got 0"),
    ],
)
def test_impossible_settings_fail_before_training(tmp_path, capsys, args, message):
    argv = ["bench", "--preset", "micro", "--no-progress", "--d-model", "16", "--heads", "2", *args, "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _doc_blocks(lang: str) -> list[str]:
    text = (ROOT / "docs" / "bench.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


ENCODING_PLUGIN = '''
from posenc import register
from posenc.relative.alibi import ALiBi


@register("alibi_again", family="relative", summary="ALiBi registered by a user module", paper="a test")
class AlibiAgain(ALiBi):
    """The same computation as alibi under another name: its results must equal alibi's."""
'''


def test_user_module_through_the_console_script(tmp_path):
    """The docs' task module plus an encoding, loaded with --import by the installed console
    script (which, unlike `python -m`, does not put the current directory on sys.path)."""
    task_block = [b for b in _doc_blocks("python") if "register_task" in b]
    assert len(task_block) == 1
    (tmp_path / "mytasks.py").write_text(task_block[0] + ENCODING_PLUGIN)
    exe = shutil.which("posenc", path=str(Path(sys.executable).parent))
    assert exe, "the posenc console script is not installed next to this interpreter"
    env = dict(__import__("os").environ, OMP_NUM_THREADS="1")

    def posenc(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([exe, *argv], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)

    listed = posenc("--import", "mytasks", "list", "--tasks")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^repeat\s+Write the input twice\.\s+\[mytasks, min length 1\]$", listed.stdout, re.M)
    out = tmp_path / "out"
    run = posenc("--import", "mytasks.py", "bench", "--preset", "micro", "--no-progress", "--tasks", "repeat",
                 "--encodings", "alibi", "alibi_again", "alibi_again:symmetric=false", *TINY, "--out", str(out))
    assert run.returncode == 0, run.stderr
    runs = {r["encoding"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    assert set(runs) == {"alibi", "alibi_again", "alibi_again@symmetric=false"}
    assert all(r["task"] == "repeat" for r in runs.values())
    # an encoding registered by user code computes what its definition says: here, alibi's numbers
    assert runs["alibi_again"]["points"] == runs["alibi"]["points"]
    assert runs["alibi_again"]["train_loss"] == runs["alibi"]["train_loss"]
    # without --import the names are unknown, and the error says so in one line
    missing = posenc("bench", "--preset", "micro", "--tasks", "repeat", "--out", str(tmp_path / "x"))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1].startswith("posenc bench: error: unknown task 'repeat'; valid tasks: copy,")


def test_docs_python_examples_run(tmp_path, monkeypatch):
    """Every ```python block of docs/bench.md runs as written, in a fresh interpreter, in a
    folder holding the runs/quick the report example reads (a micro run)."""
    blocks = _doc_blocks("python")
    assert len(blocks) >= 3
    assert main(["bench", "--preset", "micro", "--no-progress", "--encodings", "none", "--tasks", "copy",
                 *TINY, "--out", str(tmp_path / "runs" / "quick")]) == 0
    for i, block in enumerate(blocks):
        (tmp_path / f"block{i}.py").write_text(block)
        proc = subprocess.run([sys.executable, f"block{i}.py"], cwd=tmp_path, capture_output=True, text=True,
                              env=dict(__import__("os").environ, OMP_NUM_THREADS="1"), timeout=600)
        assert proc.returncode == 0, f"docs/bench.md python block {i} failed:\n{block}\n{proc.stderr[-2000:]}"


def test_passkey_table_covers_factors_below_the_key_length():
    """--passkey-eval-factors 0.5 with L = 6: the evaluation raises length 3 to the minimum, 6
    (a key needs 6 tokens), so a learned table needs 6 + QUERY SEP + 5 key digits = 13 rows
    (it had round(0.5 * 6) + 7 = 10, and the run failed after training)."""
    s = settings_for("micro", encodings=["learned"], tasks=["passkey"], passkey_length=6, passkey_eval_factors=(0.5,))
    assert s.max_positions("passkey") == 13
    assert build_model(s, "learned", "passkey", 0).encodings[0].config.max_len == 13


def test_every_scaling_a_default_grid_runs_is_accepted(tmp_path):
    """The --scalings choices come from the registry: every scaling the synthetic bench's and
    bench --model's default settings run parses (llama3 was refused though bench --model runs it)."""
    from posenc.hf.bench_settings import ModelBenchSettings

    def default(cls, name):
        return next(f.default for f in dataclasses.fields(cls) if f.name == name)

    runs = set(default(BenchSettings, "scalings")) | set(default(ModelBenchSettings, "scalings"))
    runs |= {s for p in PRESETS.values() for s in p.get("scalings", ())}
    assert {"linear", "yarn", "llama3"} <= runs
    parser = build_parser([])
    for name in sorted(runs):
        args = parser.parse_args(["bench", "--model", "m", "--scalings", name, "--out", str(tmp_path / "o")])
        assert args.set_scalings == [name]


def test_lm_factors_whole_stay_ints_fractions_need_a_model(tmp_path, capsys):
    """1.5 parses (bench --model rounds 1.5 L to whole tokens); 2 and 2.0 stay the int 2, so the
    settings and results of whole factors are written as before ([1, 4], not [1.0, 4.0])."""
    parser = build_parser([])
    args = parser.parse_args(["bench", "--lm-eval-factors", "1", "2.0", "1.5", "--out", str(tmp_path / "o")])
    assert args.set_lm_eval_factors == [1, 2, 1.5] and [type(f) for f in args.set_lm_eval_factors] == [int, int, float]
    whole = settings_for("micro", **_overrides(parser.parse_args(["bench", "--lm-eval-factors", "1", "4",
                                                                   "--out", str(tmp_path / "o")])))
    assert json.dumps(whole.to_json()["lm_eval_factors"]) == "[1, 4]"
    assert main(["bench", "--preset", "micro", "--lm-eval-factors", "1.5", "--out", str(tmp_path / "o")]) == 2
    assert ("--lm-eval-factors 1.5: the synthetic bench's lm lengths are whole multiples of L (bytes); a fraction of L "
            "applies with --model") in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert main(["bench", "--preset", "micro", "--scalings", "llama3", "--out", str(tmp_path / "o")]) == 2
    assert "--scalings llama3: the synthetic bench evaluates linear, ntk, dynamic, yarn" in capsys.readouterr().err


def test_model_methods_and_dtype_reach_the_model_settings(tmp_path, capsys, monkeypatch):
    """bench --model --methods NAME... becomes the settings' methods override (nothing given: no
    method rows); --dtype bfloat16 is --bf16; each refused where it cannot apply."""
    import posenc.hf.bench_settings as bench_settings

    seen = []

    def recording(preset, model, **kw):
        seen.append((kw["overrides"].get("methods"), kw["bf16"]))
        raise ValueError("stopped after the settings")

    monkeypatch.setattr(bench_settings, "model_settings", recording)
    out = ["--out", str(tmp_path / "o")]
    for argv, want in [(["--methods", "rerope", "dual_chunk"], (("rerope", "dual_chunk"), False)),
                       (["--methods"], ((), False)), ([], (None, False)), (["--dtype", "bfloat16"], (None, True)),
                       (["--bf16"], (None, True)), (["--dtype", "float32"], (None, False))]:
        assert main(["bench", "--model", "m", *argv, *out]) == 2
        assert seen.pop() == want, argv
    capsys.readouterr()
    assert main(["bench", "--model", "m", "--bf16", "--dtype", "float32", *out]) == 2
    assert "--bf16 and --dtype float32 contradict each other: give one" in capsys.readouterr().err
    assert main(["bench", "--methods", "rerope", *out]) == 2
    assert "--methods applies to --model only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser([]).parse_args(["bench", "--model", "m", "--methods", "self-extend", *out])
    assert "argument --methods: must be one of self_extend, rerope, dual_chunk" in capsys.readouterr().err
    assert not seen
