"""Randomized positions' figure (Ruoss et al. 2023): what positions a training batch gets.

Each training sequence of n tokens takes a sorted random sample of n distinct positions from
[0, L) instead of 0..n-1, so every position up to L - 1 is seen in training. The positions are
:func:`posenc.absolute.randomized.randomized_positions` of plain ones.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..absolute.randomized import randomized_positions
from ..positions import SequenceInfo
from .canvas import PlotResult, figure, save

__all__ = ["plot_randomized_positions", "sampled_positions"]


def sampled_positions(rows: int, length: int, max_length: int, seed: int) -> torch.Tensor:
    """(rows, length) randomized positions of ``rows`` plain sequences of ``length`` tokens."""
    seq = SequenceInfo.from_offset(rows, length)
    g = torch.Generator().manual_seed(seed)
    return randomized_positions(seq, max_length, generator=g).positions


def plot_randomized_positions(out_dir: Path, length: int = 16, max_length: int = 128, rows: int = 6,
                              draws: int = 2000, seed: int = 0) -> PlotResult:
    """Randomized positions (Ruoss et al. 2023): a sorted sample of n positions from [0, L) per
    training sequence, so training covers every position up to L - 1."""
    shown = sampled_positions(rows, length, max_length, seed)
    many = sampled_positions(draws, length, max_length, seed + 1)
    counts = torch.bincount(many.flatten(), minlength=max_length)
    plt, fig, (a0, a1) = figure(2)
    for r in range(rows):
        a0.plot(shown[r].numpy(), [r] * length, "o", ms=3, color="C0")
    a0.plot(range(length), [-1] * length, "o", ms=3, color="C3")
    a0.set_yticks(range(-1, rows), ["plain 0..n-1"] + [f"sequence {r}" for r in range(rows)], fontsize=8)
    a0.axvline(length - 0.5, color="C3", ls=":", lw=1, label=f"n = {length}")
    a0.axvline(max_length - 0.5, color="k", ls="--", lw=1, label=f"L = {max_length}")
    a0.set_xlabel("position id")
    a0.set_title(f"positions of {rows} training sequences of n = {length}", fontsize=10)
    a0.legend(loc="lower right", fontsize=8)
    a1.bar(range(max_length), counts.numpy(), width=1.0, color="C0", label="randomized")
    a1.axhline(draws * length / max_length, color="k", ls="--", lw=1, label=f"uniform: {draws} x n / L")
    a1.bar(range(length), [draws] * length, width=1.0, color="C3", alpha=0.3, label="plain: positions < n only")
    a1.set_xlabel("position id")
    a1.set_ylabel(f"times seen in {draws} sequences")
    a1.set_title("coverage of [0, L)", fontsize=10)
    a1.legend(loc="upper right", fontsize=8)
    return save(plt, fig, out_dir, "randomized-positions",
                f"Randomized positions: n = {length} tokens placed in [0, {max_length})",
                {"positions": shown, "counts": counts, "draws": draws, "length": length, "max_length": max_length})
