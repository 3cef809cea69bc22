"""The dynamic position bias's figure: an MLP of the distance, defined at every distance
(CrossFormer, Wang et al. 2021; x-transformers ``dynamic_pos_bias``).

The bias per head is the registered ``dynamic_bias`` encoding's own dense bias
(:meth:`~posenc.encoding.PositionalEncoding.score_bias`) at its initialisation, once on the raw
distance and once on its signed log, to four times a nominal trained length: the function goes
on past L (T5's buckets stop at one shared bucket, a learned table has no row there), and
the log input keeps it from running off linearly.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..registry import build
from .canvas import PlotResult, figure, save

__all__ = ["distance_bias", "plot_dynamic_bias"]


def distance_bias(num_heads: int, max_distance: int, seed: int, **config) -> torch.Tensor:
    """(H, max_distance + 1): the bias of a query at max_distance for keys at distances 0..max
    (the encoding's dense bias read along the last query row, distance ascending)."""
    torch.manual_seed(seed)
    enc = build("dynamic_bias", d_model=4 * 16, num_heads=num_heads, **config)
    pos = torch.arange(max_distance + 1)[None, :]  # (1, T)
    with torch.no_grad():
        bias = enc.score_bias(pos, pos)[0, :, -1, :]  # (H, T): keys 0..T-1 seen from query T-1
    return bias.flip(-1).double()  # index = distance i - j


def plot_dynamic_bias(out_dir: Path, num_heads: int = 4, train_len: int = 64, extend: int = 4, seed: int = 0) -> PlotResult:
    """Dynamic position bias per head at initialisation (Wang et al. 2021): an MLP of the
    distance, defined at every distance, on the raw distance and on its signed log."""
    far = extend * train_len
    lin = distance_bias(num_heads, far, seed, log_distance=False)
    log = distance_bias(num_heads, far, seed, log_distance=True)
    d = torch.arange(far + 1)
    plt, fig, (a0, a1) = figure(2)
    for ax, b, name in ((a0, lin, "x = i - j"), (a1, log, "x = sign(i - j) log(1 + |i - j|)")):
        for h in range(num_heads):
            ax.plot(d.numpy(), b[h].numpy(), color=f"C{h}", lw=1.2, label=f"head {h}")
        ax.axvline(train_len, color="k", ls="--", lw=1, label=f"a trained length L = {train_len}")
        ax.set_xlabel("distance i - j")
        ax.set_ylabel("bias added to the logit")
        ax.set_title(f"MLP input {name}", fontsize=10)
        ax.legend(loc="best", fontsize=8)
        ax.grid(alpha=0.3)
    return save(plt, fig, out_dir, "dynamic-bias", f"Dynamic position bias, {num_heads} heads, random init (seed {seed})",
                {"distance": d, "linear": lin, "log": log, "train_len": train_len, "seed": seed})
