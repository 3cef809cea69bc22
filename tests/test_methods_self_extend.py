"""Self-Extend (posenc.methods.self_extend) against a slow loop over LongLM's formula, and its
limits: a neighbour window past the sequence is plain RoPE."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.methods import build_method, method_attention
from tests.methods_reference import qkv, self_extend_pair, slow_attention


def rope(D=8, H=4):
    return posenc.build("rope", d_model=H * D, num_heads=H)


def positions(B, T, starts=(0, 5)):
    return torch.stack([torch.arange(T) + starts[b % len(starts)] for b in range(B)])  # (B, T)


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("G,W", [(2, 4), (3, 5), (4, 1), (1, 3)])
def test_matches_the_loop_over_the_papers_formula(G, W):
    q, k, v = qkv(B=2, H=4, Hkv=2, Tq=12)
    pos = positions(2, 12)
    inv = rope().inv_freq
    got = method_attention(q, k, v, build_method("self_extend", group_size=G, neighbor_window=W), pos, pos, inv,
                           block_rows=5)
    want = slow_attention(q, k, v, pos, pos, inv, self_extend_pair(G, W))
    assert rel(got, want) < 1e-5


def test_both_rotations_are_used_and_differ_from_plain_rope():
    # the test above would pass for plain RoPE if the grouped logits were never taken
    q, k, v = qkv(B=1, Tq=12)
    pos = positions(1, 12)
    inv = rope().inv_freq
    got = method_attention(q, k, v, build_method("self_extend", group_size=3, neighbor_window=2), pos, pos, inv)
    plain = slow_attention(q, k, v, pos, pos, inv, lambda m, n: (m, n))
    assert rel(got, plain) > 1e-2


def test_decoding_with_a_cache_is_the_last_rows_of_the_full_pass():
    q, k, v = qkv(B=2, Tq=12)
    pos = positions(2, 12)
    inv = rope().inv_freq
    m = build_method("self_extend", group_size=2, neighbor_window=3)
    full = method_attention(q, k, v, m, pos, pos, inv)
    last = method_attention(q[:, :, -3:], k, v, m, pos[:, -3:], pos, inv, block_rows=2)
    assert rel(last, full[:, :, -3:]) < 1e-6


@pytest.mark.parametrize("G,W", [(4, 12), (4, 40), (1, 1)])
def test_a_window_past_the_sequence_or_group_one_is_plain_rope(G, W):
    q, k, v = qkv(B=2, H=4, Hkv=2, Tq=12)
    pos = positions(2, 12)
    r = rope()
    got = method_attention(q, k, v, build_method("self_extend", group_size=G, neighbor_window=W), pos, pos,
                           r.inv_freq)
    qr, kr = r.rotate(q, k, pos, pos)
    want = F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=True)
    assert rel(got, want) < 1e-5


@pytest.mark.parametrize("kw,match", [
    (dict(group_size=0, neighbor_window=4), r"group_size must be in \[1, "),
    (dict(group_size=2, neighbor_window=0), r"neighbor_window must be in \[1, "),
    (dict(group_size=2), r"needs neighbor_window"),
    (dict(group_size=2, neighbor_window=4, window=3), r"takes group_size, neighbor_window; got unknown window"),
])
def test_bad_parameters_are_one_value_error_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        build_method("self_extend", **kw)


def test_a_float_group_size_is_a_type_error():
    with pytest.raises(TypeError, match="group_size must be an int"):
        build_method("self_extend", group_size=2.5, neighbor_window=4)
