"""p-RoPE's and HoPE's figure: the rotary pairs they keep and the ones they stop rotating.

p-RoPE (``proportional``; Barbero et al. 2025) keeps the first p of the pairs (the highest
frequencies); HoPE (Chen et al. 2025) keeps the pairs that turn a full period within the trained
length L. Both set the others' theta to 0: those channels carry content at every distance alike.
The frequencies are the scaling registry's own (:func:`posenc.rotary.scaling.rope_frequencies`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..rotary.scaling import SCALINGS, rope_frequencies
from .canvas import PlotResult, figure, save

__all__ = ["dropped_frequency_sets", "plot_rope_dropped_frequencies"]


def dropped_frequency_sets(dim: int, base: float, train_len: int, proportion: float) -> dict[str, torch.Tensor]:
    """theta_i (d/2,) float64 of RoPE, p-RoPE at ``proportion`` and HoPE at ``train_len``,
    keyed by the registry labels."""
    return {
        SCALINGS["default"].label: rope_frequencies("default", dim, base)[0].double(),
        SCALINGS["proportional"].label: rope_frequencies("proportional", dim, base, proportion=proportion)[0].double(),
        SCALINGS["hope"].label: rope_frequencies("hope", dim, base, original_max_position_embeddings=train_len)[0].double(),
    }


def plot_rope_dropped_frequencies(out_dir: Path, dim: int = 128, base: float = 10000.0, train_len: int = 4096,
                                  proportion: float = 0.25, extend: int = 4) -> PlotResult:
    """p-RoPE and HoPE set the lowest frequencies to 0 (Barbero et al. 2025; Chen et al. 2025):
    each pair's wavelength (dropped pairs never turn), and the all-ones score against distance."""
    sets = dropped_frequency_sets(dim, base, train_len, proportion)
    d = torch.arange(extend * train_len + 1)
    scores = {name: 2 * torch.cos(d.double()[:, None] * f[None, :]).sum(-1) for name, f in sets.items()}
    plt, fig, (a0, a1) = figure(2)
    pairs = torch.arange(dim // 2)
    full = 2 * math.pi / sets[SCALINGS["default"].label]
    top = float(full.max()) * 4  # where dropped pairs (an infinite wavelength) are drawn
    kept = {}
    for i, (name, f) in enumerate(sets.items()):
        on = f > 0
        kept[name] = int(on.sum())
        # dropped pairs sit above every wavelength, one row per set so that no marker hides another
        wave = torch.where(on, 2 * math.pi / f.clamp_min(1e-300), torch.tensor(top * 2.0**i, dtype=torch.float64))
        a0.plot(pairs[on].numpy(), wave[on].numpy(), ".", ms=5 - i, color=f"C{i}",
                label=f"{name}: {kept[name]} of {dim // 2} pairs rotate")
        if (~on).any():
            a0.plot(pairs[~on].numpy(), wave[~on].numpy(), "x", ms=4, color=f"C{i}",
                    label=f"{name}: {dim // 2 - kept[name]} pairs dropped (theta = 0)")
        a1.plot(d.numpy(), scores[name].numpy(), color=f"C{i}", lw=0.8, label=name)
    a0.axhline(train_len, color="k", ls="--", lw=1, label=f"L = {train_len}")
    a0.set_yscale("log")
    a0.set_xlabel("pair index i")
    a0.set_ylabel("wavelength 2 pi / theta_i (tokens); x: never turns")
    a0.set_title(f"which pairs rotate (p = {proportion:g}): those that do keep RoPE's wavelength, so\n"
                 "the three sets' dots coincide there", fontsize=9)
    a0.legend(loc="upper left", fontsize=7)
    a1.axvline(train_len, color="k", ls="--", lw=1, label=f"L = {train_len}")
    a1.set_xscale("symlog", linthresh=16)
    a1.set_xlim(0, float(d[-1]))
    a1.set_xlabel("distance m (symlog: linear to 16)")
    a1.set_ylabel("all-ones score 2 sum_i cos(m theta_i)")
    a1.set_title("dropped pairs add a constant 2 per pair", fontsize=10)
    a1.legend(loc="lower left", fontsize=8)
    a1.grid(alpha=0.3)
    return save(plt, fig, out_dir, "rope-dropped-frequencies",
                f"p-RoPE and HoPE: rotated and dropped pairs, d = {dim}, base {base:g}",
                {"inv_freq": sets, "kept": kept, "distance": d, "score": scores, "train_len": train_len,
                 "proportion": proportion})
