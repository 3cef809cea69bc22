"""The sinusoidal encoding's figures (Vaswani et al. 2017): the table as an image, single
dimensions, the effect of the base, and the dot product against distance."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from ..absolute.sinusoidal import sinusoidal_table
from .canvas import PlotResult, figure, save

__all__ = ["plot_sinusoidal_base", "plot_sinusoidal_dot", "plot_sinusoidal_heatmap", "plot_sinusoidal_waves"]


def _sin_table(positions: Tensor, dim: int, base: float, layout: str = "interleaved") -> Tensor:
    return sinusoidal_table(positions, dim, base, layout=layout).double()


def plot_sinusoidal_heatmap(out_dir: Path, length: int = 128, dim: int = 64, base: float = 10000.0) -> PlotResult:
    """PE(p, i) as an image: fast waves in the first dimensions, slow ones in the last (Vaswani et al. 2017).

    Drawn in the "half" layout ([sin | cos], as tensor2tensor lays it out): interleaved rows
    would alternate sin ~ 0 and cos ~ 1 at the slow end and read as stripes."""
    table = _sin_table(torch.arange(length), dim, base, layout="half")  # (T, C)
    plt, fig, (ax,) = figure()
    im = ax.imshow(table.T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    ax.set_xlabel("position p")
    ax.set_ylabel(f"dimension (0..{dim // 2 - 1}: sin, {dim // 2}..{dim - 1}: cos)")
    fig.colorbar(im, ax=ax, label="PE(p, i)")
    return save(plt, fig, out_dir, "sinusoidal-heatmap", f"Sinusoidal encoding, d = {dim}, base {base:g}", {"table": table})


def plot_sinusoidal_waves(
    out_dir: Path, length: int = 256, dim: int = 64, base: float = 10000.0, dims: tuple[int, ...] = (0, 4, 8, 12, 16)
) -> PlotResult:
    """Single dimensions PE(·, 2i): the wavelength 2 pi base^(2i/d) grows geometrically with i."""
    pos = torch.arange(length)
    table = _sin_table(pos, dim, base)
    plt, fig, (ax,) = figure()
    periods = {}
    for i in dims:
        periods[i] = 2 * math.pi * base ** (2 * (i // 2) / dim)
        ax.plot(pos.numpy(), table[:, i].numpy(), label=f"dim {i}: period {periods[i]:.1f}")
    ax.set_xlabel("position p")
    ax.set_ylabel("PE(p, i)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside: the waves fill the axes
    return save(
        plt, fig, out_dir, "sinusoidal-waves", f"Sinusoidal dimensions, d = {dim}: period grows with i",
        {"positions": pos, "waves": {i: table[:, i] for i in dims}, "periods": periods},
    )


def plot_sinusoidal_base(
    out_dir: Path, length: int = 256, dim: int = 64, index: int = 16, bases: tuple[float, ...] = (100.0, 1000.0, 10000.0)
) -> PlotResult:
    """One fixed dimension for several bases: a larger base stretches the wave (longer period)."""
    pos = torch.arange(length)
    plt, fig, (ax,) = figure()
    waves = {}
    for b in bases:
        waves[b] = _sin_table(pos, dim, b)[:, index]
        ax.plot(pos.numpy(), waves[b].numpy(), label=f"base {b:g}: period {2 * math.pi * b ** (2 * (index // 2) / dim):.1f}")
    ax.set_xlabel("position p")
    ax.set_ylabel(f"PE(p, {index})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside: the waves fill the axes
    return save(plt, fig, out_dir, "sinusoidal-base", f"Effect of the base at dimension {index} of {dim}", {"positions": pos, "waves": waves})


def plot_sinusoidal_dot(out_dir: Path, max_distance: int = 256, dim: int = 64, base: float = 10000.0) -> PlotResult:
    """PE(p)·PE(p + k) = sum_i cos(k w_i): symmetric in k, largest at 0 (Yan et al. 2019, TENER)."""
    ref = 512  # any p gives the same curve: the dot product depends only on k
    dist = torch.arange(-max_distance, max_distance + 1)
    table = _sin_table(torch.arange(ref - max_distance, ref + max_distance + 1), dim, base)
    dot = table @ table[max_distance]  # (2K + 1,)
    plt, fig, (ax,) = figure()
    ax.plot(dist.numpy(), dot.numpy(), label=f"PE({ref})·PE({ref} + k)")
    ax.set_xlabel("distance k")
    ax.set_ylabel("dot product")
    ax.legend(loc="upper right")
    return save(plt, fig, out_dir, "sinusoidal-dot", f"Sinusoidal dot product vs distance, d = {dim}", {"distance": dist, "dot": dot})
