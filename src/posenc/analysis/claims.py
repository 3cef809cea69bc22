"""What the literature claims about each encoding, property by property.

``posenc check`` measures whether an encoding has a property; this table says what its paper
(or the paper that analysed it) expects, so each cell of the check table reads as "measured X,
the literature expects Y: agrees / differs", not as a grade of the encoding. ALiBi has no
absolute position by design; a table that says so in red would mislead.

Each entry is ``(expected, source)``: ``True`` the property is claimed, ``False`` its absence is
claimed or follows from the construction the paper gives, :data:`UNTRAINED` the property depends
on learned weights that the probe only has at random initialisation (no claim at init), and a
missing check means no claim. Sources are short citations; the check docstrings give the
equations.

Every encoding posenc registers has an entry (a test asserts it). An encoding registered from
outside the package (a plugin, a user's module) has none by default: each of its measured cells
reads "no claim".
"""

from __future__ import annotations

__all__ = ["UNTRAINED", "EXPECTED", "expected_for", "verdict"]

UNTRAINED = "untrained"

_VASWANI = "Vaswani et al. 2017, §3.5"
_SU = "Su et al. 2021 (RoFormer)"
_SU_LINEAR = "Su et al. 2021, §3.3: additive relative terms do not factor through per-token features"
_PRESS = "Press et al. 2022 (ALiBi)"
_WANG = "Wang et al. 2020: position-free offset transformation, boundedness"
_RELATIVE = "a function of i - j by construction"
_TABLE_END = "a table of max_len rows (Press et al. 2022: learned tables stop at their length)"
_NO_ABS = "sees only i - j: no absolute position by construction"
_LEARNED = "learned weights; the probe has them at random init"
_QWEN2VL = "Wang et al. 2024 (Qwen2-VL, M-RoPE)"
_HEO = "Heo et al. 2024 (RoPE for ViT)"
_RASTER = ": q·k depends on (Δy, Δx); the probe's 1-D positions are raster patches, and i - j does not fix (Δy, Δx)"

_HUANG = {
    "absolute": (False, _NO_ABS),
    "relative": (True, "Huang et al. 2020: " + _RELATIVE),
    "bounded": (True, "distances clipped (Huang et al. 2020)"),
    "decay": (UNTRAINED, _LEARNED),
    "extrapolation": (True, "clipping makes every distance valid"),
    "linear_attention": (False, _SU_LINEAR),
}

