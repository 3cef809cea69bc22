"""M-RoPE's figure: three position axes on a patch grid (Wang et al. 2024, Qwen2-VL; Bai et
al. 2025, Qwen3-VL).

Left: the (time, height, width) position ids of text, an image and text again, as
:func:`posenc.positions.multimodal_axes` makes them (transformers' ``get_rope_index``). Middle
and right: the logit of the image's centre patch against every patch, for all-ones q and k,
after the registered ``mrope`` encoding's own ``rotate`` hook, with Qwen2-VL's chunked pairs
(time takes the highest frequencies, width the lowest) and Qwen3-VL's interleaved pairs (every
axis gets high and low frequencies).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..positions import multimodal_axes
from ..registry import build
from .canvas import PlotResult, figure, save

__all__ = ["grid_logits", "plot_mrope_axes"]


def grid_logits(height: int, width: int, head_dim: int = 128, base: float = 1e6, **config) -> torch.Tensor:
    """(height, width): q·k (unscaled) of the centre patch's query against each patch's key, for
    all-ones q and k after ``mrope``'s ``rotate`` hook (one image at time 0)."""
    enc = build("mrope", d_model=head_dim, num_heads=1, base=base, **config)
    axes = multimodal_axes([(1, height, width)])[:, None]  # (3, 1, T)
    T = height * width
    ones = torch.ones(1, 1, T, head_dim, dtype=torch.float64)
    with torch.no_grad():
        q, k = enc.rotate(ones, ones, axes, axes)
    centre = (height // 2) * width + width // 2
    return (k[0, 0] @ q[0, 0, centre]).reshape(height, width)  # (h, w)


def plot_mrope_axes(out_dir: Path, height: int = 16, width: int = 16, head_dim: int = 128,
                    base: float = 1e6) -> PlotResult:
    """M-RoPE's position ids of text + image + text, and the centre patch's logits over the
    grid for the chunked (Qwen2-VL) and interleaved (Qwen3-VL) splits of the pairs."""
    blocks = [4, (1, 4, 6), 4]
    axes = multimodal_axes(blocks)  # (3, T)
    chunked = grid_logits(height, width, head_dim, base)
    interleaved = grid_logits(height, width, head_dim, base, mrope_interleaved=True)
    plt, fig, (a0, a1, a2) = figure(3)
    t = torch.arange(axes.shape[1])
    for i, name in enumerate(("time", "height", "width")):
        a0.step(t.numpy(), axes[i].numpy(), where="mid", color=f"C{i}", lw=1.4, label=name)
    a0.axvspan(3.5, 3.5 + 24, color="0.9", zorder=0, label="image (4 x 6 patches)")
    a0.set_xlabel("token index (4 text, 24 patches, 4 text)")
    a0.set_ylabel("position id")
    a0.set_title("position ids per axis", fontsize=10)
    a0.legend(loc="upper left", fontsize=8)
    a0.grid(alpha=0.3)
    for ax, z, name in ((a1, chunked, "chunked (Qwen2-VL)"), (a2, interleaved, "interleaved (Qwen3-VL)")):
        im = ax.imshow(z.numpy(), cmap="viridis", origin="upper")
        ax.plot([width // 2], [height // 2], "r+", ms=10)
        ax.set_xlabel("patch column (width axis)")
        ax.set_ylabel("patch row (height axis)")
        ax.set_title(name, fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046).set_label("logit of the centre patch (+), all-ones q, k", fontsize=8)
    title = f"M-RoPE: time, height and width on sections of the rotary pairs (d = {head_dim}, base {base:g})"
    return save(plt, fig, out_dir, "mrope-axes", title,
                {"axes": axes, "chunked": chunked, "interleaved": interleaved})
