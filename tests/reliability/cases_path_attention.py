"""path (PaTH attention): config values refused by name, and inputs its terms hook refuses."""

from __future__ import annotations

import torch

from posenc import build

from . import Case


def _path_score_without_layer_input() -> None:
    enc = build("path", d_model=8, num_heads=2)
    q, pos = torch.zeros(1, 2, 3, 4), torch.arange(3)[None]
    enc.score(q, q, pos, pos)


def _path_keys_without_their_products() -> None:
    from posenc import Attention
    from posenc.encoding import QKProjection

    enc = build("path", d_model=8, num_heads=2)
    q, k = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 5, 4)  # one query against 5 keys, no cache
    pos = torch.arange(5)[None]
    enc.terms(q, k, enc.prepare(pos[:, -1:], pos), QKProjection.of(Attention(8, 2), torch.zeros(1, 1, 8)))


A = "path"
CASES = [
    Case(A, "path w_rank=-1", r"^w_rank must be in \[0, 4096\], got -1$",
         run=lambda: build("path", d_model=8, num_heads=2, w_rank=-1)),
    Case(A, "path w_rank=10**6", r"^w_rank must be in \[0, 4096\], got 1000000$",
         run=lambda: build("path", d_model=8, num_heads=2, w_rank=10**6)),
    Case(A, "path conv_size=65", r"^conv_size must be in \[0, 64\], got 65$",
         run=lambda: build("path", d_model=8, num_heads=2, conv_size=65)),
    Case(A, "path conv_size='3' (a string)", r"^conv_size must be an int, got str '3'$", error=TypeError,
         run=lambda: build("path", d_model=8, num_heads=2, conv_size="3")),
    Case(A, "path conv_bias='no' (a string)", r"^conv_bias must be a bool", error=TypeError,
         run=lambda: build("path", d_model=8, num_heads=2, conv_bias="no")),
    Case(A, "path's dense score without the layer input its Householders read",
         r"path computes its Householders from the attention layer's input",
         run=_path_score_without_layer_input),
    Case(A, "path keys before the call's tokens without a KV cache's carried keys",
         r"path needs the Householders of all 5 keys",
         run=_path_keys_without_their_products),
]
