"""benchmarks/bench_split.py: one bench preset as one-thread processes over shares of the tasks,
collected into one folder (the standard rerun of issue 30)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def split_mod():
    spec = importlib.util.spec_from_file_location("bench_split_under_test", ROOT / "benchmarks" / "bench_split.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_groups_balance_the_cost_and_keep_the_task_order(split_mod):
    costs = {"copy": 3.0, "lm": 5.0, "sort": 2.0, "parity": 2.0, "passkey": 4.0}
    groups = split_mod.split(costs, 2)
    assert sorted(t for g in groups for t in g) == sorted(costs)  # every task once
    # longest first, each to the lighter group: lm | passkey, copy | sort | parity (ties: the first)
    assert groups == [["lm", "sort", "parity"], ["copy", "passkey"]]
    loads = [sum(costs[t] for t in g) for g in groups]
    assert max(loads) - min(loads) <= max(costs.values())  # LPT's bound
    assert split_mod.split({"copy": 1.0}, 3) == [["copy"]]  # no empty group


def test_task_costs_read_a_results_file_and_fill_the_unknown(split_mod, tmp_path):
    runs = [dict(task="copy", train_seconds=2.0), dict(task="copy", train_seconds=4.0), dict(task="lm", train_seconds=9.0)]
    (tmp_path / "r.json").write_text(json.dumps({"runs": runs}))
    assert split_mod.task_costs(["copy", "lm", "count"], tmp_path / "r.json") == {"copy": 3.0, "lm": 9.0, "count": 6.0}
    assert split_mod.task_costs(["copy"], tmp_path / "missing.json") == {"copy": 1.0}


def test_flags_the_script_sets_are_refused(split_mod, tmp_path, capsys):
    with pytest.raises(SystemExit):
        split_mod.main(["--preset", "micro", "--out", str(tmp_path / "o"), "--", "--tasks", "copy"])
    assert "set by this script" in capsys.readouterr().err


def test_a_micro_run_in_two_processes_is_collected_and_resumes(split_mod, tmp_path):
    out = tmp_path / "bench"
    argv = ["--preset", "micro", "--out", str(out), "--processes", "2", "--tasks", "copy", "parity", "--",
            "--encodings", "none", "rope:randomized_positions=2"]
    assert split_mod.main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    assert {(r["task"], r["encoding"]) for r in data["runs"]} == {
        (t, e) for t in ("copy", "parity") for e in ("none", "rope@randomized_positions=2")}
    assert data["note"].startswith("Run as 2 1-thread processes, each over a share of the tasks (--tasks ")
    for k in (0, 1):
        assert (tmp_path / f"bench.part{k}" / "runs").resolve() == (out / "runs").resolve()
    losses = {(r["task"], r["encoding"]): r["train_loss"] for r in data["runs"]}
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("result.json")}
    assert split_mod.main(argv) == 0  # again: every run is found, nothing is trained or rewritten
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("result.json")} == mtimes
    again = json.loads((out / "results.json").read_text())
    assert {(r["task"], r["encoding"]): r["train_loss"] for r in again["runs"]} == losses
