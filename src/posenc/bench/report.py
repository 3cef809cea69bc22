"""Collect, summarise, tabulate and plot benchmark results.

For the HTML report (``posenc report``) the entry points are :func:`load_results`
(``results.json`` -> dict) and :func:`figures` (dict -> ``{name: matplotlib Figure}``).

Summary per (task, encoding, variant), mean ± std over seeds of a per-seed number:

* synthetic tasks and passkey: accuracy averaged over lengths ``<= L`` ("in") and over
  lengths ``> L`` ("beyond"); passkey averages over depths first;
* ``lm``: perplexity at ``L`` ("in") and at the longest evaluation length ("beyond").

Mean reciprocal rank (Kazemnejad et al. 2023, Fig. 3): on each task the encodings
(unscaled models) are ranked by their "beyond" mean (accuracy: higher is better;
perplexity: lower is better); an encoding's MRR is the mean of 1/rank over tasks.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from .files import write_json

__all__ = ["collect", "summarise", "mean_reciprocal_rank", "format_table", "write_outputs", "load_results", "read_record", "figures"]

RESULTS_FORMAT = "posenc-bench-results-1"


def _mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample std over seeds; NaN when any seed has no value (e.g. a RoPE-scaling
    variant has no "inside" point). ``statistics.stdev`` itself raises on NaN (an
    AttributeError from its exact-fraction arithmetic), which crashed every run with 2 seeds."""
    if any(math.isnan(x) for x in xs):
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _per_length(points: list[dict], variant: str) -> dict[int, float]:
    """length -> value for one variant (averaging over passkey depths)."""
    by: dict[int, list[float]] = defaultdict(list)
    for p in points:
        if p["variant"] == variant:
            by[p["length"]].append(p["value"])
    return {n: statistics.fmean(v) for n, v in sorted(by.items())}


def summarise(records: list[dict]) -> list[dict]:
    """One row per (task, encoding, variant): in/beyond mean and std over seeds."""
    groups: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        L = r["train_length"]
        for variant in dict.fromkeys(p["variant"] for p in r["points"]):
            curve = _per_length(r["points"], variant)
            if r["metric"] == "ppl":
                inside = curve.get(L, math.nan)
                beyond = curve[max(curve)] if max(curve) > L else math.nan
            else:
                ins = [v for n, v in curve.items() if n <= L]
                out = [v for n, v in curve.items() if n > L]
                inside = statistics.fmean(ins) if ins else math.nan
                beyond = statistics.fmean(out) if out else math.nan
            groups[(r["task"], r["encoding"], variant)].append((inside, beyond))
    rows = []
    metric = {r["task"]: r["metric"] for r in records}
    for (task, enc, variant), vals in groups.items():
        im, isd = _mean_std([v[0] for v in vals])
        bm, bsd = _mean_std([v[1] for v in vals])
        rows.append(dict(task=task, encoding=enc, variant=variant, metric=metric[task], seeds=len(vals),
                         in_mean=im, in_std=isd, beyond_mean=bm, beyond_std=bsd))
    return rows


