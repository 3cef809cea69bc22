"""The clipped RoPE scaling (CoPE) and FoPE: config values refused by name, and inputs they refuse."""

from __future__ import annotations

import torch

from posenc import build

from . import Case


def _clipped(**kw):
    return build("rope", d_model=32, num_heads=2, scaling="clipped", **kw)


def _fope(**kw):
    return build("fope", d_model=64, num_heads=4, **kw)


def _fope_keys_of_other_groups() -> None:
    enc = _fope(coef_heads=4)
    q, k, pos = torch.zeros(1, 4, 3, 16), torch.zeros(1, 2, 3, 16), torch.arange(3)[None]
    enc.rotate(q, k, pos, pos)


A = "clipped RoPE"
B = "FoPE"
CASES = [
    Case(A, "build('rope', scaling='clipped') with neither clipped_pairs nor original_max_position_embeddings",
         r"^rope type 'clipped' takes exactly one of clipped_pairs .*got clipped_pairs=None, "
         r"original_max_position_embeddings=None$", run=lambda: _clipped()),
    Case(A, "scaling='clipped' with both clipped_pairs=4 and original_max_position_embeddings=64",
         r"^rope type 'clipped' takes exactly one of clipped_pairs",
         run=lambda: _clipped(clipped_pairs=4, original_max_position_embeddings=64)),
    Case(A, "scaling='clipped', clipped_pairs=-1", r"^clipped_pairs must be >= 0, got -1$",
         run=lambda: _clipped(clipped_pairs=-1)),
    Case(A, "scaling='clipped', original_max_position_embeddings=0",
         r"^original_max_position_embeddings must be >= 1, got 0$",
         run=lambda: _clipped(original_max_position_embeddings=0)),
    Case(A, "scaling='clipped', clipped_pairs=2.5", r"^clipped_pairs must be an int", error=TypeError,
         run=lambda: _clipped(clipped_pairs=2.5)),
    Case(A, "scaling='clipped' with base=0.5 (frequencies growing with the pair index)",
         r"^base must be > 1 for rope type 'clipped' .*got 0.5$", run=lambda: _clipped(clipped_pairs=4, base=0.5)),
    Case(B, "build('fope', base=1.0)", r"^base must be > 1 .*got 1.0$", run=lambda: _fope(base=1.0)),
    Case(B, "build('fope', max_position_embeddings=0)", r"^max_position_embeddings must be >= 1, got 0$",
         run=lambda: _fope(max_position_embeddings=0)),
    Case(B, "build('fope', num_inv_freq=0)", r"^num_inv_freq must be >= 1, got 0$", run=lambda: _fope(num_inv_freq=0)),
    Case(B, "build('fope', num_inv_freq=9) at head_dim 16", r"^num_inv_freq must be <= head_dim / 2 \(8\), got 9$",
         run=lambda: _fope(num_inv_freq=9)),
    Case(B, "build('fope', coef_heads=3) with 4 heads", r"^coef_heads must divide num_heads \(4\), got 3$",
         run=lambda: _fope(coef_heads=3)),
    Case(B, "build('fope', init_gain=-0.1)", r"^init_gain must be", run=lambda: _fope(init_gain=-0.1)),
    Case(B, "build('fope', d_model=12, num_heads=4) (an odd head_dim)", r"^head_dim must be even for fope",
         run=lambda: build("fope", d_model=12, num_heads=4)),
    Case(B, "FoPE with coef_heads=4 rotating keys of 2 heads", r"^coef_heads \(4\) must divide the heads of k, got 2$",
         run=_fope_keys_of_other_groups),
]
