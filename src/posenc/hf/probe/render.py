"""Probe step 3, rendering: probe.json's data as figures and as an HTML section.

Curves are keyed in probe.json by the names ``model``, ``base x<f>`` and the scalings' rope
types; figures and tables show a scaling by its registry label (:attr:`Scaling.label`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...rotary.scaling import SCALINGS

__all__ = ["curve_label", "html_section", "plot_layer", "plot_layers"]


def curve_label(name: str) -> str:
    """How a curve of probe.json is named in figures and tables: a scaling by its label."""
    entry = SCALINGS.get(name)
    return name if entry is None else entry.label


def _coinciding(curves: dict[str, list[float]], tol: float) -> list[list[str]]:
    """Curve names grouped by values within ``tol`` of each other at every point, first-seen
    order: a figure draws each group once and names every member, since a curve hidden under
    another reads as missing (dynamic NTK against NTK-aware at a long probe's distances)."""
    groups: list[list[str]] = []
    for name, y in curves.items():
        for g in groups:
            ref = curves[g[0]]
            if len(ref) == len(y) and all(abs(a - b) <= tol for a, b in zip(ref, y)):
                g.append(name)
                break
        else:
            groups.append([name])
    return groups


def _layer_view(data: dict, layer: int) -> tuple[list, dict, int, int]:
    """(distances, curves, Ld, n): a layer's curves cut at extend * Ld (its trained distance)."""
    entry = data["layers"][str(layer)]
    ld = entry["trained_distance"]
    last = data["settings"]["extend"] * ld
    n = sum(1 for x in data["distances"] if x <= last)
    curves = {name: {kind: v[:n] for kind, v in c.items()} for name, c in entry["curves"].items()}
    return data["distances"][:n], curves, ld, n


def _layer_title(data: dict, layer: int) -> str:
    entry = data["layers"][str(layer)]
    kind = f"{entry['layer_type']}, " if entry["layer_type"] else ""
    return f"layer {layer} ({kind}base {entry['rope']['base']:g}, Ld = {entry['trained_distance']})"


def _verdict_note(entry: dict) -> str:
    return "claims: " + ", ".join(f"({'abc'[i]}) {'holds' if v['holds'] else 'does not hold'}"
                                  for i, v in enumerate(entry["verdicts"].values()))


def _windows(ax, entry: dict, kind: str, color: str, label: str | None = None) -> None:
    """The window means the verdicts read, as a thick line over the curve."""
    w = entry["windows"]
    ax.plot(w["centres"], w[kind], lw=2.2, color=color, alpha=0.85,
            label=label or f"mean over windows of {w['width']}")


def plot_layer(data: dict, layer: int, out_dir: Path) -> Path:
    """Three panels: the checkpoint's curve; its high/low-frequency halves; base and scalings
    (to extend x the layer's trained distance)."""
    from ..._optional import require

    matplotlib = require("matplotlib", extra="plot")

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    entry = data["layers"][str(layer)]
    d, curves, L, _ = _layer_view(data, layer)
    # the legends go below the axes: the scalings' panel has curves in every corner
    fig, axes = plt.subplots(1, 3, figsize=(15, 6.0), sharex=True, layout="constrained")
    heads = data["heads"]
    who = f"all {len(heads)} heads" if data["settings"]["heads"] is None else f"heads {', '.join(map(str, heads))}"
    axes[0].plot(d, curves["model"]["full"], lw=0.8, color="C0", label=f"base {entry['rope']['base']:g}")
    _windows(axes[0], entry, "full", "C9")
    axes[0].set_title(f"real q·k against distance\n{_verdict_note(entry)}", fontsize=10)
    axes[1].plot(d, curves["model"]["high"], lw=0.8, color="C3", label=f"high-frequency half ({len(entry['high_pairs'])} pairs)")
    axes[1].plot(d, curves["model"]["low"], lw=0.8, color="C2", label=f"low-frequency half ({len(entry['low_pairs'])} pairs)")
    _windows(axes[1], entry, "high", "darkred", "high half, window means")
    _windows(axes[1], entry, "low", "darkgreen", "low half, window means")
    axes[1].set_title("the two halves of the rotary pairs", fontsize=10)
    full = {name: c["full"] for name, c in curves.items()}
    span = max(max(y) for y in full.values()) - min(min(y) for y in full.values())
    for i, group in enumerate(_coinciding(full, 0.005 * span)):  # 0.5 % of the axis: one line to the eye
        exact = all(full[n] == full[group[0]] for n in group)
        label = (" = " if exact else " ≈ ").join(curve_label(n) for n in group)
        label += "" if len(group) == 1 else " (equal)" if exact else " (within 0.5 % of the axis)"
        axes[2].plot(d, full[group[0]], lw=0.8, color=f"C{i}", label=label, alpha=0.9)
    axes[2].set_title(f"raised base and scalings (factor {data['settings']['extend']:g}), no training", fontsize=10)
    for ax in axes:
        ax.axvline(L, color="gray", ls="--", lw=1, label=f"trained distance Ld={L}")
        ax.set_xlabel("relative distance d = m - n (tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    axes[0].set_ylabel("attention logit  scale · q̄·R(d)·k̄")
    fig.suptitle(f"{data['model']}: {_layer_title(data, layer)}, mean over {who}, "
                 f"q/k from {data['text_tokens']} tokens of {data['text']}", fontsize=10)
    path = out_dir / f"probe_layer{layer}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_layers(data: dict, out_dir: Path) -> Path:
    """The probed layers side by side (Gemma 3's sliding and global layers): per layer, top its
    curve at its own base and at the raised base, bottom its two frequency halves, each to
    extend x its trained distance, the verdicts in the corner."""
    from ..._optional import require

    matplotlib = require("matplotlib", extra="plot")

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    layers = list(data["layers"])
    fig, axes = plt.subplots(2, len(layers), figsize=(5.2 * len(layers), 7), squeeze=False)
    factor = f"base x{data['settings']['base_factor']:g}"
    for col, layer in enumerate(layers):
        entry = data["layers"][layer]
        d, curves, L, _ = _layer_view(data, int(layer))
        top, bottom = axes[0][col], axes[1][col]
        top.plot(d, curves["model"]["full"], lw=0.8, color="C0", label=f"base {entry['rope']['base']:g}")
        top.plot(d, curves[factor]["full"], lw=0.8, color="C1", label=f"{factor} (no training)")
        _windows(top, entry, "full", "navy", f"base {entry['rope']['base']:g}, window means")
        _windows(top, entry, "raised", "saddlebrown", f"{factor}, window means")
        top.set_title(f"{_layer_title(data, int(layer))}\n{_verdict_note(entry)}", fontsize=10)
        bottom.plot(d, curves["model"]["high"], lw=0.8, color="C3", label="high-frequency half")
        bottom.plot(d, curves["model"]["low"], lw=0.8, color="C2", label="low-frequency half")
        _windows(bottom, entry, "low", "darkgreen", "low half, window means")
        bottom.set_xlabel("relative distance d (tokens)")
        for ax in (top, bottom):
            ax.axvline(L, color="gray", ls="--", lw=1, label=f"Ld = {L}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best", framealpha=0.85)
    axes[0][0].set_ylabel("attention logit, mean over heads")
    axes[1][0].set_ylabel("the halves' logits")
    fig.suptitle(f"{data['model']}: the probed layers side by side (claims (a)-(c): see docs/hf.md)", fontsize=10)
    fig.tight_layout()
    path = out_dir / "probe_layers.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def html_section(data: dict[str, Any], figures: list[Path], json_path: Path) -> str:
    """A probe's data as an HTML section: the claims' verdicts with their numbers, a table of
    each RoPE's window means at the start, at the trained distance and at the farthest
    distance, and the figures (embedded as base64)."""
    import base64
    import html

    L = data["trained_length"]
    from .verdicts import verdict_line

    verdicts = []
    for layer, entry in data["layers"].items():
        for name, v in entry["verdicts"].items():
            word = "holds" if v["holds"] else "does not hold"
            line = verdict_line(name, v).split(" — ", 1)[1]
            verdicts.append(f"<tr><td>{html.escape(layer)}</td><td>{html.escape(v['claim'])}</td>"
                            f"<td class='{'ok' if v['holds'] else 'bad'}'>{word}</td><td>{html.escape(line)}</td></tr>")
    rows = []
    for layer, entry in data["layers"].items():
        win, ld = entry["windows"], entry["trained_distance"]
        w, centres = win["width"], win["centres"]
        # the first window, the last one inside Ld, the farthest one
        at = [0, max(i for i, c in enumerate(centres) if c + (w - 1) / 2 < ld), len(centres) - 1]
        spans = [f"{int(centres[i] - (w - 1) / 2)}-{int(centres[i] + (w - 1) / 2)}" for i in at]
        rows.append(f"<tr><th>layer {html.escape(layer)}</th>" + "".join(f"<th>d {x}</th>" for x in spans) + "</tr>")
        for name, m in win["variants"].items():
            cells = "".join(f"<td>{m[i]:.4g}</td>" for i in at)
            rows.append(f"<tr><td>{html.escape(curve_label(name))}</td>{cells}</tr>")
    figs = "".join(
        f'<figure><img src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode("ascii")}" '
        f'alt="{html.escape(p.stem)}"><figcaption>{html.escape(p.name)}: mean over the chosen heads of '
        f"scale · q̄·R(d)·k̄ (see docs/hf.md)</figcaption></figure>"
        for p in figures
    )
    ropes = "; ".join(f"layer {k}: base {e['rope']['base']:g} ({html.escape(e['rope']['scaling'])}), "
                      f"trained distance {e['trained_distance']}" for k, e in data["layers"].items())
    return (
        f"<h2>Checkpoint probe: {html.escape(data['model'])}</h2>"
        f"<p class='note'>model_type {html.escape(str(data['model_type']))}, trained length L = {L}, "
        f"{ropes}; q/k from {data['text_tokens']} tokens of {html.escape(data['text'])}; "
        f"data in {html.escape(str(json_path))}.</p>"
        f"<h3>The seeds' claims on this model</h3><p class='note'>Window means (width Ld/8, every Ld/16) of the mean "
        f"curve over the chosen heads, at every distance to {data['settings']['extend']:g} Ld; the rules are in "
        f"docs/hf.md (posenc.hf.probe.verdicts).</p>"
        f'<table id="probe-verdicts"><tr><th>layer</th><th>claim</th><th>verdict</th><th>numbers</th></tr>'
        f'{"".join(verdicts)}</table>'
        f"<p class='note'>Each RoPE's curve as window means (width Ld/8): the first window, the last one "
        f"within the trained distance Ld, the farthest one.</p>"
        f'<table id="probe">{"".join(rows)}</table>{figs}'
    )