# encoding -> check -> (expected, source). Checks: absolute, relative, linear_map, bounded,
# decay, extrapolation, linear_attention (cost is a measurement with no claim).
EXPECTED: dict[str, dict[str, tuple[bool | str, str]]] = {
    "none": {
        "absolute": (False, "Kazemnejad et al. 2023: NoPE has no explicit position"),
        "extrapolation": (True, "no position table to run out of"),
        "linear_attention": (True, "nothing positional in the logits"),
    },
    "nope_temperature": {
        "absolute": (False, "Meta 2025 (Llama 4): NoPE; the query factor is 1 below floor_scale (8192 positions)"),
        "extrapolation": (True, "no position table; the factor grows as log(p / floor_scale) for long contexts"),
        "linear_attention": (True, "a per-query factor: it factors through the query's features"),
    },
    "learned": {
        "absolute": (True, "Devlin et al. 2019 / Radford et al. 2019: one vector per position"),
        "relative": (UNTRAINED, _LEARNED),
        "linear_map": (UNTRAINED, _LEARNED),
        "decay": (UNTRAINED, "Wang & Chen 2020 find decay only after training"),
        "extrapolation": (False, _TABLE_END),
        "linear_attention": (True, "positions enter the embeddings only"),
    },
    "sinusoidal": {
        "absolute": (True, "Vaswani et al. 2017: a unique code per position"),
        "relative": (True, "PE(i)·PE(j) = sum cos((i - j) w): " + _VASWANI),
        "linear_map": (True, _VASWANI),
        "bounded": (True, "sin, cos in [-1, 1]"),
        "decay": (True, "Yan et al. 2019 (TENER): PE(i)·PE(j) decreases with |i - j|"),
        "extrapolation": (True, "defined at every position"),
        "linear_attention": (True, "positions enter the embeddings only"),
    },
    "multiplicative": {
        "absolute": (True, "one learned vector per position"),
        "relative": (UNTRAINED, _LEARNED),
        "linear_map": (UNTRAINED, _LEARNED),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (False, _TABLE_END),
        "linear_attention": (True, "positions enter the embeddings only"),
    },
    "complex_order": {
        "absolute": (True, "Wang et al. 2020: r e^{i(w p + theta)} per position"),
        "linear_map": (True, _WANG),
        "bounded": (True, _WANG),
        "extrapolation": (True, "defined at every position"),
        "linear_attention": (True, "positions enter the embeddings only"),
    },
    "convolutional": {
        "absolute": (False, "Islam et al. 2020: zero padding leaks position only near the boundary"),
        "extrapolation": (True, "a convolution runs at any length"),
        "linear_attention": (True, "positions enter the embeddings only"),
    },
    "recurrent": {
        "absolute": (UNTRAINED, _LEARNED),
        "relative": (UNTRAINED, _LEARNED),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, "a recurrence runs at any length"),
        "linear_attention": (True, "positions enter the embeddings only"),
    },
    "floater": {
        "absolute": (UNTRAINED, _LEARNED),
        "relative": (UNTRAINED, _LEARNED),
        "bounded": (UNTRAINED, _LEARNED),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, "Liu et al. 2020: the ODE is defined at any position (posenc caps it at max_position, 8192 by default, to bound the integration)"),
        "linear_attention": (True, "positions enter the embeddings only"),
    },
    "shaw": {
        "absolute": (False, _NO_ABS),
        "relative": (True, "Shaw et al. 2018: " + _RELATIVE),
        "bounded": (True, "distances clipped to [-k, k] (Shaw et al. 2018)"),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, "clipping makes every distance valid (Shaw et al. 2018)"),
        "linear_attention": (False, _SU_LINEAR),
    },
    "relative_key": _HUANG,
    "relative_key_query": _HUANG,  # the same claims: Huang et al. 2020 define both variants
    "transformer_xl": {
        "absolute": (False, _NO_ABS),
        "relative": (True, "Dai et al. 2019: " + _RELATIVE),
        "bounded": (True, "sinusoids of i - j (Dai et al. 2019)"),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, "Dai et al. 2019: generalizes to longer attention at evaluation"),
        "linear_attention": (False, _SU_LINEAR),
    },
    "deberta": {
        "absolute": (False, _NO_ABS + " (DeBERTa adds absolute positions in its decoder, not here)"),
        "relative": (True, "He et al. 2021: " + _RELATIVE),
        "bounded": (True, "log buckets up to max_relative_positions (He et al. 2021)"),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, "bucketing makes every distance valid"),
        "linear_attention": (False, _SU_LINEAR),
    },
    "t5": {
        "absolute": (False, _NO_ABS),
        "relative": (True, "Raffel et al. 2020: " + _RELATIVE),
        "bounded": (True, "one learned scalar per bucket (Raffel et al. 2020)"),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, "distances beyond max_distance share the last bucket"),
        "linear_attention": (False, _SU_LINEAR),
    },
    "alibi": {
        "absolute": (False, _NO_ABS),
        "relative": (True, _PRESS + ": -m |i - j|"),
        "bounded": (False, _PRESS + ": the penalty grows linearly by design"),
        "decay": (True, _PRESS + ": linear penalty without end"),
        "extrapolation": (True, _PRESS),
        "linear_attention": (False, _SU_LINEAR),
    },
    "kerple": {
        "absolute": (False, _NO_ABS),
        "relative": (True, "Chi et al. 2022: a kernel of i - j"),
        "bounded": (False, "Chi et al. 2022: -r1 log(1 + r2 |i - j|) grows without end"),
        "decay": (True, "Chi et al. 2022: conditionally positive definite kernels decay"),
        "extrapolation": (True, "Chi et al. 2022"),
        "linear_attention": (False, _SU_LINEAR),
    },
    "fire": {
        "absolute": (False, "Li et al. 2023: f(psi(i - j) / psi(max(i, L))): i enters only beyond L"),
        "relative": (True, "Li et al. 2023: relative within the threshold L"),
        "bounded": (True, "an MLP of a normalised distance in [0, 1] (Li et al. 2023)"),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, "Li et al. 2023: progressive interpolation"),
        "linear_attention": (False, _SU_LINEAR),
    },
    "dynamic_bias": {
        "absolute": (False, _NO_ABS),
        "relative": (True, "Wang et al. 2021 (CrossFormer): an MLP of i - j"),
        "bounded": (UNTRAINED, _LEARNED),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, "continuous in the distance: defined at every distance (Wang et al. 2021)"),
        "linear_attention": (False, _SU_LINEAR),
    },
    "cope": {
        "absolute": (False, "Golovneva et al. 2024: a count of gated keys between j and i, no absolute position"),
        "relative": (UNTRAINED, "Golovneva et al. 2024: the count depends on learned gates and embeddings"),
        "bounded": (True, "positions clamped to max_pos - 1 of a finite table (Golovneva et al. 2024)"),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, "the clamp makes every count valid"),
        "linear_attention": (False, _SU_LINEAR),
    },
    "fox": {
        "absolute": (False, "Lin et al. 2025: no position ids; the logit gains the log forget gates between j and i"),
        "relative": (True, "Lin et al. 2025: sum_{l=j+1}^{i} log f_l; for identical tokens a function of i - j"),
        "bounded": (False, "Lin et al. 2025: the bias is non-positive and data dependent, and every gate below 1 "
                           "between j and i adds to it (ALiBi's linear penalty for a constant gate)"),
        "decay": (True, "Lin et al. 2025: log f_l < 0, so keys further back are forgotten more"),
        "extrapolation": (True, "Lin et al. 2025: no position ids, defined at every length"),
        "linear_attention": (False, "Lin et al. 2025: a forget gate on softmax logits; its linear-attention "
                                    "counterpart is a gated recurrence (GLA, Mamba-2), not a feature map"),
    },
    "rope": {
        "absolute": (True, _SU + ": encodes absolute position with a rotation"),
        "relative": (True, _SU + ", eq. 16"),
        "linear_map": (True, _SU + ": R_{p+k} = R_k R_p"),
        "bounded": (True, _SU + ": rotations preserve norms"),
        "decay": (True, _SU + ", §3.4.3"),
        "extrapolation": (True, "defined at every position (quality beyond L is the bench's question)"),
        "linear_attention": (True, _SU + ", §3.3"),
    },
    "xpos": {
        "absolute": (True, "Sun et al. 2023: a scaled rotation per position"),
        "relative": (True, "Sun et al. 2023: zeta^(i - j) R_{i-j}"),
        "linear_map": (True, "Sun et al. 2023: zeta^k R_k"),
        "bounded": (False, "Sun et al. 2023: keys scale by zeta^(-n) by design"),
        "decay": (True, "Sun et al. 2023: the scale adds decay to RoPE's"),
        "extrapolation": (True, "Sun et al. 2023"),
        "linear_attention": (True, "per-token features, as RoPE"),
    },
    "mrope": {
        "absolute": (True, _QWEN2VL + ": RoPE's rotation per position on text"),
        "relative": (True, _QWEN2VL + ": equal axes on text give RoPE, eq. 16 of " + _SU),
        "linear_map": (True, _SU + ": R_{p+k} = R_k R_p, per axis"),
        "bounded": (True, "rotations preserve norms"),
        "decay": (True, "RoPE on text: " + _SU + ", §3.4.3"),
        "extrapolation": (True, _QWEN2VL + ": defined at every position"),
        "linear_attention": (True, "per-token features, as RoPE"),
    },
    "rope_axial": {
        "absolute": (True, _HEO + ": a rotation per patch (y, x)"),
        "relative": (False, _HEO + _RASTER),
        "linear_map": (False, "raster positions: p -> p + k moves (y, x) by a step that depends on p's column"),
        "bounded": (True, "rotations preserve norms"),
        "extrapolation": (True, _HEO + ": defined at every patch, extrapolates to larger images"),
        "linear_attention": (True, "per-token features, as RoPE"),
    },
    "rope_mixed": {
        "absolute": (True, _HEO + ": a rotation per patch (y, x) by learned frequencies"),
        "relative": (False, _HEO + _RASTER),
        "linear_map": (False, "raster positions: p -> p + k moves (y, x) by a step that depends on p's column"),
        "bounded": (True, "rotations preserve norms"),
        "decay": (UNTRAINED, _LEARNED),
        "extrapolation": (True, _HEO + ": defined at every patch, extrapolates to larger images"),
        "linear_attention": (True, "per-token features, as RoPE"),
    },
    "pope": {
        "absolute": (True, "Gopalakrishnan et al. 2025: a phase m theta_c per position"),
        "relative": (True, "Gopalakrishnan et al. 2025: the logit is a function of m - n"),
        "linear_map": (True, "a rotation per channel by k theta_c, as RoPE's"),
        "bounded": (True, "phases rotate, magnitudes come from content only"),
        "extrapolation": (True, "Gopalakrishnan et al. 2025: defined at every position"),
        "linear_attention": (True, "per-token features, as RoPE"),
    },
}


def expected_for(encoding: str, check: str) -> tuple[bool | str | None, str]:
    """``(expected, source)`` for a registered encoding's check; ``(None, "")`` when no claim
    (a check without an entry, or an encoding registered outside posenc)."""
    return EXPECTED.get(encoding, {}).get(check, (None, ""))


def verdict(measured: str, expected: bool | str | None) -> str:
    """Compare a measured status ("yes" / "no" / "n/a" / "error") with the expectation.

    Returns "agrees", "differs", "untrained" (learned weights at init: no claim), "no claim",
    or the measured status itself when nothing was measured ("n/a", "error").
    """
    if measured not in ("yes", "no"):
        return measured
    if expected == UNTRAINED:
        return UNTRAINED
    if expected is None:
        return "no claim"
    return "agrees" if (measured == "yes") == expected else "differs"
