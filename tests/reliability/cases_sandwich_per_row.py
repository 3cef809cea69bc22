"""sandwich and per_row_alibi: config values refused by name, and inputs per_row_alibi (and the
fused function, for its stick term) refuses."""

from __future__ import annotations

import torch

from posenc import build

from . import Case


def _per_row_score_without_layer_input() -> None:
    enc = build("per_row_alibi", d_model=8, num_heads=2)
    q, pos = torch.zeros(1, 2, 3, 4), torch.arange(3)[None]
    enc.score(q, q, pos, pos)


def _per_row_keys_without_their_gate_keys() -> None:
    from posenc import Attention
    from posenc.encoding import QKProjection

    enc = build("per_row_alibi", d_model=8, num_heads=2)
    q, k = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 5, 4)  # one query against 5 keys, no cache
    enc.terms(q, k, None, QKProjection.of(Attention(8, 2), torch.zeros(1, 1, 8)))


def _fused_gates_of_another_width() -> None:
    from posenc.backends.fused import fused_attention
    from posenc.relative.per_row_alibi import per_row_term

    q = torch.zeros(1, 2, 4, 4)
    fused_attention(q, q, q, scale=1.0, sticks=[per_row_term(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 6))])


A = "sandwich, per_row_alibi"
CASES = [
    Case(A, "sandwich dim=3 (sinusoids come in pairs)", r"^dim must be even \(d'/2 sinusoid pairs\), got 3$",
         run=lambda: build("sandwich", d_model=8, num_heads=2, dim=3)),
    Case(A, "sandwich dim=10**6", r"^dim must be in \[2, 4096\], got 1000000$",
         run=lambda: build("sandwich", d_model=8, num_heads=2, dim=10**6)),
    Case(A, "sandwich with an odd head_dim and no dim",
         r"^dim must be even: sandwich takes d' from head_dim, which is odd \(3\)",
         run=lambda: build("sandwich", d_model=6, num_heads=2)),
    Case(A, "per_row_alibi dim_head=0", r"^dim_head must be in \[1, 1024\], got 0$",
         run=lambda: build("per_row_alibi", d_model=8, num_heads=2, dim_head=0)),
    Case(A, "per_row_alibi post_log_scale=-1", r"^post_log_scale must be in \[0.0, 100.0\], got -1.0$",
         run=lambda: build("per_row_alibi", d_model=8, num_heads=2, post_log_scale=-1.0)),
    Case(A, "per_row_alibi's dense score without the layer input its gates read",
         r"per_row_alibi computes its forget gates from the attention layer's input",
         run=_per_row_score_without_layer_input),
    Case(A, "per_row_alibi keys before the call's tokens without a KV cache's gate keys",
         r"per_row_alibi needs the gate keys of all 5 keys",
         run=_per_row_keys_without_their_gate_keys),
    Case(A, "fused_attention with per_row_alibi's stick term, gate keys narrower than its gate queries",
         r"^a stick term's gates must be float \(B=1, H=2, Tq=4, d\) and \(B=1, H=2, Tk=4, d\)",
         run=_fused_gates_of_another_width),
]
