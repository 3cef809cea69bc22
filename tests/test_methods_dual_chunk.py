"""Dual Chunk Attention (posenc.methods.dual_chunk) against a slow loop over ChunkLlama's formula:
intra-, successive- and inter-chunk query positions, keys within their chunk."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc.methods import build_method, method_attention
from tests.methods_reference import dual_chunk_pair, qkv, slow_attention
from tests.test_methods_self_extend import positions, rel, rope


@pytest.mark.parametrize("s,l", [(4, 1), (5, 2), (3, 0), (6, 5)])
def test_matches_the_loop_over_the_formula(s, l):
    q, k, v = qkv(B=2, H=4, Hkv=2, Tq=14)
    pos = positions(2, 14)
    inv = rope().inv_freq
    got = method_attention(q, k, v, build_method("dual_chunk", chunk_size=s, local_size=l), pos, pos, inv,
                           block_rows=4)
    want = slow_attention(q, k, v, pos, pos, inv, dual_chunk_pair(s, l))
    assert rel(got, want) < 1e-5


def test_every_distance_stays_within_the_chunk_size():
    m = build_method("dual_chunk", chunk_size=6, local_size=2)
    qp, kp = torch.arange(40)[None], torch.arange(40)[None]
    rots = m.rotations(qp, kp)
    sel = m.select(qp[:, :, None], kp[:, None, :])  # (1, 40, 40)
    dist = torch.stack([rq[:, :, None] - rk[:, None, :] for rq, rk in rots])  # (3, 1, 40, 40)
    taken = dist.gather(0, sel[None]).squeeze(0)
    causal = torch.tril(torch.ones(40, 40, dtype=torch.bool))[None]
    assert set(sel[causal].tolist()) == {0, 1, 2}
    assert taken[causal].min() >= 0 and taken[causal].max() <= 6


def test_a_chunk_past_the_sequence_is_plain_rope():
    q, k, v = qkv(B=2, H=4, Hkv=2, Tq=12)
    pos = positions(2, 12, starts=(0, 0))
    r = rope()
    got = method_attention(q, k, v, build_method("dual_chunk", chunk_size=14, local_size=2), pos, pos, r.inv_freq)
    qr, kr = r.rotate(q, k, pos, pos)
    assert rel(got, F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=True)) < 1e-5


@pytest.mark.parametrize("kw,match", [
    (dict(chunk_size=1, local_size=0), r"chunk_size must be in \[2, "),
    (dict(chunk_size=8, local_size=8), r"local_size must be in \[0, 7\], got 8"),
    (dict(chunk_size=8, local_size=-1), r"local_size must be in \[0, 7\], got -1"),
    (dict(chunk_size=8), r"needs local_size"),
])
def test_bad_parameters_are_one_value_error_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        build_method("dual_chunk", **kw)
