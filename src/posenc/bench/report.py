"""Benchmark results rendered: the text and HTML tables, the figures, and the output files.

For the HTML report (``posenc report``) the entry points are :func:`table_cells`,
:func:`significance_lines`, :func:`settings_text`, :func:`figures` (results dict ->
``{name: matplotlib Figure}``) and :func:`figure_captions`; the numbers themselves come from
:mod:`posenc.bench.summary`. A RoPE scaling is shown by its registry label
(:attr:`posenc.rotary.Scaling.label`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..results import ResultsFile, RunLayout, write_results
from .stats import mean_std
from .summary import mean_reciprocal_rank, per_length, ranking
from .tasks import Task, get_task, task_names

__all__ = ["cell_text", "figure_captions", "figures", "format_table", "scaling_label", "settings_text",
           "significance_lines", "table_cells", "variant_label", "write_outputs"]


def scaling_label(variant: str) -> str:
    """A RoPE scaling's label from its registry entry (``yarn`` -> ``YaRN``); an unknown name as is."""
    from ..rotary.scaling import SCALINGS

    entry = SCALINGS.get(variant)
    return variant if entry is None else entry.label


def variant_label(encoding: str, variant: str) -> str:
    """``rope`` or ``rope + YaRN``."""
    return encoding if variant == "base" else f"{encoding} + {scaling_label(variant)}"


def _value(x: float, metric: str) -> str:
    return f"{x:.2f}" if metric == "ppl" else f"{100 * x:.1f}"


def cell_text(row: dict, which: str, base: str | None = None) -> str:
    """One "mean ± std" cell of a summary row (``which``: "in" or "beyond"), never ``nan``.

    Accuracy in %, perplexity as is; "± std" only with more than one seed. A missing value
    reads "as BASE" for a RoPE scaling within L (the scaling changes the model beyond L only)
    and "n/a" otherwise (no evaluation there, or a run that diverged).
    """
    mean, std = row[f"{which}_mean"], row[f"{which}_std"]
    if mean is None or math.isnan(mean):
        return f"as {base}" if base is not None and which == "in" else "n/a"
    text = _value(mean, row["metric"])
    if row["seeds"] > 1 and std is not None and not math.isnan(std):
        text += " ± " + _value(std, row["metric"])
    return text


def _task(name: str) -> Task:
    """The registered task of a results file's runs (an unregistered one: a plain example task)."""
    return get_task(name) if name in task_names() else Task()


def settings_text(results: dict) -> str:
    """One line: seeds, model size, training, and each task's training length with its unit."""
    s = results.get("settings") or {}
    runs = results.get("runs") or []
    seeds = len({r["seed"] for r in runs}) or s.get("seeds", 1)
    lengths = {r["task"]: r["train_length"] for r in runs}
    parts = [f"{seeds} seed{'s' if seeds != 1 else ''}"]
    if "d_model" in s:
        parts.append(f"model d_model {s['d_model']}, {s.get('n_layer', '?')} layers, {s.get('n_head', '?')} heads")
    if "steps" in s:
        batch = f"batch {s.get('batch_size', '?')}"
        notes = [n for n in (_task(t).settings_note(s) for t in lengths) if n]
        if notes:
            batch += f" ({'; '.join(notes)})"
        parts.append(f"{s['steps']} steps, {batch}, lr {s.get('lr', '?')}")
    if lengths:
        parts.append("training length L: " + ", ".join(f"{t} {L} {_task(t).unit}" for t, L in lengths.items()))
    return "; ".join(parts)


