"""bench/compare.py: a fresh table against a committed one, within the seeds' spread."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from posenc.bench.compare import RATIO_LIMIT, compare_files, compare_results
from posenc.results import read_results

COMMITTED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "bench_quick.json"


@pytest.fixture(scope="module")
def committed() -> dict:
    return read_results(COMMITTED)


def test_a_table_against_itself_is_bitwise_and_agrees(committed):
    c = compare_results(committed, copy.deepcopy(committed))
    assert c.runs == len(committed["runs"]) > 0 and c.runs_bitwise == c.runs
    assert c.ratio == 0.0 and c.agrees
    valued = [x for x in c.cells if x.z is not None]
    assert valued and all(x.z == 0.0 for x in valued)


def test_the_pooled_ratio_by_hand(committed):
    """Two cells moved: the ratio is sum(d²) / sum(se²) over every cell with a value, se the
    standard error of a difference of two 3-seed means (log ppl for ppl cells)."""
    fresh = copy.deepcopy(committed)
    rows = [r for r in fresh["summary"] if r["variant"] == "base" and r["metric"] == "accuracy" and r["in_std"] > 0]
    assert len(rows) >= 2
    rows[0]["in_seeds"] = [v + 0.01 for v in rows[0]["in_seeds"]]  # every seed + 0.01: the same spread
    rows[1]["beyond_seeds"] = [v - 0.02 for v in rows[1]["beyond_seeds"]]
    c = compare_results(fresh, committed)
    den = 0.0
    for r in committed["summary"]:
        for key in ("in_seeds", "beyond_seeds"):
            vals = r[key]
            if any(math.isnan(v) for v in vals):  # read back as NaN: a diverged seed, or no point there
                continue
            vals = [math.log(v) for v in vals] if r["metric"] == "ppl" else vals
            m = sum(vals) / len(vals)
            var = sum((v - m) ** 2 for v in vals) / (len(vals) - 1)
            den += 2 * var / len(vals)  # both tables have the same spread here
    assert c.ratio == pytest.approx((0.01**2 + 0.02**2) / den, rel=1e-9)
    moved = {x.label: x.z for x in c.cells if x.z not in (None, 0.0)}
    assert len(moved) == 2


def test_training_time_is_summed_over_the_shared_runs_and_printed_as_a_ratio(committed):
    from posenc.bench.compare import format_comparison

    fresh = copy.deepcopy(committed)
    for r in fresh["runs"]:
        r["train_seconds"] *= 4  # the same runs, four times slower
    dropped = fresh["runs"].pop()  # a run only one file holds is not counted
    c = compare_results(fresh, committed)
    want_committed = sum(r["train_seconds"] for r in committed["runs"]) - next(
        r["train_seconds"] for r in committed["runs"]
        if (r["task"], r["encoding"], r["seed"]) == (dropped["task"], dropped["encoding"], dropped["seed"]))
    assert c.train_seconds[1] == pytest.approx(want_committed, rel=1e-12)
    assert c.train_seconds[0] == pytest.approx(4 * want_committed, rel=1e-12)
    assert "(4.00x;" in format_comparison(c)
    del fresh["runs"][0]["train_seconds"]  # an older file without times: no line, no error
    c = compare_results(fresh, committed)
    assert c.train_seconds is None and "training took" not in format_comparison(c)


def test_one_cell_far_off_disagrees(committed):
    fresh = copy.deepcopy(committed)
    row = next(r for r in fresh["summary"] if r["task"] == "copy" and r["encoding"] == "alibi")
    row["in_seeds"] = [v - 0.5 for v in row["in_seeds"]]  # ALiBi copies half as well within L
    c = compare_results(fresh, committed)
    assert c.ratio > RATIO_LIMIT and not c.agrees


def test_tables_of_other_settings_are_not_compared(committed, tmp_path):
    fresh = copy.deepcopy(committed)
    fresh["settings"]["steps"] = 400
    with pytest.raises(ValueError, match=r"^the tables were made with other settings \(fresh, committed\): \{'steps': \(400, 500\)\}$"):
        compare_results(fresh, committed)
    (tmp_path / "results.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(ValueError, match=r"is not posenc bench results \(format 'x'\)$"):
        compare_files(tmp_path, COMMITTED)
    (tmp_path / "results.json").write_text(json.dumps({"format": committed["format"], "runs": []}))
    with pytest.raises(ValueError, match=r"is not posenc bench results \(it needs settings, summary and runs\)$"):
        compare_files(tmp_path, COMMITTED)
    with pytest.raises(FileNotFoundError, match=r"^no benchmark results at"):
        compare_files(tmp_path / "missing.json", COMMITTED)


def _corpus(source: str, text: bytes, train: int) -> dict:
    import hashlib

    return dict(source=source, sha256=hashlib.sha256(text).hexdigest(), train_bytes=train, val_bytes=len(text) - train)


def test_a_different_corpus_is_named_and_its_cells_are_listed_not_judged(committed):
    """The lm cells of a table made on other text move by many standard errors (the real
    failure: another Python's standard library); the comparison names both corpora and judges
    only the tasks that do not read it, so a data difference is not called a disagreement."""
    from posenc.bench.compare import format_comparison

    fresh = copy.deepcopy(committed)
    for r in fresh["summary"]:
        if r["task"] == "lm":
            r["in_seeds"] = [v * 1.5 for v in r["in_seeds"]]  # perplexity 50% higher on the other text
    assert not compare_results(fresh, committed).agrees  # without corpus records: a disagreement
    fresh["corpus"] = _corpus("Python 3.12.1 standard library (/usr/lib/python3.12)", b"other text", 6)
    ours = copy.deepcopy(committed)
    ours["corpus"] = _corpus("Python 3.11.7 standard library (pinned)", b"our text", 4)
    c = compare_results(fresh, ours)
    assert c.unjudged == ("lm",) and c.agrees and c.ratio == 0.0
    text = format_comparison(c)
    assert text.splitlines()[0] == (
        f"different corpus: Python 3.12.1 standard library (/usr/lib/python3.12) (sha256 {fresh['corpus']['sha256'][:12]}"
        f"..., 6 + 4 bytes) (committed table: Python 3.11.7 standard library (pinned) (sha256 "
        f"{ours['corpus']['sha256'][:12]}..., 4 + 4 bytes))")
    n_lm = sum(1 for x in c.cells if x.task == "lm")
    assert n_lm > 0 and f"the {n_lm} cells of lm read that corpus: listed, not judged" in text
    assert "(not judged)" in text and "agrees" in text
    # a cell of a task that reads no corpus is still judged
    fresh["summary"][next(i for i, r in enumerate(fresh["summary"]) if r["task"] == "copy")]["in_seeds"] = [0.0] * 3
    assert not compare_results(fresh, ours).agrees


def test_the_same_corpus_is_judged_and_a_missing_record_cannot_tell(committed):
    from posenc.bench.compare import format_comparison

    fresh = copy.deepcopy(committed)
    fresh["corpus"] = _corpus("here", b"the same bytes", 9)
    same = copy.deepcopy(committed)
    same["corpus"] = _corpus("there", b"the same bytes", 9)
    c = compare_results(fresh, same)
    assert c.unjudged == () and c.corpus.startswith("corpus: the same, here (sha256 ")
    # the committed file written before posenc recorded its corpus: compared as before, and said so
    c = compare_results(fresh, committed)
    assert c.unjudged == () and c.agrees
    assert format_comparison(c).splitlines()[0] == (
        "corpus: cannot tell whether both read the same text (the committed table records none of its corpus); "
        "every cell is judged")
    moved = copy.deepcopy(fresh)
    for r in moved["summary"]:
        if r["task"] == "lm":
            r["in_seeds"] = [v * 1.5 for v in r["in_seeds"]]
    assert not compare_results(moved, committed).agrees  # every cell judged: the lm cells count
