"""The figures of the encodings added since 2024, one module each (``fig_<family>.py``), in one
table that ``posenc plot`` and ``posenc report`` walk.

Adding a figure is a module with a plot function ``fn(out_dir, **options) -> PlotResult``
(drawn with :mod:`.canvas`; its docstring's first sentence is its one-line description) and one
entry here: the kind, the function, and what it concerns — registered encodings or RoPE scaling
types, or :data:`ANY_ENCODING` for a choice that applies to every encoding — so the report shows
it where those are in hand. ``tests/test_analysis_plots.py`` renders
every entry and checks that each concern is registered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .canvas import PlotResult
from .fig_cope import plot_cope_positions
from .fig_dropped_frequencies import plot_rope_dropped_frequencies
from .fig_dynamic_bias import plot_dynamic_bias
from .fig_fox import plot_fox_forgetting
from .fig_hybrids import plot_hybrid_layers
from .fig_mrope import plot_mrope_axes
from .fig_pope import plot_pope_polar
from .fig_randomized import plot_randomized_positions
from .fig_rope_2d import plot_rope_2d

__all__ = ["ANY_ENCODING", "FAMILY_FIGURES", "FamilyFigure"]

#: a concern meaning "every encoding" (randomized positions: the positions any encoding is given)
ANY_ENCODING = "*"


@dataclass(frozen=True)
class FamilyFigure:
    """A family's figure: the plot function and the encodings / scalings it explains."""

    fn: Callable[..., PlotResult]
    concerns: tuple[str, ...]


# kind -> figure, in the order of `posenc plot all` (after the textbook kinds) and of the report.
FAMILY_FIGURES: dict[str, FamilyFigure] = {
    "rope-dropped-frequencies": FamilyFigure(plot_rope_dropped_frequencies, ("proportional", "hope")),
    "pope-polar": FamilyFigure(plot_pope_polar, ("pope",)),
    "cope-positions": FamilyFigure(plot_cope_positions, ("cope",)),
    "dynamic-bias": FamilyFigure(plot_dynamic_bias, ("dynamic_bias",)),
    "randomized-positions": FamilyFigure(plot_randomized_positions, (ANY_ENCODING,)),
    "hybrid-layers": FamilyFigure(plot_hybrid_layers, ("nope_temperature", "none")),
    "mrope-axes": FamilyFigure(plot_mrope_axes, ("mrope",)),
    "rope-2d": FamilyFigure(plot_rope_2d, ("rope_axial", "rope_mixed")),
    "fox-forgetting": FamilyFigure(plot_fox_forgetting, ("fox",)),
}
