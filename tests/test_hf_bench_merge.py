"""Shards of a bench --model measurement pooled: counts add, the interval is the pool's Wilson."""

from __future__ import annotations

import pytest

from posenc.hf.bench_merge import merge_shards
from posenc.intervals import wilson
from posenc.results import Point, run_record

SETTINGS = {"model": "m", "tasks": ["passkey"], "passkey_examples": 2, "eval_seed": 0, "passkey_depths": [0.25, 0.75]}


def shard(seed, values, metric="accuracy", count=2, settings=None):
    points = [Point(variant=v, length=16384, depth=d, value=x, low=0.0, high=1.0, count=count)
              for (v, d), x in values.items()]
    run = run_record(task="passkey", encoding="m", seed=0, train_length=8192, metric=metric, points=points,
                     train_loss=None, train_seconds=0.0, parameters=10)
    return {"settings": dict(settings or SETTINGS, eval_seed=seed), "runs": [run]}


def test_counts_add_and_the_interval_is_the_pools():
    a = shard(0, {("base", 0.25): 0.5, ("yarn", 0.25): 1.0})
    b = shard(1, {("base", 0.25): 0.0, ("yarn", 0.25): 0.5})
    settings, (run,) = merge_shards([a, b])
    got = {(p["variant"], p["depth"]): p for p in run["points"]}
    assert got[("base", 0.25)]["value"] == 0.25 and got[("base", 0.25)]["count"] == 4
    assert (got[("base", 0.25)]["low"], got[("base", 0.25)]["high"]) == wilson(1, 4)
    assert got[("yarn", 0.25)]["value"] == 0.75 and (got[("yarn", 0.25)]["low"], got[("yarn", 0.25)]["high"]) == wilson(3, 4)
    assert settings["passkey_examples"] == 4 and [s["eval_seed"] for s in settings["shards"]] == [0, 1]


@pytest.mark.parametrize("shards, message", [
    ([shard(0, {("base", 0.25): 1.0})], "at least two shards"),
    ([shard(0, {("base", 0.25): 1.0}), shard(0, {("base", 0.25): 1.0})], "distinct eval seeds"),
    ([shard(0, {("base", 0.25): 1.0}), shard(1, {("base", 0.25): 1.0}, settings=dict(SETTINGS, model="n"))],
     "differs from shard 0 in model"),
    ([shard(0, {("base", 0.25): 1.0}), shard(1, {("base", 0.75): 1.0})], "in 1 of 2 shards"),
    ([shard(0, {("base", 0.25): 5.0}, metric="ppl"), shard(1, {("base", 0.25): 5.0}, metric="ppl")],
     "cannot be pooled"),
])
def test_refused(shards, message):
    with pytest.raises(ValueError, match=message):
        merge_shards(shards)
