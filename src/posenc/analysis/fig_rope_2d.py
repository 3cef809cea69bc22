"""2-D RoPE's figure: RoPE-Axial against RoPE-Mixed on a patch grid (Heo et al. 2024).

The logit of the grid's centre patch against every patch, for all-ones q and k, after the
registered encodings' own ``rotate`` hooks at the grid's (row, column) axes. Axial frequencies
run along rows and columns only, so the pattern is a sum of a row profile and a column
profile; RoPE-Mixed's per-head frequencies (at their random initial directions) turn along
oblique directions, a different one per head. DINOv3's axial RoPE turns by the patch centres
normalised to [-1, 1] over the grid (base 100), so its pattern is axial too but spans the same
fraction of any grid: the figure's grid is its ``grid_height`` x ``grid_width``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..positions import SequenceInfo
from ..registry import build
from .canvas import PlotResult, figure, save

__all__ = ["centre_logits_2d", "plot_rope_2d"]


def centre_logits_2d(name: str, height: int, width: int, head_dim: int = 64, num_heads: int = 2,
                     seed: int = 0, **config) -> torch.Tensor:
    """(heads, height, width): q·k (unscaled) of the centre patch's query against each patch's
    key, all-ones q and k, after encoding ``name``'s ``rotate`` hook (module built under
    ``torch.manual_seed(seed)``: RoPE-Mixed's initial directions)."""
    torch.manual_seed(seed)
    enc = build(name, d_model=head_dim * num_heads, num_heads=num_heads, **config)
    seq = SequenceInfo.from_grid(height, width)
    T = height * width
    ones = torch.ones(1, num_heads, T, head_dim, dtype=torch.float64)
    with torch.no_grad():
        q, k = enc.to(torch.float64).rotate(ones, ones, seq.axes, seq.axes)
    centre = (height // 2) * width + width // 2
    return torch.einsum("htd,hd->ht", k[0], q[0, :, centre]).reshape(num_heads, height, width)


def plot_rope_2d(out_dir: Path, height: int = 16, width: int = 16, head_dim: int = 64) -> PlotResult:
    """RoPE-Axial, two heads of RoPE-Mixed (at initialisation) and DINOv3's normalised axial
    RoPE: the centre patch's logit over a patch grid (Heo et al. 2024; Siméoni et al. 2025)."""
    axial = centre_logits_2d("rope_axial", height, width, head_dim)[0]
    mixed = centre_logits_2d("rope_mixed", height, width, head_dim)
    dinov3 = centre_logits_2d("rope_dinov3", height, width, head_dim, grid_height=height, grid_width=width)[0]
    plt, fig, axes = figure(4)
    panels = ((axial, "rope_axial (base 100)"), (mixed[0], "rope_mixed, head 0"), (mixed[1], "rope_mixed, head 1"),
              (dinov3, "rope_dinov3 (in [-1, 1])"))
    for ax, (z, name) in zip(axes, panels):
        im = ax.imshow(z.numpy(), cmap="viridis", origin="upper")
        ax.plot([width // 2], [height // 2], "r+", ms=10)
        ax.set_xlabel("patch column x")
        ax.set_ylabel("patch row y")
        ax.set_title(name, fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046).set_label("logit of the centre patch (+)", fontsize=8)
    return save(plt, fig, out_dir, "rope-2d", f"2-D RoPE on a {height} x {width} patch grid: axial, mixed "
                f"and DINOv3 frequencies (d = {head_dim}, all-ones q, k)", {"axial": axial, "mixed": mixed, "dinov3": dinov3})
