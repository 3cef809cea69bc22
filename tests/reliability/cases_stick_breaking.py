"""stick_breaking: config values refused by name, the fused function's stick-breaking inputs it
refuses, and what a query with no key before it gets."""

from __future__ import annotations

import torch

from posenc import build
from posenc.terms import StickRule

from . import Case


def _fused(**kw) -> None:
    from posenc.backends.fused import fused_attention

    q = torch.zeros(1, 1, 2, 2)
    fused_attention(q, q, q, scale=1.0, **kw)


def _first_token() -> str:
    """attend_current=False: the first token's stick has no key to break it, so its output is 0."""
    from posenc import Attention, SequenceInfo

    torch.manual_seed(0)
    attn = Attention(8, 2, pe=build("stick_breaking", d_model=8, num_heads=2), causal=True)
    out = attn(torch.randn(1, 4, 8), SequenceInfo.from_offset(1, 4))
    first, others = bool((out[0, 0] == 0).all()), bool((out[0, 1:] != 0).any())
    return f"first token's output all zero: {first}; the others not: {others}"


A = "stick_breaking"
CASES = [
    Case(A, "stick_breaking attend_current='yes'", r"^attend_current must be a bool, got str 'yes'$",
         run=lambda: build("stick_breaking", d_model=8, num_heads=2, attend_current="yes"), error=TypeError),
    Case(A, "stick_breaking remainder='self' (the rest of the stick is dropped; no such option)",
         r"^unknown config key 'remainder' for encoding 'stick_breaking'; valid keys: attend_current$",
         run=lambda: build("stick_breaking", d_model=8, num_heads=2, remainder="self"), error=TypeError),
    Case(A, "fused_attention with sticks and a softmax (normalize=True)",
         r"^sticks need normalize=False: stick-breaking's logits are its log weights",
         run=lambda: _fused(sticks=[False])),
    Case(A, "fused_attention sticks=[1] (not a bool attend_current)", r"^sticks must hold bools",
         run=lambda: _fused(sticks=[1], normalize=False), error=TypeError),
    Case(A, "StickRule power=inf (a stick term's factor on its log keeps)",
         r"^StickRule.power must be a finite float, got inf$",
         run=lambda: StickRule(power=float("inf"))),
    Case(A, "StickRule negate=1 (not a bool)", r"^StickRule.negate must be a bool, got 1$",
         run=lambda: StickRule(negate=1), error=TypeError),
    Case(A, "fused_attention normalize='no'", r"^normalize must be a bool, got str 'no'$",
         run=lambda: _fused(normalize="no"), error=TypeError),
    Case(A, "stick_breaking's first token (no key before it to take a share)",
         r"^first token's output all zero: True; the others not: True$", run=_first_token, error=None),
]