def table_cells(results: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the summary: one row per encoding (and RoPE scaling), per task a
    "≤L | >L" column, and the MRR with its interval. Shared by the text and HTML tables."""
    summary = results["summary"]
    tasks = list(dict.fromkeys(r["task"] for r in summary))
    metric = {r["task"]: r["metric"] for r in summary}
    idx = {(r["task"], r["encoding"], r["variant"]): r for r in summary}
    rank = results.get("ranking") or ranking(summary)
    ci = {i["encoding"]: i for i in rank["intervals"]}
    mrr = results.get("mrr") or mean_reciprocal_rank(summary)
    level = round(100 * rank["method"]["confidence"])
    head = ["encoding"]
    for t in tasks:
        head.append(f"{t}: ppl at L | at {_longest(results, t)}" if metric[t] == "ppl" else f"{t}: accuracy % ≤L | >L")
    head.append(f"MRR [{level} % CI]")
    lines = []
    for enc, variant in dict.fromkeys((r["encoding"], r["variant"]) for r in summary):
        cells = [variant_label(enc, variant)]
        base = None if variant == "base" else enc
        for t in tasks:
            r = idx.get((t, enc, variant))
            cells.append("not run" if r is None else f"{cell_text(r, 'in', base)} | {cell_text(r, 'beyond', base)}")
        if variant != "base" or enc not in mrr:
            cells.append("")
        elif enc in ci:
            cells.append(f"{mrr[enc]:.2f} [{ci[enc]['low']:.2f}, {ci[enc]['high']:.2f}]")
        else:
            cells.append(f"{mrr[enc]:.2f}")
        lines.append(cells)
    return head, lines


def _longest(results: dict, task: str) -> str:
    runs = [r for r in results.get("runs", []) if r["task"] == task]
    if not runs:
        return "the longest length"
    L = runs[0]["train_length"]
    n = max((p["length"] for r in runs for p in r["points"]), default=L)
    return f"{n // L}L" if n % L == 0 else f"{n}"


def significance_lines(results: dict) -> list[str]:
    """How the MRR interval was made, and which ranking differences are significant (the
    interval of the paired difference excludes 0) and which are not."""
    rank = results.get("ranking") or ranking(results["summary"])
    m = rank["method"]
    pairs = rank["pairs"]
    if not pairs:
        return []
    level = round(100 * m["confidence"])
    seeds = max((r["seeds"] for r in results["summary"]), default=1)
    lines = [f"MRR: mean of 1/rank by the >L score over {m['cells']} (task, seed) cells; [{level} % CI]: percentile "
             f"bootstrap, {m['resamples']:,} resamples of the cells (seed {m['seed']}), paired across encodings."]
    if seeds < 2:
        lines.append("One seed: the intervals show agreement across tasks only, not seed-to-seed noise, so no "
                     "difference is called significant (run --seeds 3 or more).")
        return lines
    ahead: dict[str, list[str]] = defaultdict(list)
    for p in pairs:
        if p["significant"]:
            ahead[p["first"]].append(p["second"])
    lines.append("Significantly ahead (CI of the difference excludes 0): "
                 + ("; ".join(f"{a} > {', '.join(b)}" for a, b in ahead.items()) if ahead else "none"))
    ties = [f"{p['first']} vs {p['second']} ({p['diff']:+.2f} [{p['low']:+.2f}, {p['high']:+.2f}])"
            for p in pairs if not p["significant"]]
    lines.append("Not significantly apart: " + ("; ".join(ties) if ties else "none"))
    if rank.get("incomplete"):
        lines.append("Not ranked in every cell, so without an interval: " + ", ".join(rank["incomplete"]))
    return lines


def format_table(results: dict) -> str:
    """The text table ``posenc bench`` prints: settings, one row per encoding (and RoPE
    scaling) with per task "≤L | >L" columns and the MRR with its interval, then notes and
    which ranking differences are significant."""
    head, lines = table_cells(results)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    seeds = max((r["seeds"] for r in results["summary"]), default=1)
    note = (f"mean ± std over {seeds} seeds" if seeds > 1 else "1 seed (no spread)") + \
        "; accuracy: exact match in %, ≤L within the training length, >L beyond it; ppl: byte perplexity"
    if any(r["variant"] != "base" for r in results["summary"]):
        note += "; \"as rope\": a RoPE scaling changes the model beyond L only"
    return "\n".join(["Settings: " + settings_text(results), fmt(head), fmt(["-" * w for w in widths]),
                      *map(fmt, lines), note, *significance_lines(results)])


def figure_captions(results: dict) -> dict[str, str]:
    """Figure name (as :func:`figures` and ``plots/NAME.png``) -> what the figure shows."""
    caps = {}
    seeds = len({r["seed"] for r in results["runs"]}) or 1
    spread = f"mean over {seeds} seeds, band ± 1 std" if seeds > 1 else "1 seed"
    for task in dict.fromkeys(r["task"] for r in results["runs"]):
        runs = [r for r in results["runs"] if r["task"] == task]
        L, metric = runs[0]["train_length"], runs[0]["metric"]
        what = "byte perplexity (log scale, lower is better)" if metric == "ppl" else "exact-match accuracy (%)"
        caps[f"task_{task}"] = (f"{task}: {what} against evaluation length, one line per encoding ({spread}); "
                                f"the dashed line is the training length L = {L}.")
        scalings = dict.fromkeys(p["variant"] for r in runs for p in r["points"] if p["variant"] != "base")
        if scalings:
            caps[f"scaling_{task}"] = (f"{task}: RoPE models with each training-free scaling "
                                       f"({', '.join(map(scaling_label, scalings))}) applied beyond L = {L}; "
                                       f"within L each line is the unscaled model ({spread}).")
        if _has_depths(runs):
            caps[f"{task}_depth"] = (f"{task}: accuracy (%) by context length (x) and depth of the key in the "
                                     "context (y: 0 = start, 1 = end), one panel per encoding, mean over seeds.")
    return caps


def _has_depths(runs: list[dict]) -> bool:
    """Whether a task's points are measured at key depths too (passkey retrieval)."""
    return any(p["depth"] is not None for r in runs for p in r["points"])


def write_outputs(results: ResultsFile, out: Path) -> list[Path]:
    """results.json and results.csv (:func:`posenc.results.write_results`) and plots/*.png; returns the paths."""
    paths = write_results(out, results)
    plots = RunLayout(Path(out)).plots
    plots.mkdir(exist_ok=True)
    from .._optional import require

    plt = require("matplotlib.pyplot", extra="plot")

    for name, fig in figures(results).items():
        p = plots / f"{name}.png"
        fig.savefig(p, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(p)
    return paths


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
            label = variant_label(r["encoding"], v)
            curve = per_length(r["points"], v)
            if v != "base":  # scalings apply beyond L; within L the model is the unscaled one
                base = per_length(r["points"], "base")
                curve = {n: x for n, x in base.items() if n <= r["train_length"]} | curve
            for n, val in sorted(curve.items()):
                acc[label][n].append(val)
    out = {}
    for label, by in acc.items():
        ns = sorted(by)
        ms = [mean_std(by[n]) for n in ns]
        out[label] = (ns, [m for m, _ in ms], [s for _, s in ms])
    return out


def figures(results: dict) -> dict[str, Any]:
    """Matplotlib figures (Agg): ``task_<name>`` metric vs length, one line per encoding;
    ``scaling_<name>`` the RoPE models with each training-free scaling; ``<name>_depth``
    accuracy by length and depth per encoding, for a task with key depths (passkey)."""
    from .._optional import require

    matplotlib = require("matplotlib", extra="plot")

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
            scale = 1.0 if metric == "ppl" else 100.0  # accuracy in %
            for label, (ns, mean, std) in _curves(results, task, filt).items():
                mean, std = [scale * m for m in mean], [scale * x for x in std]
                line, = ax.plot(ns, mean, marker="o", ms=3, label=label)
                if any(std):
                    ax.fill_between(ns, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                    color=line.get_color(), alpha=0.15)
            ax.axvline(L, color="gray", ls="--", lw=1, label=f"train length L={L}")
            ax.set_xlabel("evaluation length")
            if metric == "ppl":
                from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

                ax.set_yscale("log")
                ax.set_xscale("log", base=2)
                # enough labelled ticks on both log axes (a narrow perplexity range still gets a few), plain
                # numbers, and the lengths evaluated
                ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)))
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(NullFormatter())
                lengths = sorted({n for ns, _, _ in _curves(results, task, filt).values() for n in ns})
                ax.set_xticks(lengths, [str(n) for n in lengths])
                ax.xaxis.set_minor_formatter(NullFormatter())
                ax.set_ylabel("perplexity (bytes)")
            else:
                ax.set_ylabel("exact-match accuracy (%)")
                ax.set_ylim(-2, 102)
            title = f"{task}: " + ("RoPE with training-free scalings" if name.startswith("scaling") else "length generalization")
            ax.set_title(title)
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            figs[name] = fig
    for task in tasks:
        pk = [r for r in results["runs"] if r["task"] == task]
        if _has_depths(pk):
            figs[f"{task}_depth"] = _depth_figure(plt, task, pk)
    return figs


