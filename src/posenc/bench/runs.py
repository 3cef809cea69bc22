"""The benchmark's runs in its output folder: where each one lives, and the checks that keep
earlier runs sound before any training starts.

The folder's layout and the generic ``--resume`` checks are :mod:`posenc.results`'; this
module names a run's folder after its encoding variant and checks every run of a
:class:`~posenc.bench.settings.BenchSettings`.

A run with a ``result.json`` is done and skipped on ``--resume`` (after verifying its
``model.safetensors``); one with a checkpoint continues from it; one whose evaluation was
interrupted is evaluated again from its final checkpoint. Every run records its own settings
in ``run.json``, so ``--resume`` refuses a run trained with other settings even when
``bench.json`` is gone or was replaced (the error names the settings that differ; nothing is
deleted, ``--overwrite`` starts over).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..results import RunFolder, RunLayout, check_run_dir
from .entries import parse_entry
from .settings import BenchSettings, run_settings
from .train import verify_weights

__all__ = ["check_runs", "run_folder"]


def run_folder(out: Path, task: str, encoding: str, seed: int) -> RunFolder:
    """``OUT/runs/TASK/ENCODING/seedK``: the folder of one (task, encoding, seed), named by the
    encoding entry's folder name (its label, :mod:`posenc.bench.entries`)."""
    return RunLayout(Path(out)).run(task, parse_entry(encoding).dirname, seed)


def check_runs(out: Path, s: BenchSettings, *, trusted: bool) -> None:
    """Every run folder of ``s``: settings recorded or checked (:func:`posenc.results.check_run_dir`),
    and a finished run's ``model.safetensors`` verified, so ``--resume`` reuses only sound runs."""
    for task in s.tasks:
        for encoding in s.encodings:
            for seed in range(s.seeds):
                run = run_folder(out, task, encoding, seed)
                run.path.mkdir(parents=True, exist_ok=True)
                check_run_dir(run.path, run_settings(s, task, encoding, seed), trust_unrecorded=trusted)
                if run.result.exists():
                    verify_weights(run.model)
                    try:
                        json.loads(run.result.read_text())
                    except ValueError:
                        raise ValueError(f"--resume: {run.result} is not valid JSON; delete it to evaluate that run "
                                         "again") from None
