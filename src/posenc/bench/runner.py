"""Run the benchmark: every (task, encoding, seed) trained, evaluated, and collected.

The pieces live apart: :mod:`.settings` (what determines the numbers, the presets),
:mod:`.runs` (the output folder and its checks), :mod:`.build` (one run's model, batches and
optimisation), :mod:`.train`, :mod:`.evaluate` and :mod:`.report`; this module runs them in
order under the output folder's lock. Under torchrun every rank trains; rank 0 evaluates and
writes.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ..files import OutDirLock, write_json
from ..results import RunFolder, RunLayout, RunRecord, ResultsFile, check_out_dir, read_run, run_record, write_run
from .build import build_batches, build_model, evaluation_model, train_config
from .data import ByteCorpus, load_corpus
from .runs import check_runs, run_folder
from .settings import BenchSettings
from .tasks import get_task
from .train import distributed_info, init_distributed, save_weights, train

__all__ = ["run_bench", "run_one"]


def run_one(
    s: BenchSettings, task: str, encoding: str, seed: int, run: RunFolder, corpus: ByteCorpus | None,
    device: torch.device, progress: bool,
) -> RunRecord | None:
    """Train and evaluate one model; returns its record (rank 0) or None (other ranks).

    A finished run (``result.json``) is returned as recorded
    (:func:`~posenc.bench.runs.check_runs` verified its ``model.safetensors`` first).
    """
    if run.result.exists():
        return read_run(run.result)
    rank, world = distributed_info()
    model = build_model(s, encoding, task, seed).to(device)
    result = train(model, build_batches(s, task, seed, corpus, encoding), train_config(s, seed),
                   checkpoint=run.checkpoint, progress=progress, desc=f"{task}/{encoding}/seed{seed}")
    record = None
    if rank == 0:
        save_weights(model, run.model)
        t = get_task(task)
        points = t.evaluate(*evaluation_model(s, model, task, encoding), corpus)
        record = run_record(
            task=task, encoding=encoding, seed=seed, train_length=t.train_length(s), metric=t.metric,
            train_loss=result.last_loss, train_seconds=result.seconds,
            parameters=model.num_parameters(), points=points,
        )
        write_run(run.result, record)  # NaN/inf -> null: strict JSON
        run.checkpoint.unlink(missing_ok=True)  # only now: the result is safe, and this checkpoint verified
    if world > 1:
        dist.barrier()
    return record


def run_bench(
    s: BenchSettings, out: str | Path, *, resume: bool = False, overwrite: bool = False,
    progress: bool = True, device: str | None = None,
) -> ResultsFile | None:
    """Run every (task, encoding, seed) of ``s`` into ``out``; returns the collected results
    (on rank 0; None on other ranks) after writing results.json, results.csv and plots.

    ``out`` is locked for the whole call (a second writer gets a ValueError naming its pid).
    """
    out = Path(out)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    joined = dist.is_available() and dist.is_initialized()
    rank, world = init_distributed(dev)
    owns_group = world > 1 and not joined
    if dev.type == "cuda" and world > 1:
        dev = torch.device("cuda", torch.cuda.current_device())
    for name in ("batch_size", "lm_batch_size"):
        if getattr(s, name) % world:
            raise ValueError(f"{name} ({getattr(s, name)}) must be divisible by the number of processes ({world})")
    with contextlib.ExitStack() as held:
        error = None
        if rank == 0:  # one rank locks and checks (and, with --overwrite, deletes); all ranks learn the outcome
            try:
                held.enter_context(OutDirLock(out))  # released on return, or by the kernel on any exit
                trusted = check_out_dir(out, s, resume=resume, overwrite=overwrite)
                check_runs(out, s, trusted=trusted)  # before any training: fail fast, and on all ranks
            except ValueError as e:
                error = str(e)
        if world > 1:
            box = [error]
            dist.broadcast_object_list(box)
            error = box[0]
        if error is not None:
            raise ValueError(error)
        results = _run_locked(s, out, dev, rank, progress)
    if world > 1:
        dist.barrier()  # rank 0 writes the outputs; no rank leaves the group before it is done
    if owns_group:
        dist.destroy_process_group()  # a rank exiting with the group alive can abort in gloo's threads
    return results


def _run_locked(s: BenchSettings, out: Path, dev: torch.device, rank: int, progress: bool) -> ResultsFile | None:
    from .report import write_outputs
    from .summary import collect

    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        write_json(RunLayout(out).settings, s.to_json(), indent=2)
    corpus = load_corpus(s.data, max_bytes=s.lm_train_bytes) if any(get_task(t).uses_corpus for t in s.tasks) else None
    if corpus is not None and rank == 0:
        print(f"posenc bench: corpus {corpus.describe()}", file=sys.stderr)
    records = []
    for task in s.tasks:
        for encoding in s.encodings:
            for seed in range(s.seeds):
                run = run_folder(out, task, encoding, seed)
                run.path.mkdir(parents=True, exist_ok=True)
                records.append(run_one(s, task, encoding, seed, run, corpus, dev, progress))
    if rank != 0:
        return None
    results = collect(s, records)
    if corpus is not None:
        results["corpus"] = corpus.record()  # so a comparison tells a data difference from a disagreement
    write_outputs(results, out)
    return results
