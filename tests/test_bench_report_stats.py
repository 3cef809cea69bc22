"""Statistics of the benchmark over seeds: mean ± std, reciprocal ranks, bootstrap intervals.

Every number is checked against an explicit loop written here from the definitions
(posenc.bench.stats' docstring), or against values derived by hand in the comments.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from posenc.bench.report import format_table
from posenc.results import read_results
from posenc.bench.summary import collect, mean_reciprocal_rank, ranking, summarise
from posenc.bench.stats import bootstrap_indices, bootstrap_mrr, mean_std, reciprocal_ranks
from posenc.cli import main


def test_mean_std_by_hand():
    # 0.5, 0.7, 0.9: mean 0.7; deviations -0.2, 0, 0.2 -> sample variance 0.08 / 2 = 0.04 -> std 0.2
    m, s = mean_std([0.5, 0.7, 0.9])
    assert m == pytest.approx(0.7) and s == pytest.approx(0.2)
    assert mean_std([3.0]) == (3.0, 0.0)
    for bad in ([0.1, math.nan, 0.3], [math.nan], []):
        m, s = mean_std(bad)
        assert math.isnan(m) and math.isnan(s)


def test_reciprocal_ranks_ties_and_nan():
    # accuracy (higher is better): a 0.9 -> 1; b and c 0.5 tie -> both rank 2; d NaN -> last (4)
    rr = reciprocal_ranks({"a": 0.9, "b": 0.5, "c": 0.5, "d": math.nan}, lower_is_better=False)
    assert rr == {"a": 1.0, "b": 0.5, "c": 0.5, "d": 0.25}
    # perplexity (lower is better)
    assert reciprocal_ranks({"a": 9.0, "b": 3.0}, lower_is_better=True) == {"a": 0.5, "b": 1.0}


def _quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's and torch's default)."""
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def test_bootstrap_against_explicit_loop():
    rr = {"a": [1.0, 1.0, 0.5, 1.0, 1 / 3], "b": [0.5, 1 / 3, 1.0, 0.5, 1.0], "c": [1 / 3, 0.5, 1 / 3, 1 / 3, 0.5]}
    R, conf, seed = 300, 0.9, 7
    intervals, pairs = bootstrap_mrr(rr, resamples=R, confidence=conf, seed=seed)
    idx = bootstrap_indices(5, R, seed).tolist()
    assert len(idx) == R and all(len(row) == 5 for row in idx)
    reps = {e: [sum(v[i] for i in row) / 5 for row in idx] for e, v in rr.items()}
    lo_q, hi_q = (1 - conf) / 2, (1 + conf) / 2
    want = {e: (statistics.fmean(v), _quantile(reps[e], lo_q), _quantile(reps[e], hi_q)) for e, v in rr.items()}
    assert [i.encoding for i in intervals] == sorted(rr, key=lambda e: -want[e][0])  # best first
    assert intervals, "no intervals"
    for i in intervals:
        assert (i.mrr, i.low, i.high) == pytest.approx(want[i.encoding], abs=1e-12)
    assert len(pairs) == 3
    for p in pairs:
        diffs = [x - y for x, y in zip(reps[p.first], reps[p.second])]  # paired: the same cells
        assert p.diff == pytest.approx(want[p.first][0] - want[p.second][0], abs=1e-12)
        assert (p.low, p.high) == pytest.approx((_quantile(diffs, lo_q), _quantile(diffs, hi_q)), abs=1e-12)
        assert p.significant == (p.low > 0 or p.high < 0)
    # seeded: the same call gives the same intervals; another seed other ones
    assert bootstrap_mrr(rr, resamples=R, confidence=conf, seed=seed) == (intervals, pairs)
    assert bootstrap_mrr(rr, resamples=R, confidence=conf, seed=seed + 1)[0] != intervals


