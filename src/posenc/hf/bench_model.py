"""``posenc bench --model MODEL``: a checkpoint's own length generalization, measured.

``MODEL`` is a save_pretrained folder, a ``.gguf`` file or a named model (``smollm2-135m``,
``gemma3-270m``; see :mod:`posenc.hf.models`). No training: the checkpoint is evaluated at and
beyond the length it was trained at, L = ``original_max_position_embeddings`` or
``max_position_embeddings`` (``--trained-length`` states a shorter L for a quick run), on each
task of :mod:`posenc.hf.tasks` (``passkey``: text passkey retrieval; ``lm``: token perplexity on
a local corpus) with the settings of :mod:`posenc.hf.bench_settings`.

Beyond L, the same model is also evaluated with each row of :mod:`posenc.hf.scalings` (every
training-free RoPE scaling of the registry at its own rule's parameters, and the raised base),
switched in place: no reload. Before starting, the run prints its estimated time and peak
memory (:mod:`posenc.hf.cost`).

The output folder has the synthetic bench's layout and files (``bench.json``,
``runs/TASK/MODEL/seed0/``, ``results.json``, ``results.csv``, ``plots/*.png``) and format,
so ``posenc report --bench`` reads it; the printed table is
:func:`posenc.hf.bench_table.format_model_table`. Resume: each (task, variant) is written to
``runs/TASK/MODEL/seed0/variants/VARIANT.json`` when it finishes and is not recomputed with
``--resume``; ``bench.json`` records the checkpoint's fingerprint (config and safetensors
headers), so a resume on a replaced checkpoint is refused.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..files import OutDirLock, write_json
from ..results import (Point, ResultsFile, RunLayout, check_out_dir, check_run_dir, read_points, read_run,
                       run_record, write_points, write_run)
from .bench_settings import ModelBenchSettings
from .checkpoint import fingerprint, load_model, load_tokenizer, open_checkpoint
from .cost import estimate_cost, forward_flops
from .evaluation import HFCausalLM, check_finite_weights, check_has_rope
from .scalings import variant_label, variant_patched
from .tasks import ModelTask, model_task

__all__ = ["run_model_bench"]


def _rows(s: ModelBenchSettings, variant: str, lengths: list[int]) -> list[int]:
    """The lengths a row is evaluated at: every one for the model itself, beyond L for a scaling."""
    return [n for n in lengths if variant == "base" or n > s.trained_length]


def _evaluate_variant(lm: HFCausalLM, s: ModelBenchSettings, task: ModelTask, variant: str, lengths: list[int],
                      bar: Any, clock: _Clock) -> list[Point]:
    L = s.trained_length
    points: list[Point] = []
    for n in _rows(s, variant, lengths):
        t0 = time.perf_counter()
        with variant_patched(lm.model, variant, n / L, L, s.raised_base):
            for depth, value, *extras in task.evaluate_at(lm, s, n):
                points.append(Point(variant=variant, length=n, depth=depth, value=value, **(extras[0] if extras else {})))
                bar.update()
        clock.finished(f"{task.name} {variant_label(s.to_json(), variant) if variant != 'base' else 'base'} at {n}",
                       task.cells(s, n), time.perf_counter() - t0, points[-len(task.eval_depths(s)):], bar)
    return points


class _Clock:
    """The per-cell log line of a long run: what finished, its value(s), how long it took and the
    time left, refined from the cells run so far (:class:`posenc.progress.Eta` over FLOPs)."""

    def __init__(self, cfg: dict[str, Any], cells: list[tuple[int, int, int]], prior_seconds: float | None):
        from ..progress import Eta

        self.cfg = cfg
        self.groups = 0
        self.eta = Eta(self._flops(cells), prior_seconds)

    def _flops(self, cells: list[tuple[int, int, int]]) -> float:
        return sum(b * forward_flops(self.cfg, n, k) for n, b, k in cells)

    def finished(self, what: str, cells: list[tuple[int, int, int]], seconds: float, points: list[Point],
                 bar: Any) -> None:
        from ..progress import format_minutes

        self.groups += 1
        self.eta.done(self._flops(cells), seconds)
        shown = ", ".join(f"{p['value']:.4g}" + (f" [{p['low']:.4g}, {p['high']:.4g}]" if "low" in p else "")
                          for p in points)
        line = (f"posenc bench: {what}: {shown}; {seconds:.0f} s; "
                f"ETA {format_minutes(self.eta.remaining_seconds())}")
        if bar.enabled:
            bar.write(line, file=sys.stderr)
        else:  # the log of a run without bars: one line per cell, flushed
            print(line, file=sys.stderr, flush=True)


def run_model_bench(s: ModelBenchSettings, out: str | Path, *, resume: bool = False, overwrite: bool = False,
                    progress: bool = True, device: str | None = None, model: nn.Module | None = None) -> ResultsFile:
    """Evaluate the checkpoint of ``s`` into ``out`` (module docstring); returns results.json's content.

    ``model``: the already loaded transformers model (tests); else loaded in ``s.dtype``.
    """
    from ..bench.report import write_outputs
    from ..bench.summary import collect
    from ..progress import bar as progress_bar

    out = Path(out)
    layout = RunLayout(out)
    ckpt = open_checkpoint(s.model)
    if fingerprint(ckpt) != s.fingerprint:
        raise ValueError(f"MODEL {s.model!r} changed since these settings were made (its config or weights' headers)")
    check_has_rope(ckpt.config, f"MODEL {s.model!r}")
    label = s.label or ckpt.name
    dev = device or "cpu"
    with OutDirLock(out):
        trusted = check_out_dir(out, s, resume=resume, overwrite=overwrite)
        out.mkdir(parents=True, exist_ok=True)
        write_json(layout.settings, s.to_json(), indent=2)
        tokenizer = load_tokenizer(ckpt)
        if model is None:
            model = load_model(ckpt, torch.bfloat16 if s.dtype == "bfloat16" else torch.float32, device=dev,
                               progress=progress)
        check_finite_weights(model, f"MODEL {s.model!r}")
        lm = HFCausalLM(model).eval()
        records, plans, cells = [], [], []
        for name in s.tasks:
            run = layout.run(name, label, 0)
            run.path.mkdir(parents=True, exist_ok=True)
            check_run_dir(run.path, dict(s.comparable(), task=name, encoding=label, seed=0), trust_unrecorded=trusted)
            if run.result.exists():
                records.append(read_run(run.result))
                continue
            task = model_task(name)(tokenizer)
            lengths = task.eval_lengths(s)
            task.prepare(s, lengths, dev)
            variants = ["base"] + (s.variants() if any(n > s.trained_length for n in lengths) else [])
            todo = [v for v in variants if not run.variant(v).exists()]
            cells += [c for v in todo for n in _rows(s, v, lengths) for c in task.cells(s, n)]
            plans.append((task, run, lengths, variants))
        seconds = None
        if cells:
            seconds, peak, rate = estimate_cost(lm, ckpt.config, cells)
            print(f"posenc bench: {label}: {len(cells)} forwards of up to {max(n for n, _, _ in cells)} tokens; "
                  f"estimated {seconds / 60:.1f} min at {rate / 1e9:.0f} GFLOP/s (measured here), "
                  f"peak memory about {peak / 2**30:.2f} GiB", file=sys.stderr, flush=True)
        clock = _Clock(ckpt.config, cells, seconds)
        for task, run, lengths, variants in plans:
            points: list[Point] = []
            per_len = len(task.eval_depths(s))
            bar = progress_bar(sum(per_len * len(_rows(s, v, lengths)) for v in variants), f"{task.name}/{label}",
                               enabled=progress)
            for variant in variants:
                vfile = run.variant(variant)
                if vfile.exists():
                    vpoints = read_points(vfile)
                    bar.update(per_len * len(_rows(s, variant, lengths)))
                else:
                    vpoints = _evaluate_variant(lm, s, task, variant, lengths, bar, clock)
                    vfile.parent.mkdir(exist_ok=True)
                    write_points(vfile, vpoints)
                points += vpoints
            bar.close()
            write_run(run.result, run_record(task=task.name, encoding=label, seed=0, train_length=s.trained_length,
                                             metric=task.metric, points=points, train_loss=None, train_seconds=0.0,
                                             parameters=sum(p.numel() for p in model.parameters())))
            records.append(read_run(run.result))
        records.sort(key=lambda r: s.tasks.index(r["task"]))
        results = collect(s, records)
        corpora = [c for name in s.tasks if (c := model_task(name)(tokenizer).corpus(s)) is not None]
        if corpora:  # one text per run: --data or --corpus
            results["corpus"] = corpora[0].record()
        write_outputs(results, out)
    return results