def _depth_figure(plt: Any, task: str, pk: list[dict]) -> Any:
    """Accuracy by context length (x) and key depth (y), one panel per encoding, mean over seeds."""
    encs = list(dict.fromkeys(r["encoding"] for r in pk))
    lengths = sorted({p["length"] for r in pk for p in r["points"]})
    depths = sorted({p["depth"] for r in pk for p in r["points"]})
    fig, axes = plt.subplots(1, len(encs), figsize=(2.6 * len(encs), 2.8), squeeze=False)
    for ax, enc in zip(axes[0], encs):
        grid = [[statistics.fmean([p["value"] for r in pk if r["encoding"] == enc for p in r["points"]
                                   if p["variant"] == "base" and p["length"] == n and p["depth"] == d] or [math.nan])
                 for n in lengths] for d in depths]
        image = ax.imshow([[100 * x for x in row] for row in grid], vmin=0, vmax=100, cmap="viridis",
                          aspect="auto", origin="lower")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=6)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=6)
        ax.set_title(enc, fontsize=8)
        ax.set_xlabel("context length", fontsize=7)
    axes[0][0].set_ylabel("key depth", fontsize=7)
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy (%)", shrink=0.9)
    fig.suptitle(f"{task} accuracy (train length {pk[0]['train_length']} {_task(task).unit})", fontsize=9)
    return fig