def test_bootstrap_golden_cases():
    # a wins every cell: every replicate gives a 1.0, b 0.5 -> intervals collapse, the difference is significant
    (ia, ib), (p,) = bootstrap_mrr({"a": [1.0] * 4, "b": [0.5] * 4}, resamples=50)
    assert (ia.encoding, ia.mrr, ia.low, ia.high) == ("a", 1.0, 1.0, 1.0)
    assert (ib.mrr, ib.low, ib.high) == (0.5, 0.5, 0.5)
    assert (p.first, p.second, p.diff, p.low, p.high, p.significant) == ("a", "b", 0.5, 0.5, 0.5, True)
    # they swap places cell by cell: the paired difference is +0.5 or -0.5 per cell, MRRs equal
    _, (p,) = bootstrap_mrr({"a": [1.0, 0.5] * 4, "b": [0.5, 1.0] * 4}, resamples=2000)
    assert p.diff == 0.0 and p.low < 0 < p.high and not p.significant


def _record(task: str, enc: str, seed: int, inside: list[float], beyond: list[float], metric: str = "accuracy",
            scaled: list[float] | None = None) -> dict:
    """A run with L = 2: lengths 1..2 inside, 3..4 beyond (one point per length)."""
    pts = [dict(variant="base", length=n + 1, depth=None, value=v) for n, v in enumerate(inside + beyond)]
    if scaled is not None:
        pts += [dict(variant="yarn", length=3 + n, depth=None, value=v) for n, v in enumerate(scaled)]
    return dict(task=task, encoding=enc, seed=seed, train_length=2, metric=metric, train_loss=0.1,
                train_seconds=1.0, parameters=10, points=pts)


# Two tasks, two seeds, two encodings; x has a YaRN variant (no value within L).
RECORDS = [
    _record("copy", "x", 0, [1.0, 0.8], [0.2, 0.0], scaled=[0.6, 0.4]),
    _record("copy", "x", 1, [0.9, 0.9], [0.5, 0.3], scaled=[0.2, 0.2]),
    _record("copy", "y", 0, [1.0, 1.0], [0.4, 0.2]),
    _record("copy", "y", 1, [0.7, 0.5], [0.1, 0.1]),
    _record("other", "x", 0, [0.5, 0.5], [0.5, 0.5]),
    _record("other", "x", 1, [0.5, 0.5], [0.0, 0.0]),
    _record("other", "y", 0, [0.5, 0.5], [0.1, 0.1]),
    _record("other", "y", 1, [0.5, 0.5], [0.9, 0.7]),
]


def test_summary_and_ranking_of_a_tiny_results_list():
    rows = summarise(RECORDS)
    assert rows, "no summary rows"
    by = {(r["task"], r["encoding"], r["variant"]): r for r in rows}
    # explicit loop: per seed the mean over lengths <= L (inside) and > L (beyond), then mean/std over seeds
    for (task, enc, variant), row in by.items():
        ins, outs = [], []
        for rec in RECORDS:
            if (rec["task"], rec["encoding"]) != (task, enc):
                continue
            pts = [p for p in rec["points"] if p["variant"] == variant]
            i = [p["value"] for p in pts if p["length"] <= 2]
            o = [p["value"] for p in pts if p["length"] > 2]
            ins.append(sum(i) / len(i) if i else math.nan)
            outs.append(sum(o) / len(o))
        assert row["seeds"] == 2 and row["beyond_seeds"] == pytest.approx(outs)
        assert row["beyond_mean"] == pytest.approx(statistics.fmean(outs))
        assert row["beyond_std"] == pytest.approx(statistics.stdev(outs))
        if variant == "base":
            assert row["in_mean"] == pytest.approx(statistics.fmean(ins))
            assert row["in_std"] == pytest.approx(statistics.stdev(ins))
        else:  # the scaling has no point within L
            assert math.isnan(row["in_mean"]) and math.isnan(row["in_std"])
    # beyond per cell: copy/0 x 0.1 y 0.3; copy/1 x 0.4 y 0.1; other/0 x 0.5 y 0.1; other/1 x 0.0 y 0.8
    # -> x ranks 2, 1, 1, 2 (MRR 0.75), y 1, 2, 2, 1 (MRR 0.75); the YaRN variant is not ranked
    assert mean_reciprocal_rank(rows) == pytest.approx({"x": 0.75, "y": 0.75})
    rank = ranking(rows, resamples=500)
    assert rank["method"]["cells"] == 4 and rank["method"]["tasks"] == 2
    (pair,) = rank["pairs"]
    assert pair["diff"] == 0.0 and not pair["significant"]
    # one seed: a row without per-seed values counts as one cell per task (the older files)
    old = [{k: v for k, v in r.items() if k not in ("seed_ids", "in_seeds", "beyond_seeds")} for r in rows]
    # means: copy x 0.25 y 0.2 -> x first; other x 0.25 y 0.45 -> y first
    assert mean_reciprocal_rank(old) == pytest.approx({"x": 0.75, "y": 0.75})


