"""The benchmark's output folder: its layout, and the checks that keep earlier runs sound.

Layout of an output folder::

    OUT/.lock                                   held (flock) by the process writing OUT
    OUT/bench.json                              the settings (checked on --resume)
    OUT/runs/TASK/ENCODING/seedK/run.json                 the settings this run was trained with
    OUT/runs/TASK/ENCODING/seedK/checkpoint.safetensors   while training
    OUT/runs/TASK/ENCODING/seedK/model.safetensors        final weights
    OUT/runs/TASK/ENCODING/seedK/result.json              its evaluation points
    OUT/results.json, OUT/results.csv, OUT/plots/*.png    the collected results

A run with a ``result.json`` is done and skipped on ``--resume`` (after verifying its
``model.safetensors``); one with a checkpoint continues from it; one whose evaluation was
interrupted is evaluated again from its final checkpoint. Every run records its own settings
in ``run.json``, so ``--resume`` refuses a run trained with other settings even when
``bench.json`` is gone or was replaced (the error names the settings that differ; nothing is
deleted, ``--overwrite`` starts over). Every JSON file is strict (NaN/inf written as null).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from ..variants import parse_variant
from ..files import write_json
from .settings import BenchSettings, run_settings
from .train import verify_weights

__all__ = ["check_out_dir", "check_run_dir", "check_runs", "run_dir", "settings_hash"]

_OWNED = ("bench.json", "runs", "results.json", "results.csv", "plots")
_RUN_FILES = ("result.json", "model.safetensors", "checkpoint.safetensors")


def run_dir(out: Path, task: str, encoding: str, seed: int) -> Path:
    """``OUT/runs/TASK/ENCODING/seedK``: the folder of one (task, encoding, seed)."""
    return out / "runs" / task / parse_variant(encoding).dirname / f"seed{seed}"


def check_out_dir(out: Path, settings: BenchSettings, *, resume: bool, overwrite: bool) -> bool:
    """Refuse to mix with an earlier run unless told to resume it or overwrite it.

    Returns True when an earlier ``bench.json`` exists and matches ``settings``: only then are
    runs without their own ``run.json`` (written before posenc recorded one) trusted.
    """
    if resume and overwrite:
        raise ValueError("pass --resume or --overwrite, not both")
    stored = out / "bench.json"
    earlier = stored.exists() or (out / "runs").exists()
    if earlier and not (resume or overwrite):
        raise ValueError(
            f"--out {out} holds an earlier benchmark run; pass --resume to continue it or --overwrite to replace it"
        )
    if earlier and overwrite:
        for name in _OWNED:  # only what the bench itself writes
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    elif earlier and resume and stored.exists():
        try:
            old = json.loads(stored.read_text())
        except ValueError:
            raise ValueError(f"--resume: {stored} is not valid JSON; use --overwrite to start over") from None
        old_cmp = {k: v for k, v in old.items() if k not in ("encodings", "tasks", "seeds")}
        new_cmp = settings.comparable()
        if old_cmp != new_cmp:
            diff = {k: (old_cmp.get(k), v) for k, v in new_cmp.items() if old_cmp.get(k) != v}
            raise ValueError(f"--resume: settings differ from the earlier run in {out} (earlier, now): {diff}")
        return True
    return False


def settings_hash(settings: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``settings``."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def check_run_dir(folder: Path, settings: dict[str, Any], *, trust_unrecorded: bool) -> None:
    """Make sure ``folder`` holds nothing trained with other settings, then record ours.

    A ``run.json`` with other settings is refused, naming them. A run with results but no
    ``run.json`` is trusted only when the earlier ``bench.json`` matched (``trust_unrecorded``).
    """
    record = folder / "run.json"
    if record.exists():
        try:
            old = json.loads(record.read_text())["settings"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"--resume: {record} is unreadable; use --overwrite to start over") from None
        if old != settings:
            diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
            diff.update({k: (v, None) for k, v in old.items() if k not in settings})
            raise ValueError(
                f"--resume: {folder} was trained with other settings (earlier, now): {diff}; "
                "use the earlier settings or --overwrite"
            )
        return
    found = [n for n in _RUN_FILES if (folder / n).exists()]
    if found and not trust_unrecorded:
        raise ValueError(
            f"--resume: {folder} holds {', '.join(found)} but no run.json recording its settings, and "
            "bench.json is missing, so they cannot be checked; use --overwrite to start over"
        )
    write_json(record, dict(settings=settings, hash=settings_hash(settings)), indent=1)


def check_runs(out: Path, s: BenchSettings, *, trusted: bool) -> None:
    """Every run folder of ``s``: settings recorded or checked (:func:`check_run_dir`), and
    a finished run's ``model.safetensors`` verified, so ``--resume`` reuses only sound runs."""
    for task in s.tasks:
        for encoding in s.encodings:
            for seed in range(s.seeds):
                folder = run_dir(out, task, encoding, seed)
                folder.mkdir(parents=True, exist_ok=True)
                check_run_dir(folder, run_settings(s, task, encoding, seed), trust_unrecorded=trusted)
                done = folder / "result.json"
                if done.exists():
                    verify_weights(folder / "model.safetensors")
                    try:
                        json.loads(done.read_text())
                    except ValueError:
                        raise ValueError(f"--resume: {done} is not valid JSON; delete it to evaluate that run again") from None
