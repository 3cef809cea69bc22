"""The printed table of ``bench --model``: one checkpoint's results in its own units, one block
per task (its :class:`~posenc.hf.tasks.ModelTask` says what the values are and how a cell is
shown), rows the model itself and each scaling, columns the lengths. One checkpoint: no ranking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .scalings import variant_label
from .tasks import model_task

__all__ = ["format_model_table"]


def format_model_table(results: dict[str, Any]) -> str:
    """The results of one checkpoint in its own units: e.g. token perplexity and passkey accuracy
    (mean over depths) per variant and length; rows are the model itself and each scaling."""
    s = results["settings"]
    L = s["trained_length"]
    label = s.get("label") or Path(s["model"]).name
    lines = []
    for run in results["runs"]:
        task, pts = model_task(run["task"]), run["points"]
        lengths = sorted({p["length"] for p in pts})
        variants = list(dict.fromkeys(p["variant"] for p in pts))
        cells: dict[tuple[str, int], list[float]] = {}
        for p in pts:
            cells.setdefault((p["variant"], p["length"]), []).append(p["value"])
        lines.append(f"{label}: {task.title(s)}; L = {L} tokens")
        heads = [f"{n / L:g}L={n}" for n in lengths]
        names = {v: label if v == "base" else f"+ {variant_label(s, v)}" for v in variants}
        width = max(len(n) for n in names.values())
        lines.append(f"{'':<{width}}  " + "  ".join(f"{h:>12}" for h in heads))
        for v in variants:
            row = [f"{task.shown(cells[(v, n)]) if cells.get((v, n)) else '-':>12}" for n in lengths]
            lines.append(f"{names[v]:<{width}}  " + "  ".join(row))
        lines.append("")
    return "\n".join(lines).rstrip()
