"""ReRoPE and leaky ReRoPE (posenc.methods.rerope) against a slow loop over Su's formula: the
distance kept inside the window, then clamped (slope 0) or grown with slope s."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc.methods import build_method, method_attention
from tests.methods_reference import qkv, rerope_pair, slow_attention
from tests.test_methods_self_extend import positions, rel, rope


@pytest.mark.parametrize("w,slope", [(3, 0.0), (5, 0.0), (1, 0.0), (3, 0.25), (4, 0.5)])
def test_matches_the_loop_over_the_formula(w, slope):
    q, k, v = qkv(B=2, H=4, Hkv=1, Tq=12)
    pos = positions(2, 12)
    inv = rope().inv_freq
    got = method_attention(q, k, v, build_method("rerope", window=w, slope=slope), pos, pos, inv, block_rows=4)
    want = slow_attention(q, k, v, pos, pos, inv, rerope_pair(w, slope))
    assert rel(got, want) < 1e-5


def test_the_rectified_logit_is_constant_beyond_the_window():
    # ReRoPE: every key past the window gets the logit of distance w, so with equal keys there
    # the query weighs them equally: the output is their plain mean
    B, H, T, D, w = 1, 1, 10, 8, 3
    q, _, v = qkv(B=B, H=H, Hkv=1, Tq=T, D=D)
    k = torch.randn(1, 1, 1, D).expand(1, 1, T, D).contiguous()  # one key repeated
    pos = positions(1, T)
    got = method_attention(q, k, v, build_method("rerope", window=w), pos, pos, rope(D, H).inv_freq)
    want = slow_attention(q, k, v, pos, pos, rope(D, H).inv_freq, rerope_pair(w))
    assert rel(got, want) < 1e-5
    plain = slow_attention(q, k, v, pos, pos, rope(D, H).inv_freq, lambda m, n: (m, n))
    assert rel(got, plain) > 1e-3  # the repeated key at different distances is not weighed equally in plain RoPE


@pytest.mark.parametrize("kw", [dict(window=12), dict(window=50, slope=0.3), dict(window=2, slope=1.0)])
def test_a_window_past_the_sequence_or_slope_one_is_plain_rope(kw):
    q, k, v = qkv(B=2, H=4, Hkv=2, Tq=12)
    pos = positions(2, 12)
    r = rope()
    got = method_attention(q, k, v, build_method("rerope", **kw), pos, pos, r.inv_freq)
    qr, kr = r.rotate(q, k, pos, pos)
    want = F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=True)
    assert rel(got, want) < 1e-5


@pytest.mark.parametrize("kw,match", [
    (dict(window=0), r"window must be in \[1, "),
    (dict(window=4, slope=-0.1), r"slope must be in \[0.0, 1.0\]"),
    (dict(window=4, slope=1.5), r"slope must be in \[0.0, 1.0\]"),
    (dict(window=4, slope=float("nan")), r"slope must be finite"),
    (dict(), r"needs window"),
])
def test_bad_parameters_are_one_value_error_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        build_method("rerope", **kw)
