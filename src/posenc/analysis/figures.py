"""The table of figures that ``posenc plot``, ``posenc report`` and their tests walk.

Each figure is a plot function ``fn(out_dir, **options) -> PlotResult`` (drawn with
:mod:`.canvas`; its docstring's first sentence is its one-line description, the rest its
caption) and what it explains: registered encodings or RoPE scaling types, or
:data:`ANY_ENCODING` for a choice that applies to every encoding. The report keeps the figures
whose concerns are on its page (:func:`select_figures`).

Adding a figure is a module ``fig_<topic>.py`` with its plot function and one entry in
:data:`FIGURES`; ``tests/test_analysis_plots.py`` renders every entry and checks that each
concern is registered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from ..rotary import SCALINGS
from ..text import first_sentence, plain
from .canvas import PlotResult, prepare_out_dir
from .fig_cope import plot_cope_positions
from .fig_dropped_frequencies import plot_rope_dropped_frequencies
from .fig_dynamic_bias import plot_dynamic_bias
from .fig_fox import plot_fox_forgetting
from .fig_hybrids import plot_hybrid_layers
from .fig_mrope import plot_mrope_axes
from .fig_multimodal_ids import plot_multimodal_ids
from .fig_path import plot_path_householder
from .fig_fope import plot_fope_frequencies
from .fig_pope import plot_pope_polar
from .fig_randomized import plot_randomized_positions
from .fig_relative import plot_alibi, plot_deberta_buckets, plot_per_row_alibi, plot_sandwich, plot_t5_buckets
from .fig_rope import plot_rope_bands, plot_rope_decay, plot_rope_scaling, plot_rope_score
from .fig_rope_2d import plot_rope_2d
from .fig_sinusoidal import plot_sinusoidal_base, plot_sinusoidal_dot, plot_sinusoidal_heatmap, plot_sinusoidal_waves
from .fig_stick_breaking import plot_stick_breaking

__all__ = ["ANY_ENCODING", "FIGURES", "Figure", "make_plot", "select_figures"]

#: a concern meaning "every encoding" (randomized positions: the positions any encoding is given)
ANY_ENCODING = "*"


@dataclass(frozen=True)
class Figure:
    """A figure: the plot function that draws it and the encodings / scalings it explains."""

    fn: Callable[..., PlotResult]
    concerns: tuple[str, ...]

    @property
    def summary(self) -> str:
        """Its one-line description (the first sentence of the plot function's docstring)."""
        return first_sentence(self.fn.__doc__)

    @property
    def caption(self) -> str:
        """The plot function's whole docstring as one line of plain text."""
        return " ".join((plain(self.fn.__doc__) or "").split())

    @property
    def about(self) -> str:
        """What it explains, in words."""
        return ", ".join("every encoding" if c == ANY_ENCODING else c for c in self.concerns)


# kind -> figure. The order is that of `posenc plot all` and of the report: the textbook
# figures, then the newer families'.
FIGURES: dict[str, Figure] = {
    "sinusoidal-heatmap": Figure(plot_sinusoidal_heatmap, ("sinusoidal",)),
    "sinusoidal-waves": Figure(plot_sinusoidal_waves, ("sinusoidal",)),
    "sinusoidal-base": Figure(plot_sinusoidal_base, ("sinusoidal",)),
    "sinusoidal-dot": Figure(plot_sinusoidal_dot, ("sinusoidal",)),
    "rope-decay": Figure(plot_rope_decay, ("rope",)),
    "rope-score": Figure(plot_rope_score, ("rope",)),
    "rope-bands": Figure(plot_rope_bands, ("rope",)),
    "rope-scaling": Figure(plot_rope_scaling, ("rope", *SCALINGS)),  # every registered scaling type is drawn
    "t5-buckets": Figure(plot_t5_buckets, ("t5",)),
    "alibi": Figure(plot_alibi, ("alibi",)),
    "deberta-buckets": Figure(plot_deberta_buckets, ("deberta",)),
    "rope-dropped-frequencies": Figure(plot_rope_dropped_frequencies, ("proportional", "hope")),
    "pope-polar": Figure(plot_pope_polar, ("pope",)),
    "fope-frequencies": Figure(plot_fope_frequencies, ("fope",)),
    "cope-positions": Figure(plot_cope_positions, ("cope",)),
    "dynamic-bias": Figure(plot_dynamic_bias, ("dynamic_bias",)),
    "randomized-positions": Figure(plot_randomized_positions, (ANY_ENCODING,)),
    "hybrid-layers": Figure(plot_hybrid_layers, ("nope_temperature", "none")),
    "mrope-axes": Figure(plot_mrope_axes, ("mrope",)),
    "multimodal-ids": Figure(plot_multimodal_ids, ("mrope", "xdrope")),
    "rope-2d": Figure(plot_rope_2d, ("rope_axial", "rope_mixed", "rope_dinov3")),
    "fox-forgetting": Figure(plot_fox_forgetting, ("fox",)),
    "stick-breaking": Figure(plot_stick_breaking, ("stick_breaking",)),
    "path-householder": Figure(plot_path_householder, ("path",)),
    "sandwich": Figure(plot_sandwich, ("sandwich",)),
    "per-row-alibi": Figure(plot_per_row_alibi, ("per_row_alibi",)),
}


def make_plot(kind: str, out_dir: str | os.PathLike, **options: Any) -> PlotResult:
    """Draw figure ``kind`` into ``out_dir``; an unknown kind lists the valid ones."""
    if kind not in FIGURES:
        raise ValueError(f"unknown plot kind {kind!r}; valid kinds: {', '.join(FIGURES)}")
    return FIGURES[kind].fn(prepare_out_dir(out_dir), **options)


def select_figures(kinds: list[str], in_hand: set[str], *, any_encoding: bool = True) -> list[str]:
    """The kinds whose figure concerns something in hand, in the order given; with
    ``any_encoding``, also those about every encoding whenever something is in hand."""
    return [k for k in kinds
            if (set(FIGURES[k].concerns) & in_hand) or (any_encoding and ANY_ENCODING in FIGURES[k].concerns and in_hand)]
