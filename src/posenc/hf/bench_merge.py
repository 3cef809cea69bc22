"""Shards of one ``bench --model`` measurement pooled into one result: :func:`merge_shards`.

A needle task's accuracy at (row, length, depth) is a count of exact matches out of the prompts
asked. Prompts are drawn from ``example_rng("eval", task, eval_seed, length, depth)``, so runs
with different ``--eval-seed`` ask disjoint samples of prompts of the same distribution: two
processes (one per core) or two machines can measure halves, and their counts add. The pooled
point is the matches over the prompts of every shard, with the Wilson interval of the pool
(:func:`posenc.intervals.wilson`), exactly what one run asking all those prompts would report.

Only counted points pool: accuracies (``metric == "accuracy"``) with their ``count``. A
perplexity is a mean over one window's tokens; shards of different windows are not one
window's interval, so they are refused rather than averaged.
"""

from __future__ import annotations

import copy
from typing import Any

from ..intervals import wilson
from ..results import Point, ResultsFile, RunRecord, run_record

__all__ = ["merge_shards"]

#: the settings that may differ between shards of one measurement
SHARD_FIELDS = ("eval_seed",)


def _key(p: Point) -> tuple[str, int, float | None]:
    return p["variant"], p["length"], p["depth"]


def _pool(task: str, runs: list[RunRecord]) -> list[Point]:
    matched: dict[tuple, list[Point]] = {}
    for run in runs:
        if run["metric"] != "accuracy":
            raise ValueError(f"task {task!r}: metric {run['metric']!r} cannot be pooled over shards (only counted "
                             "accuracies add up); measure it in one run")
        for p in run["points"]:
            if not isinstance(p.get("count"), int) or p["count"] < 1:
                raise ValueError(f"task {task!r}: a point at {_key(p)} has no prompt count to pool")
            matched.setdefault(_key(p), []).append(p)
    out = []
    for key, points in matched.items():
        if len(points) != len(runs):
            raise ValueError(f"task {task!r}: the point {key} is in {len(points)} of {len(runs)} shards; "
                             "every shard must measure the same rows, lengths and depths")
        trials = sum(p["count"] for p in points)
        hits = sum(round(p["value"] * p["count"]) for p in points)
        low, high = wilson(hits, trials)
        out.append(Point(variant=key[0], length=key[1], depth=key[2], value=hits / trials, low=low, high=high,
                         count=trials))
    return out


def merge_shards(shards: list[ResultsFile]) -> tuple[dict[str, Any], list[RunRecord]]:
    """``(settings, runs)`` of the pooled measurement of ``shards`` (results.json contents of
    ``bench --model`` runs whose settings differ only in ``eval_seed``). The settings are the
    first shard's with ``passkey_examples`` the prompts per point of the pool and ``shards``
    listing each shard's eval seed; pass both to :func:`posenc.bench.summary.collect`."""
    if len(shards) < 2:
        raise ValueError(f"merge_shards needs at least two shards, got {len(shards)}")
    first = shards[0]["settings"]
    for i, s in enumerate(shards[1:], 1):
        differ = sorted(k for k in set(first) | set(s["settings"])
                        if k not in SHARD_FIELDS and first.get(k) != s["settings"].get(k))
        if differ:
            raise ValueError(f"shard {i} differs from shard 0 in {', '.join(differ)}: only "
                             f"{', '.join(SHARD_FIELDS)} may differ between shards of one measurement")
    seeds = [s["settings"]["eval_seed"] for s in shards]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"shards must have distinct eval seeds (disjoint prompts), got {seeds}")
    by_task: dict[str, list[RunRecord]] = {}
    for s in shards:
        for run in s["runs"]:
            by_task.setdefault(run["task"], []).append(run)
    runs = []
    for task, task_runs in by_task.items():
        if len(task_runs) != len(shards):
            raise ValueError(f"task {task!r} is in {len(task_runs)} of {len(shards)} shards")
        r0 = task_runs[0]
        runs.append(run_record(task=task, encoding=r0["encoding"], seed=0, train_length=r0["train_length"],
                               metric=r0["metric"], points=_pool(task, task_runs), train_loss=None,
                               train_seconds=0.0, parameters=r0["parameters"]))
    settings = copy.deepcopy(first)
    settings["passkey_examples"] = first["passkey_examples"] * len(shards)
    settings["shards"] = [{"eval_seed": seed, "passkey_examples": first["passkey_examples"]} for seed in seeds]
    return settings, runs