def mean_reciprocal_rank(summary: list[dict]) -> dict[str, float]:
    """Encoding -> mean over tasks of 1 / rank by the "beyond" metric (ties share the best rank)."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for row in summary:
        if row["variant"] == "base":
            by_task[row["task"]].append(row)
    rr: dict[str, list[float]] = defaultdict(list)
    for rows in by_task.values():
        sign = 1.0 if rows[0]["metric"] == "ppl" else -1.0  # sort so the best comes first
        keyed = [(sign * r["beyond_mean"] if not math.isnan(r["beyond_mean"]) else math.inf, r["encoding"]) for r in rows]
        for key, enc in keyed:
            rank = 1 + sum(k < key for k, _ in keyed)
            rr[enc].append(1.0 / rank)
    return {enc: statistics.fmean(v) for enc, v in sorted(rr.items(), key=lambda kv: -statistics.fmean(kv[1]))}


def collect(settings: Any, records: list[dict]) -> dict:
    """The content of results.json."""
    summary = summarise(records)
    return dict(
        format=RESULTS_FORMAT,
        settings=settings.to_json() if hasattr(settings, "to_json") else settings,
        runs=records,
        summary=summary,
        mrr=mean_reciprocal_rank(summary),
    )


def _cell(mean: float, std: float, metric: str, seeds: int) -> str:
    if math.isnan(mean):
        return "-"
    if metric == "ppl":
        return f"{mean:.2f}" + (f" ± {std:.2f}" if seeds > 1 else "")
    return f"{100 * mean:.1f}" + (f" ± {100 * std:.1f}" if seeds > 1 else "")


def format_table(results: dict) -> str:
    """A text table: one row per encoding (and RoPE scaling), per task "in / beyond" columns."""
    summary = results["summary"]
    tasks = list(dict.fromkeys(r["task"] for r in summary))
    rows = list(dict.fromkeys((r["encoding"], r["variant"]) for r in summary))
    idx = {(r["task"], r["encoding"], r["variant"]): r for r in summary}
    mrr = results.get("mrr", {})
    head = ["encoding"] + [f"{t} ({'ppl' if _metric_of(summary, t) == 'ppl' else 'acc %'}) ≤L | >L" for t in tasks] + ["MRR"]
    lines = []
    for enc, variant in rows:
        name = enc if variant == "base" else f"{enc}+{variant}"
        cells = [name]
        for t in tasks:
            r = idx.get((t, enc, variant))
            cells.append("" if r is None else
                         f"{_cell(r['in_mean'], r['in_std'], r['metric'], r['seeds'])} | "
                         f"{_cell(r['beyond_mean'], r['beyond_std'], r['metric'], r['seeds'])}")
        cells.append(f"{mrr[enc]:.2f}" if variant == "base" and enc in mrr else "")
        lines.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    seeds = max((r["seeds"] for r in summary), default=1)
    note = f"mean ± std over {seeds} seeds; " if seeds > 1 else "1 seed; "
    note += "acc: exact match %, ≤L in-distribution, >L beyond training length; ppl: at L | at the longest length"
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines), note])


def _metric_of(summary: list[dict], task: str) -> str:
    return next(r["metric"] for r in summary if r["task"] == task)


def write_outputs(results: dict, out: Path) -> list[Path]:
    """results.json, results.csv (one row per point) and plots/*.png; returns the paths."""
    out = Path(out)
    write_json(out / "results.json", results, indent=1)  # strict: NaN (no run beyond L) -> null
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "encoding", "variant", "seed", "train_length", "length", "depth", "metric", "value"])
        for r in results["runs"]:
            for p in r["points"]:
                w.writerow([r["task"], r["encoding"], p["variant"], r["seed"], r["train_length"], p["length"],
                            "" if p["depth"] is None else p["depth"], r["metric"], p["value"]])
    paths = [out / "results.json", out / "results.csv"]
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    import matplotlib.pyplot as plt

    for name, fig in figures(results).items():
        p = plots / f"{name}.png"
        fig.savefig(p, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)
    return paths


def load_results(path: str | Path) -> dict:
    """Read ``results.json`` (a file or the benchmark's output directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.exists():
        raise FileNotFoundError(f"no benchmark results at {str(p)!r}; run `posenc bench --out DIR` first")
    results = json.loads(p.read_text())
    if results.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{p} is not posenc bench results (format {results.get('format')!r})")
    return _nan_for_null(results)


_NUMBERS = ("value", "train_loss", "in_mean", "in_std", "beyond_mean", "beyond_std")


def _nan_for_null(obj: Any) -> Any:
    """Undo :func:`~posenc.bench.files.finite_or_none` for the numeric fields: null -> NaN,
    so the summaries and plots compute as they did before the file was written."""
    if isinstance(obj, dict):
        return {k: (math.nan if v is None and (k in _NUMBERS) else _nan_for_null(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_for_null(v) for v in obj]
    return obj


def read_record(path: str | Path) -> dict:
    """One run's ``result.json``, with null metrics back as NaN."""
    return _nan_for_null(json.loads(Path(path).read_text()))


def _curves(results: dict, task: str, variant_filter) -> dict[str, tuple[list[int], list[float], list[float]]]:
    """label -> (lengths, mean, std) over seeds."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results["runs"]:
        if r["task"] != task:
            continue
        variants = dict.fromkeys(p["variant"] for p in r["points"])
        for v in variants:
            if not variant_filter(r["encoding"], v):
                continue
            label = r["encoding"] if v == "base" else f"{r['encoding']}+{v}"
            curve = _per_length(r["points"], v)
            if v != "base":  # scalings apply beyond L; within L the model is the unscaled one
                base = _per_length(r["points"], "base")
                curve = {n: x for n, x in base.items() if n <= r["train_length"]} | curve
            for n, val in sorted(curve.items()):
                acc[label][n].append(val)
    out = {}
    for label, by in acc.items():
        ns = sorted(by)
        ms = [_mean_std(by[n]) for n in ns]
        out[label] = (ns, [m for m, _ in ms], [s for _, s in ms])
    return out


def figures(results: dict) -> dict[str, Any]:
    """Matplotlib figures (Agg): ``task_<name>`` metric vs length, one line per encoding;
    ``scaling_<name>`` the RoPE models with each training-free scaling; ``passkey_depth``
    accuracy by length and depth per encoding."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    figs: dict[str, Any] = {}
    tasks = list(dict.fromkeys(r["task"] for r in results["runs"]))
    for task in tasks:
        runs = [r for r in results["runs"] if r["task"] == task]
        L, metric = runs[0]["train_length"], runs[0]["metric"]
        scaled = {r["encoding"] for r in runs for p in r["points"] if p["variant"] != "base"}
        panels = {f"task_{task}": lambda e, v: v == "base"}
        if scaled:
            panels[f"scaling_{task}"] = lambda e, v, s=scaled: e in s
        for name, filt in panels.items():
            fig, ax = plt.subplots(figsize=(6, 4))
            for label, (ns, mean, std) in _curves(results, task, filt).items():
                line, = ax.plot(ns, mean, marker="o", ms=3, label=label)
                if any(std):
                    ax.fill_between(ns, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                    color=line.get_color(), alpha=0.15)
            ax.axvline(L, color="gray", ls="--", lw=1, label=f"train length L={L}")
            ax.set_xlabel("evaluation length")
            if metric == "ppl":
                ax.set_yscale("log")
                ax.set_xscale("log", base=2)
                ax.set_ylabel("perplexity (bytes)")
            else:
                ax.set_ylabel("exact-match accuracy")
                ax.set_ylim(-0.02, 1.02)
            title = f"{task}: " + ("RoPE with training-free scalings" if name.startswith("scaling") else "length generalization")
            ax.set_title(title)
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            figs[name] = fig
    pk = [r for r in results["runs"] if r["task"] == "passkey"]
    if pk:
        encs = list(dict.fromkeys(r["encoding"] for r in pk))
        lengths = sorted({p["length"] for r in pk for p in r["points"]})
        depths = sorted({p["depth"] for r in pk for p in r["points"]})
        fig, axes = plt.subplots(1, len(encs), figsize=(2.6 * len(encs), 2.8), squeeze=False)
        for ax, enc in zip(axes[0], encs):
            grid = [[statistics.fmean([p["value"] for r in pk if r["encoding"] == enc for p in r["points"]
                                       if p["variant"] == "base" and p["length"] == n and p["depth"] == d] or [math.nan])
                     for n in lengths] for d in depths]
            ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
            ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=6)
            ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=6)
            ax.set_title(enc, fontsize=8)
            ax.set_xlabel("context length", fontsize=7)
        axes[0][0].set_ylabel("key depth", fontsize=7)
        fig.suptitle(f"passkey accuracy (train length {pk[0]['train_length']})", fontsize=9)
        figs["passkey_depth"] = fig
    return figs
