"""``posenc probe MODEL_DIR``: a real checkpoint's attention score against relative distance.

The experiment of Liu et al. 2023 ("Scaling Laws of RoPE-based Extrapolation", Fig. 1) and
of the RoPE-base discussions around Llama 2 / 3 (see docs/hf.md): take the real q and k of
a layer, re-rotate them at every distance d (also past the trained length L), and read the
logit against d. Three steps, one module each:

1. :mod:`.capture`: the checkpoint reads a text once; hooks take the pre-rotation q and k of
   the chosen layers (Llama, Mistral, Qwen 2/3, Gemma, Phi-3, GPT-NeoX, GPT-J).
2. :mod:`.curves`: s_h(d) = scale * qbar_h . R(d) kbar_g(h) with posenc's RoPE from
   :func:`posenc.rotary.from_hf`, split into its high- and low-frequency halves, and the same
   curve with the base raised (x16 by default) and with each training-free scaling of the
   registry set for ``extend * L`` by its own rule (:meth:`posenc.rotary.Scaling.at_factor`).
   :mod:`.verdicts`: the claims "the score rises again past L", "a raised base brings the
   decay back", "the low-frequency half keeps the decay", each measured on window means of the
   curve at every distance and answered holds / does not hold with its numbers.
3. :mod:`.render`: the figures and the ``posenc report --model`` HTML section.

:mod:`.run` holds the settings and the command. Outputs in ``--out``: ``probe.json`` (every
curve's data, the verdicts), ``probe_layer<L>.png`` and, for several layers (by default the
first of each layer type: Gemma 3's sliding and global layers), ``probe_layers.png``.
"""

from .capture import QKTaps, capture_qk, layer_taps, probe_text_ids
from .curves import distances, frequency_halves, probe_scalings, score_curves, variant_ropes
from .render import curve_label, html_section, plot_layer, plot_layers
from .run import (PROBE_FORMAT, ProbeResult, ProbeSettings, default_layers, layer_rope, layer_trained_distance, probe,
                  report_section, summary_lines)
from .verdicts import (CLAIMS, LOW_SHARE, RISE_SHARE, dense_curve, dense_curves, judge, verdict_line, window_grid,
                       window_means)

__all__ = [
    "CLAIMS",
    "LOW_SHARE",
    "PROBE_FORMAT",
    "RISE_SHARE",
    "ProbeResult",
    "ProbeSettings",
    "QKTaps",
    "capture_qk",
    "curve_label",
    "default_layers",
    "dense_curve",
    "dense_curves",
    "distances",
    "frequency_halves",
    "html_section",
    "judge",
    "layer_rope",
    "layer_trained_distance",
    "layer_taps",
    "plot_layer",
    "plot_layers",
    "probe",
    "probe_scalings",
    "probe_text_ids",
    "report_section",
    "score_curves",
    "summary_lines",
    "variant_ropes",
    "verdict_line",
    "window_grid",
    "window_means",
]
