"""Probe step 3, rendering: probe.json's data as figures and as an HTML section.

Curves are keyed in probe.json by the names ``model``, ``base x<f>`` and the scalings' rope
types; figures and tables show a scaling by its registry label (:attr:`Scaling.label`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...rotary.scaling import SCALINGS

__all__ = ["curve_label", "html_section", "plot_layer"]


def curve_label(name: str) -> str:
    """How a curve of probe.json is named in figures and tables: a scaling by its label."""
    entry = SCALINGS.get(name)
    return name if entry is None else entry.label


def plot_layer(data: dict, layer: int, out_dir: Path) -> Path:
    """Three panels: the checkpoint's curve; its high/low-frequency halves; base and scalings."""
    from ..._optional import require

    matplotlib = require("matplotlib", extra="plot")

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    d = data["distances"]
    L = data["trained_length"]
    curves = data["layers"][str(layer)]["curves"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharex=True)
    heads = data["heads"]
    who = f"all {len(heads)} heads" if data["settings"]["heads"] is None else f"heads {', '.join(map(str, heads))}"
    axes[0].plot(d, curves["model"]["full"], lw=0.8, color="C0", label=f"base {data['rope']['base']:g}")
    axes[0].set_title("(a) real q·k against distance")
    axes[1].plot(d, curves["model"]["high"], lw=0.8, color="C3", label=f"high-frequency half ({len(data['high_pairs'])} pairs)")
    axes[1].plot(d, curves["model"]["low"], lw=0.8, color="C2", label=f"low-frequency half ({len(data['low_pairs'])} pairs)")
    axes[1].set_title("(b) the two halves of the rotary pairs")
    for i, (name, c) in enumerate(curves.items()):
        axes[2].plot(d, c["full"], lw=0.8, color=f"C{i}", label=curve_label(name), alpha=0.9)
    axes[2].set_title(f"(c) raised base and scalings (factor {data['settings']['extend']:g}), no training")
    for ax in axes:
        ax.axvline(L, color="gray", ls="--", lw=1, label=f"trained length L={L}")
        ax.set_xlabel("relative distance d = m - n (tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("attention logit  scale · q̄·R(d)·k̄")
    fig.suptitle(f"{data['model']}: layer {layer}, mean over {who}, q/k from {data['text_tokens']} tokens of {data['text']}")
    fig.tight_layout()
    path = out_dir / f"probe_layer{layer}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def html_section(data: dict[str, Any], figures: list[Path], json_path: Path) -> str:
    """A probe's data as an HTML section: a table of the curves at d = 0, L and the farthest
    distance, and the figures (embedded as base64)."""
    import base64
    import html

    d = data["distances"]
    L = data["trained_length"]
    at = {"d = 0": 0, f"d = L = {L}": min(range(len(d)), key=lambda i: abs(d[i] - L)), f"d = {d[-1]}": len(d) - 1}
    rows = []
    for layer, entry in data["layers"].items():
        for name, c in entry["curves"].items():
            cells = "".join(f"<td>{c['full'][i]:.4g}</td>" for i in at.values())
            rows.append(f"<tr><td>{html.escape(layer)}</td><td>{html.escape(curve_label(name))}</td>{cells}</tr>")
    head = "".join(f"<th>{html.escape(k)}</th>" for k in at)
    figs = "".join(
        f'<figure><img src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode("ascii")}" '
        f'alt="{html.escape(p.stem)}"><figcaption>{html.escape(p.name)}: mean over the chosen heads of '
        f"scale · q̄·R(d)·k̄ (see docs/hf.md)</figcaption></figure>"
        for p in figures
    )
    return (
        f"<h2>Checkpoint probe: {html.escape(data['model'])}</h2>"
        f"<p class='note'>model_type {html.escape(str(data['model_type']))}, trained length L = {L}, "
        f"RoPE base {data['rope']['base']:g} ({html.escape(data['rope']['scaling'])}), q/k from "
        f"{data['text_tokens']} tokens of {html.escape(data['text'])}; data in {html.escape(str(json_path))}.</p>"
        f'<table id="probe"><tr><th>layer</th><th>RoPE</th>{head}</tr>{"".join(rows)}</table>{figs}'
    )