def test_table_has_settings_units_and_no_nan():
    results = collect({"seeds": 2, "d_model": 8, "n_layer": 1, "n_head": 2, "steps": 5, "batch_size": 4, "lr": 0.01},
                      RECORDS)
    text = format_table(results)
    assert "nan" not in text.lower()
    assert "Settings: 2 seeds; model d_model 8, 1 layers, 2 heads; 5 steps, batch 4, lr 0.01" in text
    assert "copy: accuracy % ≤L | >L" in text
    # x + YaRN on copy: within L "as x"; beyond L per seed 0.5 and 0.2 -> 35.0 ± 21.2
    assert "x + YaRN  as x | 35.0 ± 21.2" in text
    assert "x         90.0 ± 0.0 | 25.0 ± 21.2" in text  # copy inside (0.9, 0.9), beyond (0.1, 0.4)
    assert "Not significantly apart: x vs y" in text


def test_three_seeds_end_to_end(tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["bench", "--preset", "micro", "--encodings", "none", "alibi", "--tasks", "copy", "passkey",
                 "--seeds", "3", "--no-progress", "--threads", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "nan" not in printed.lower() and "Settings: 3 seeds" in printed and "MRR [95 % CI]" in printed
    res = read_results(out)
    assert len(res["runs"]) == 2 * 2 * 3
    rank = res["ranking"]
    assert rank["method"]["cells"] == 6 and rank["method"]["resamples"] == 10_000
    assert {i["encoding"] for i in rank["intervals"]} == {"none", "alibi"}
    for i in rank["intervals"]:
        assert 0 < i["low"] <= i["mrr"] <= i["high"] <= 1
    # the MRR recomputed from the runs by an explicit loop over (task, seed) cells
    rr = {"none": [], "alibi": []}
    for task in ("copy", "passkey"):
        for seed in range(3):
            beyond = {}
            for r in res["runs"]:
                if (r["task"], r["seed"]) == (task, seed):
                    vals = {}
                    for p in r["points"]:
                        if p["variant"] == "base" and p["length"] > r["train_length"]:
                            vals.setdefault(p["length"], []).append(p["value"])
                    beyond[r["encoding"]] = statistics.fmean(statistics.fmean(v) for v in vals.values())
            for e in rr:
                rr[e].append(1.0 if beyond[e] >= max(beyond.values()) else 0.5)
    assert res["mrr"] == pytest.approx({e: statistics.fmean(v) for e, v in rr.items()})
    row = next(r for r in res["summary"] if (r["task"], r["encoding"], r["variant"]) == ("copy", "alibi", "base"))
    assert row["seed_ids"] == [0, 1, 2]


def test_bootstrap_indices_are_in_range_and_seeded():
    a = bootstrap_indices(4, 100, 3)
    assert a.shape == (100, 4) and a.dtype == torch.int64 and int(a.min()) >= 0 and int(a.max()) <= 3
    assert torch.equal(a, bootstrap_indices(4, 100, 3))


def test_bootstrap_mean_of_paired_differences():
    """The mean and its percentile interval over resampled cells: constant cells give a zero-width
    interval; cells of both signs give one around 0; bad input is refused."""
    from posenc.bench.stats import bootstrap_mean

    assert bootstrap_mean([0.25] * 6) == (0.25, 0.25, 0.25)
    mean, low, high = bootstrap_mean([-0.05, 0.0, 0.1, -0.05, 0.0, 0.1])
    assert mean == pytest.approx(0.05 / 3) and low < 0 < high and -0.05 <= low and high <= 0.1
    assert bootstrap_mean([1.0, 2.0, 3.0]) == bootstrap_mean([1.0, 2.0, 3.0])  # seeded
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_mean([])
    with pytest.raises(ValueError, match="finite"):
        bootstrap_mean([1.0, float("nan")])
