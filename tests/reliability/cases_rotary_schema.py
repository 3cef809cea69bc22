"""Rotary schema (issue 11/13): one entry per RoPE scaling, to_hf, layouts spelled once."""

from __future__ import annotations

import posenc
from posenc.rotary import SCALINGS, RotaryConfig, from_hf, rope_frequencies, to_hf
from posenc.rotary.scaling import register_scaling

from . import Case


def _rope(**kw):
    return posenc.build("rope", d_model=32, num_heads=2, **kw)


def _ntk_to_hf() -> str:
    hf = to_hf(_rope(scaling="ntk", factor=4.0))["rope_parameters"]
    return f"written as rope_type={hf['rope_type']!r}, rope_theta={hf['rope_theta']:.6g} (= 10000 * 4^(16/14))"


def _failed_set_scaling() -> str:
    rope = posenc.build("rope", d_model=8, num_heads=1, rotary_dim=2, scaling="linear", factor=2.0)
    try:
        rope.set_scaling("ntk", factor=2.0)
    except ValueError as e:
        return f"ValueError ({e}); the module keeps scaling={rope.config.scaling!r}"
    raise AssertionError("set_scaling('ntk') at rotary_dim 2 did not raise")


MB = {"model_type": "modernbert", "hidden_size": 128, "num_attention_heads": 2}

A = "rotary schema"
CASES = [
    Case(A, "build('rope', scaling='default', factor=2) (a parameter of another rope type)",
         r"^factor not a parameter of rope type 'default' \(it takes: nothing\)$",
         run=lambda: _rope(scaling="default", factor=2.0)),
    Case(A, "build('rope', scaling='linear', factor=2, beta_fast=4) (a yarn parameter)",
         r"^beta_fast not a parameter of rope type 'linear' \(it takes: factor\)$",
         run=lambda: _rope(scaling="linear", factor=2.0, beta_fast=4.0)),
    Case(A, "RotaryConfig(fctor=2) (a misspelt parameter)", r"^RotaryConfig got unknown parameter\(s\) 'fctor'; valid: base, ",
         run=lambda: RotaryConfig(fctor=2.0), error=TypeError),
    Case(A, "rope_frequencies('yarn2', ...) (an unknown rope type)", r"^scaling must be one of 'default', .*got 'yarn2'$",
         run=lambda: rope_frequencies("yarn2", 8, 1e4)),
    Case(A, "set_scaling that only the rotary dim can refuse (ntk at rotary_dim 2)",
         r"NTK scaling needs rotary_dim >= 4.*keeps scaling='linear'",
         run=_failed_set_scaling, error=None),
    Case(A, "register_scaling of a name already registered", r"^rope type 'yarn' is already registered$",
         run=lambda: register_scaling(SCALINGS["yarn"])),
    Case(A, "sinusoidal layout='halves' (the old spelling)",
         r"^layout must be one of 'interleaved', 'half'; got 'halves' \(spelled 'half' now\)$",
         run=lambda: posenc.build("sinusoidal", d_model=8, num_heads=2, layout="halves")),
    Case(A, "rope layout='halves' (sinusoidal's old spelling)",
         r"^layout must be one of 'half', 'interleaved'; got 'halves' \(spelled 'half' now\)$",
         run=lambda: _rope(layout="halves")),
    Case(A, "to_hf of an interleaved RoPE (Llama-style configs have no key for it)",
         r"^layout must be 'half' to write transformers rope_parameters .*got 'interleaved'.*convert_qk_layout",
         run=lambda: to_hf(_rope(layout="interleaved"))),
    Case(A, "to_hf of xPos", r"^rope must be a RotaryEmbedding \('rope'; transformers has no xPos\), got XPos$",
         run=lambda: to_hf(posenc.build("xpos", d_model=32, num_heads=2)), error=TypeError),
    Case(A, "to_hf of static NTK (transformers has no such type)", r"written as rope_type='default', rope_theta=",
         run=_ntk_to_hf, error=None),
    Case(A, "from_hf: ModernBERT config without layer_type (per-layer-type rope)",
         r"per layer type: pass layer_type= one of 'full_attention', 'sliding_attention'$",
         run=lambda: from_hf(MB)),
    Case(A, "from_hf: ModernBERT with Gemma 3's rope_local_base_freq",
         r"'rope_local_base_freq' not read for model_type 'modernbert'",
         run=lambda: from_hf(MB | {"rope_local_base_freq": 1e4}, layer_type="full_attention")),
]
