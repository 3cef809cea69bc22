"""posenc.backends.narrow_values: attention with values narrower than q and k (PoPE) on CPU.

Checked against a loop over the softmax formula row by row (float64), against autograd through
the dense formula, and against torch's own SDPA with v zero-padded (an independent kernel).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc.backends.cpu_flash import backward_with_bias
from posenc.backends.narrow_values import forward_blocks, narrow_value_attention
from posenc.backends.sdpa import FEW_ROWS, sdpa


def _inputs(B=2, H=3, tq=37, tk=37, D=8, Dv=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, t, D, generator=g, dtype=dtype) for t in (tq, tk))
    v = torch.randn(B, H, tk, Dv, generator=g, dtype=dtype)
    return q, k, v


def _loop_reference(q, k, v, scale, causal):
    """Each query row on its own: softmax over the keys it sees, then the weighted sum of values."""
    B, H, Tq, _ = q.shape
    out = torch.zeros(B, H, Tq, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                seen = i + 1 if causal else k.shape[2]
                logits = [float(q[b, h, i].double() @ k[b, h, j].double()) * scale for j in range(seen)]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                for j in range(seen):
                    out[b, h, i] += weights[j] / total * v[b, h, j].double()
    return out


def _dense(q, k, v, scale, causal):
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("causal,tq,tk,block", [(True, 37, 37, 8), (True, 16, 16, 64), (False, 13, 29, 5), (False, 1, 9, 4)])
def test_forward_matches_the_formula_row_by_row(causal, tq, tk, block):
    q, k, v = _inputs(tq=tq, tk=tk)
    scale = 0.3
    out = narrow_value_attention(q, k, v, scale=scale, causal=causal, block=block)
    torch.testing.assert_close(out, _loop_reference(q, k, v, scale, causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal,tq,tk,block", [(True, 37, 37, 8), (False, 13, 29, 5)])
def test_gradients_match_autograd_through_the_dense_formula(causal, tq, tk, block):
    q, k, v = (t.requires_grad_() for t in _inputs(tq=tq, tk=tk))
    g = torch.randn(q.shape[0], q.shape[1], tq, v.shape[-1], dtype=torch.float64)
    want = torch.autograd.grad(_dense(q, k, v, 0.3, causal), (q, k, v), g)
    got = torch.autograd.grad(narrow_value_attention(q, k, v, scale=0.3, causal=causal, block=block), (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_float32_matches_torch_sdpa_with_v_padded():
    """torch's flash kernel on a zero-padded v: the same attention by another implementation."""
    q, k, v = (t.float().requires_grad_() for t in _inputs(B=2, H=4, tq=200, tk=200, D=32, Dv=16))
    g = torch.randn(2, 4, 200, 16)
    mine = narrow_value_attention(q, k, v, scale=32 ** -0.5, causal=True)
    theirs = F.scaled_dot_product_attention(q, k, F.pad(v, (0, 16)), is_causal=True)[..., :16]
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(mine, (q, k, v), g), torch.autograd.grad(theirs, (q, k, v), g)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bfloat16_computes_in_float32_and_returns_bfloat16():
    q, k, v = (t.bfloat16() for t in _inputs(tq=40, tk=40))
    out = narrow_value_attention(q, k, v, scale=0.3, causal=True)
    assert out.dtype == torch.bfloat16
    ref = _dense(q.double(), k.double(), v.double(), 0.3, True)
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)
    fwd, lse = forward_blocks(q, k, v, scale=0.3, causal=True)
    assert fwd.dtype == torch.float32 and lse.dtype == torch.float32


def test_lse_is_the_log_sum_exp_of_each_rows_logits():
    q, k, v = _inputs(tq=21, tk=21)
    _, lse = forward_blocks(q, k, v, scale=0.3, causal=True, block=4)
    s = (q @ k.transpose(-1, -2) * 0.3).masked_fill(torch.ones(21, 21, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, s.logsumexp(-1), rtol=1e-12, atol=1e-12)


def test_no_quadratic_tensor_is_kept_for_the_backward():
    B, H, T = 1, 2, 512
    q, k, v = (t.float().requires_grad_() for t in _inputs(B=B, H=H, tq=T, tk=T, D=16, Dv=8))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        narrow_value_attention(q, k, v, scale=0.25, causal=True)
    assert saved and max(saved) < T * T  # q, k, v, out, lse: O(T·D)
    assert sum(saved) <= B * H * T * (16 + 16 + 8 + 8 + 1)


def test_backward_without_a_bias_equals_a_zero_bias():
    q, k, v = _inputs(tq=19, tk=19)
    out, lse = forward_blocks(q, k, v, scale=0.3, causal=True)
    dout = torch.randn_like(out)
    none = backward_with_bias(q, k, v, None, out, lse, dout, scale=0.3, causal=True, block=4)
    zero = backward_with_bias(q, k, v, torch.zeros(1, 3, 19, 19, dtype=torch.float64), out, lse, dout,
                              scale=0.3, causal=True, block=4)
    assert none[3] is None
    for a, b in zip(none[:3], zero[:3]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_sdpa_takes_this_path_for_long_unmasked_calls_and_pads_for_masked_ones():
    q, k, v = (t.float() for t in _inputs(tq=FEW_ROWS + 20, tk=FEW_ROWS + 20, D=16, Dv=8))
    ref = _dense(q.double(), k.double(), v.double(), 16 ** -0.5, True)
    torch.testing.assert_close(sdpa(q, k, v, is_causal=True).double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sdpa(q, k, v).double(), _dense(q.double(), k.double(), v.double(), 0.25, False),
                               rtol=1e-5, atol=1e-5)
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    torch.testing.assert_close(sdpa(q, k, v, attn_mask=mask).double(), ref, rtol=1e-5, atol=1e-5)


def test_empty_sequences_give_zeros_with_gradients():
    q, k, v = (t.requires_grad_() for t in _inputs(tq=0, tk=0))
    out = narrow_value_attention(q, k, v, scale=1.0, causal=True)
    assert out.shape == (2, 3, 0, 4)
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


@pytest.mark.parametrize("change,match", [
    (dict(causal=True, tk=9), "causal needs as many queries as keys"),
    (dict(block=0), "block must be a positive int"),
    (dict(block=True), "block must be a positive int"),
    (dict(k_width=6), "must share B, H and dtype"),
    (dict(v_dtype=torch.float32), "must share B, H and dtype"),
    (dict(q_dim=3), "q must be a 4-D floating-point tensor"),
])
def test_bad_input_is_refused_naming_it(change, match):
    q, k, v = _inputs(tq=8, tk=change.get("tk", 8))
    if "k_width" in change:
        k = k[..., :change["k_width"]]
    if "v_dtype" in change:
        v = v.to(change["v_dtype"])
    if "q_dim" in change:
        q = q[0]
    with pytest.raises(ValueError, match=match):
        narrow_value_attention(q, k, v, scale=1.0, causal=change.get("causal", False), block=change.get("block", 64))


def test_sdpa_under_torch_compile_pads_v_and_agrees():
    """Compiled, sdpa() keeps the flash kernel on a padded v (the blocks' loop would unroll into
    the graph); fullgraph, forward and backward equal the eager blocks."""
    q, k, v = (t.float().requires_grad_() for t in _inputs(tq=40, tk=40, D=16, Dv=8))
    compiled = torch.compile(lambda q, k, v: sdpa(q, k, v, is_causal=True), fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v), sdpa(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
