"""Benchmark results as data: per-run scores, the summary over seeds, the ranking, and
results.json's content (:mod:`posenc.results` reads and writes the file).
:mod:`posenc.bench.report` renders them (tables, figures, files).

Summary per (task, encoding, variant), mean ± std over seeds of a per-seed number:

* synthetic tasks and passkey: accuracy averaged over lengths ``<= L`` ("in") and over
  lengths ``> L`` ("beyond"); passkey averages over depths first;
* ``lm``: perplexity at ``L`` ("in") and at the longest evaluation length ("beyond").

Mean reciprocal rank (after Kazemnejad et al. 2023, Fig. 3): in each (task, seed) cell the
unscaled encodings are ranked by their "beyond" score (accuracy: higher is better;
perplexity: lower is better); an encoding's MRR is the mean of 1/rank over the cells (with
one seed, over tasks). Its interval and the significance of each pairwise difference come
from a paired bootstrap over the cells (:mod:`posenc.bench.stats`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from ..results import RESULTS_FORMAT, Cell, ResultsFile, RunRecord
from .stats import DEFAULT_BOOTSTRAP_SEED, DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, bootstrap_mrr, mean_std, reciprocal_ranks

__all__ = ["collect", "mean_reciprocal_rank", "per_length", "ranking", "run_scores", "summarise"]


def per_length(points: list[dict], variant: str) -> dict[int, float]:
    """length -> value for one variant (averaging over passkey depths)."""
    by: dict[int, list[float]] = defaultdict(list)
    for p in points:
        if p["variant"] == variant:
            by[p["length"]].append(p["value"])
    return {n: statistics.fmean(v) for n, v in sorted(by.items())}


def run_scores(record: RunRecord) -> dict[str, tuple[float, float]]:
    """variant -> (inside, beyond) of one run: the per-seed numbers the summary averages."""
    L = record["train_length"]
    scores = {}
    for variant in dict.fromkeys(p["variant"] for p in record["points"]):
        curve = per_length(record["points"], variant)
        if record["metric"] == "ppl":
            inside = curve.get(L, math.nan)
            beyond = curve[max(curve)] if max(curve) > L else math.nan
        else:
            ins = [v for n, v in curve.items() if n <= L]
            out = [v for n, v in curve.items() if n > L]
            inside = statistics.fmean(ins) if ins else math.nan
            beyond = statistics.fmean(out) if out else math.nan
        scores[variant] = (inside, beyond)
    return scores


def summarise(records: list[RunRecord]) -> list[Cell]:
    """One row per (task, encoding, variant): in/beyond mean and std over seeds, and the
    per-seed values (``seed_ids``, ``in_seeds``, ``beyond_seeds``, in seed order) that the
    ranking pairs by seed."""
    groups: dict[tuple[str, str, str], list[tuple[int, float, float]]] = defaultdict(list)
    for r in records:
        for variant, (inside, beyond) in run_scores(r).items():
            groups[(r["task"], r["encoding"], variant)].append((r["seed"], inside, beyond))
    rows = []
    metric = {r["task"]: r["metric"] for r in records}
    for (task, enc, variant), vals in groups.items():
        vals.sort(key=lambda v: v[0])
        im, isd = mean_std([v[1] for v in vals])
        bm, bsd = mean_std([v[2] for v in vals])
        rows.append(dict(task=task, encoding=enc, variant=variant, metric=metric[task], seeds=len(vals),
                         in_mean=im, in_std=isd, beyond_mean=bm, beyond_std=bsd,
                         seed_ids=[v[0] for v in vals], in_seeds=[v[1] for v in vals],
                         beyond_seeds=[v[2] for v in vals]))
    return rows


def _cells(summary: list[dict]) -> dict[tuple[str, Any], dict[str, float]]:
    """(task, seed) -> encoding -> beyond-L score of that seed's unscaled run.

    A summary row without per-seed values (an older results file) is one cell per task.
    """
    cells: dict[tuple[str, Any], dict[str, float]] = defaultdict(dict)
    for row in summary:
        if row["variant"] != "base":
            continue
        seeds = row.get("seed_ids")
        values = row.get("beyond_seeds")
        if not seeds or values is None:
            seeds, values = ["mean"], [row["beyond_mean"]]
        for seed, v in zip(seeds, values):
            cells[(row["task"], seed)][row["encoding"]] = v
    return cells


def _reciprocal_ranks(summary: list[dict]) -> dict[str, list[float]]:
    """encoding -> reciprocal rank in each (task, seed) cell (NaN where it has no run)."""
    metric = {r["task"]: r["metric"] for r in summary}
    cells = _cells(summary)
    encodings = list(dict.fromkeys(r["encoding"] for r in summary if r["variant"] == "base"))
    rr: dict[str, list[float]] = {e: [] for e in encodings}
    for (task, _), scores in cells.items():
        ranks = reciprocal_ranks(scores, lower_is_better=metric[task] == "ppl")
        for e in encodings:
            rr[e].append(ranks.get(e, math.nan))
    return rr


def mean_reciprocal_rank(summary: list[dict]) -> dict[str, float]:
    """Encoding -> mean of 1 / rank by the "beyond" metric over (task, seed) cells, best first
    (ties share the best rank; :mod:`posenc.bench.stats`). With one seed: the mean over tasks."""
    rr = _reciprocal_ranks(summary)
    mrr = {e: statistics.fmean([x for x in v if not math.isnan(x)]) for e, v in rr.items()
           if any(not math.isnan(x) for x in v)}
    return dict(sorted(mrr.items(), key=lambda kv: -kv[1]))


def ranking(summary: list[dict], *, resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
            seed: int = DEFAULT_BOOTSTRAP_SEED) -> dict:
    """The MRR of each encoding with its bootstrap interval, and every pairwise difference
    (:func:`posenc.bench.stats.bootstrap_mrr`; resampled: the (task, seed) cells).

    Only encodings ranked in every cell are bootstrapped (the design is paired); the others
    are listed under ``"incomplete"``.
    """
    rr = _reciprocal_ranks(summary)
    complete = {e: v for e, v in rr.items() if v and not any(math.isnan(x) for x in v)}
    n_cells = len(next(iter(rr.values()), []))
    method = dict(resamples=resamples, confidence=confidence, seed=seed, cells=n_cells,
                  tasks=len({t for t, _ in _cells(summary)}), unit="(task, seed) cell")
    if not complete:
        return dict(method=method, intervals=[], pairs=[], incomplete=sorted(rr))
    intervals, pairs = bootstrap_mrr(complete, resamples=resamples, confidence=confidence, seed=seed)
    return dict(method=method, intervals=[i.to_json() for i in intervals], pairs=[p.to_json() for p in pairs],
                incomplete=sorted(set(rr) - set(complete)))


def collect(settings: Any, records: list[RunRecord]) -> ResultsFile:
    """The content of results.json (``settings``: an object with ``to_json()``, or a dict)."""
    summary = summarise(records)
    return dict(
        format=RESULTS_FORMAT,
        settings=settings.to_json() if hasattr(settings, "to_json") else settings,
        runs=records,
        summary=summary,
        mrr=mean_reciprocal_rank(summary),
        ranking=ranking(summary),
    )
