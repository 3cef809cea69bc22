"""What every figure of ``posenc plot`` and ``posenc report`` shares: the output folder, the
fixed canvas, the result holding a figure's data, and legend labels for curves that coincide.

A plot function draws one PNG of :data:`FIGSIZE` at :data:`DPI` (so every figure has the same
known size in pixels) and returns a :class:`PlotResult` with the data it drew, so tests check
numbers, not pixels.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["DPI", "FIGSIZE", "PlotResult", "coincident_groups", "figure", "prepare_out_dir", "save"]

FIGSIZE = (10.0, 5.0)  # inches; with DPI every PNG is 1000 x 500 pixels
DPI = 100


@dataclass
class PlotResult:
    """A written figure: ``kind``, ``path`` of the PNG, ``title`` and the ``data`` it shows."""

    kind: str
    path: Path
    title: str
    data: dict[str, Any] = field(default_factory=dict)


def prepare_out_dir(out: str | os.PathLike) -> Path:
    """Create ``out`` if needed and make sure a file can be written there (clear ValueError if not)."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {str(path)!r} cannot be created as a directory: {e.strerror or e}") from None
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".posenc-write-test-"):
            pass
    except OSError as e:
        raise ValueError(f"--out {str(path)!r} is not writable: {e.strerror or e}") from None
    return path


def figure(ncols: int = 1):
    """(pyplot, figure, axes): one row of ``ncols`` panels on the fixed canvas (Agg backend)."""
    from .._optional import require

    matplotlib = require("matplotlib", extra="plot")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=FIGSIZE, dpi=DPI, squeeze=False)
    return plt, fig, list(axes[0])


def save(plt, fig, out_dir: Path, kind: str, title: str, data: dict) -> PlotResult:
    """Title, lay out (nothing overlaps or is clipped) and write ``out_dir/<kind>.png``."""
    fig.suptitle(title)
    fig.tight_layout()
    path = out_dir / f"{kind}.png"
    fig.savefig(path, dpi=DPI)  # no bbox_inches="tight": every PNG has the same known size
    plt.close(fig)
    return PlotResult(kind, path, title, data)


def coincident_groups(curves: dict[str, Tensor], rtol: float = 1e-6) -> list[list[str]]:
    """The curves grouped by equality (within ``rtol`` of the largest magnitude among them),
    in first-seen order: a figure draws one line per group and names every member, since a
    curve hidden under another reads as missing."""
    groups: list[list[str]] = []
    for name, y in curves.items():
        for g in groups:
            ref = curves[g[0]]
            if ref.shape == y.shape:
                scale = max(float(ref.abs().max()), float(y.abs().max()), 1e-300)
                if bool(torch.all((ref.double() - y.double()).abs() <= rtol * scale)):
                    g.append(name)
                    break
        else:
            groups.append([name])
    return groups
