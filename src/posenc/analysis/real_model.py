"""The report's real-model sections: a ``posenc probe --out`` folder and a ``posenc bench --model
--out`` folder, read back (nothing is recomputed) and shown as HTML, one figure and summary lines.

* :func:`load_probe`: probe.json and its PNGs; :func:`probe_summary`: one line per probed layer
  with the three claims' verdicts (:mod:`posenc.hf.probe.verdicts`).
* :func:`model_bench_cells`: a checkpoint's results.json as {task: {row: {length: value}}} in the
  model's units (token perplexity; passkey %, the mean over depths); :func:`plot_model_bench`
  draws them against length (rows that coincide drawn once and named together);
  :func:`model_bench_summary` states the longest length's numbers.
* :func:`model_concerns`: what a real model's results concern (RoPE and the scalings evaluated),
  so the report keeps the figures about them.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import torch

from ..hf.tasks import model_task
from ..rotary.scaling import SCALINGS
from .canvas import PlotResult, coincident_groups, figure, prepare_out_dir, save

__all__ = ["load_probe", "model_bench_cells", "model_bench_summary", "model_concerns", "plot_model_bench",
           "probe_summary", "row_label"]


def load_probe(probe_dir: str | Path) -> tuple[dict[str, Any], list[Path]]:
    """(probe.json's content, its figures: probe_layer<L>.png then probe_layers.png) of a
    ``posenc probe --out`` folder; a clear error when the folder holds no probe."""
    d = Path(probe_dir)
    path = d / "probe.json"
    if not path.is_file():
        raise FileNotFoundError(f"--probe {str(d)!r} holds no probe.json (give the --out folder of `posenc probe`)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or "layers" not in data:
        raise ValueError(f"{path} is not a posenc probe result (no 'layers')")
    figures = sorted(d.glob("probe_layer[0-9]*.png"), key=lambda p: int(p.stem.removeprefix("probe_layer")))
    figures += sorted(d.glob("probe_layers.png"))
    return data, figures


def model_name(data: dict[str, Any]) -> str:
    """A probe's or a bench's model as the user named it: a named model's label, or its cache
    folder (``<name>-<sha256[:12]>-v<format>``, posenc.hf.models) read back as the name, else
    the folder's own name."""
    if data.get("label"):
        return str(data["label"])
    folder = Path(str(data.get("model", "model"))).name
    named = re.fullmatch(r"(.+)-[0-9a-f]{12}-v\d+", folder)
    return named.group(1) if named else folder


def probe_summary(data: dict[str, Any]) -> list[str]:
    """One line per probed layer: the layer, its base and trained distance, each claim's verdict."""
    lines = []
    for layer, entry in data["layers"].items():
        verdicts = "; ".join(f"{v['claim']}: {'holds' if v['holds'] else 'does not hold'}"
                             for v in entry["verdicts"].values())
        lines.append(f"{model_name(data)} layer {layer} (RoPE base {entry['rope']['base']:g}, trained distance "
                     f"{entry['trained_distance']}): {verdicts}")
    return lines


def row_label(variant: str, settings: dict[str, Any]) -> str:
    """A bench --model row: the model itself, ``+ <the scaling's registry label>``, or the raised
    base (``+ base x16``)."""
    if variant == "base":
        return model_name(settings)
    if variant == "raised_base" and settings.get("raised_base"):
        return f"+ base x{settings['raised_base']:g}"
    entry = SCALINGS.get(variant)
    return f"+ {entry.label if entry is not None else variant.replace('_', ' ')}"


def model_bench_cells(results: dict[str, Any]) -> dict[str, dict[str, dict[int, float]]]:
    """{task: {row label: {length: value}}}: each task's value as it is shown (its
    :class:`~posenc.hf.tasks.ModelTask`'s ``scale``: passkey accuracy in %, the mean over depths;
    token perplexity as it is), in the order the rows were evaluated."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for run in results["runs"]:
        values: dict[tuple[str, int], list[float]] = {}
        for p in run["points"]:
            values.setdefault((p["variant"], p["length"]), []).append(p["value"])
        rows: dict[str, dict[int, float]] = {}
        scale = model_task(run["task"]).scale
        for (variant, n), vals in values.items():
            rows.setdefault(row_label(variant, results["settings"]), {})[n] = scale * sum(vals) / len(vals)
        out[run["task"]] = rows
    return out


def own_length(settings: dict[str, Any]) -> bool:
    """Whether the results' L is the checkpoint's own trained length (a real extension test), not
    a shorter one stated for a quick run (older files, which did not record it: stated)."""
    return settings.get("checkpoint_length", 0) == settings["trained_length"]


def length_words(settings: dict[str, Any]) -> str:
    """L in words: ``L = 8192, the checkpoint's own`` or ``L stated as 1024``."""
    L = settings["trained_length"]
    return f"L = {L}, the checkpoint's own" if own_length(settings) else f"L stated as {L}"


def model_concerns(results: dict[str, Any] | None, probe: dict[str, Any] | None) -> set[str]:
    """What a real model's results are about: its encoding (RoPE) and every scaling evaluated."""
    names = {"rope"}
    if results is not None:
        names |= set(results["settings"].get("scalings", ()))
    if probe is not None:
        names |= {n for e in probe["layers"].values() for n in e["curves"] if n in SCALINGS}
    return names


def model_bench_summary(results: dict[str, Any]) -> list[str]:
    """Per task, the rows at the longest length evaluated, best first."""
    L = results["settings"]["trained_length"]
    lines = []
    for task, rows in model_bench_cells(results).items():
        n = max(x for r in rows.values() for x in r)
        at = {name: r[n] for name, r in rows.items() if n in r}
        kind = model_task(task)
        order = sorted(at, key=lambda k: at[k], reverse=kind.higher_is_better)
        lines.append(f"{kind.value_label} at {n} tokens ({n / L:g} L, {length_words(results['settings'])}): "
                     + ", ".join(f"{k} {kind.value_format.format(at[k])}" for k in order))
    return lines


def plot_model_bench(results: dict[str, Any], out_dir: Path) -> PlotResult:
    """Token perplexity and passkey accuracy against length, one line per row (the model, each
    scaling from L on); rows within 0.1 % of each other at every length are drawn once and named
    together (``data["lines"]``: per task, the rows of each line)."""
    cells = model_bench_cells(results)
    L = results["settings"]["trained_length"]
    tasks = sorted(cells, key=lambda t: model_task(t).higher_is_better)  # lower-is-better panels (perplexity) first
    plt, fig, axes = figure(len(tasks))
    lines: dict[str, list[list[str]]] = {}
    for ax, task in zip(axes, tasks):
        rows = cells[task]
        lengths = sorted({n for r in rows.values() for n in r})
        model = next(iter(rows.values()))  # the model itself: a scaling changes it beyond L only
        series = {name: torch.tensor([r.get(n, model.get(n, float("nan")) if n <= L else float("nan"))
                                      for n in lengths], dtype=torch.float64) for name, r in rows.items()}
        # rows within 0.1 % of the largest value of each other at every length look like one line: drawn
        # once, named together
        filled = {k: torch.nan_to_num(v, nan=-1.0) for k, v in series.items()}
        lines[task] = coincident_groups(filled, rtol=1e-3)
        for i, group in enumerate(lines[task]):
            y = series[group[0]]
            ok = ~torch.isnan(y)
            exact = all(bool(torch.equal(filled[g], filled[group[0]])) for g in group)
            label = textwrap.fill((" = " if exact else " ≈ ").join(group) + (
                "" if len(group) == 1 else " (equal)" if exact else " (within 0.1 % of the largest value)"), 38)
            ax.plot([lengths[j] for j in range(len(lengths)) if ok[j]], y[ok].tolist(), "o-", color=f"C{i}", lw=1.2,
                    ms=4, label=label)
        ax.axvline(L, color="k", ls="--", lw=1, label=f"L = {L} ({'its own' if own_length(results['settings']) else 'stated'})")
        ax.set_xticks(lengths, [f"{n}\n{n / L:g} L" for n in lengths], fontsize=8)
        ax.set_xlabel("tokens")
        kind = model_task(task)
        ax.set_ylabel(kind.value_label)
        if kind.value_range is not None:
            ax.set_ylim(*kind.value_range)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=7)
        ax.set_title(task, fontsize=10)
    title = (f"{model_name(results['settings'])} beyond {'its own' if own_length(results['settings']) else 'a stated'} "
             "L, with each training-free scaling and method")
    return save(plt, fig, prepare_out_dir(out_dir), "model_bench", title, {"cells": cells, "lines": lines})
