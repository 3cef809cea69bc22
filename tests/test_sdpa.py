"""backends/sdpa.py: the row-blocked causal SDPA with a bias against a per-query softmax loop."""

from __future__ import annotations

import pytest
import torch

from posenc.backends.sdpa import causal_sdpa_with_bias


@pytest.mark.parametrize("bias_batch", [1, 2])
def test_causal_sdpa_with_bias_row_blocks_match_reference(bias_batch):
    # Blocks of 4 rows over T = 11 (the last block is short): every query's softmax is
    # written out over the keys j <= i, forward and gradients w.r.t. q, k, v and the bias.
    B, H, T, D = 2, 3, 11, 5
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.randn(bias_batch, H, T, T, dtype=torch.float64, requires_grad=True)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    got = causal_sdpa_with_bias(q, k, v, bias.masked_fill(~causal, float("-inf")), 0.3, rows=4)
    want = torch.zeros(B, H, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = 0.3 * (k[b, h, : i + 1] @ q[b, h, i]) + bias[b % bias_batch, h, i, : i + 1]
                want[b, h, i] = torch.softmax(logits, -1) @ v[b, h, : i + 1]
    torch.testing.assert_close(got, want)
    up = torch.randn_like(want)
    g_got = torch.autograd.grad((got * up).sum(), (q, k, v, bias))
    g_want = torch.autograd.grad((want * up).sum(), (q, k, v, bias))
    for a, w in zip(g_got, g_want):
        torch.testing.assert_close(a, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tq", [1, 3, 40])
@pytest.mark.parametrize("mask", ["none", "bool", "float", "causal"])
def test_values_narrower_than_q_and_k_match_a_softmax_loop(tq, mask, dtype, monkeypatch):
    """q and k wider than v (PoPE): sdpa() computes few-row calls directly, longer unmasked ones
    in row blocks at v's width (narrow_values), and pads v for longer masked ones (SDPA's CPU
    flash kernel takes one head dim only): outputs and gradients equal a per-query softmax loop,
    and SDPA is never handed unequal widths (its math kernel)."""
    import torch.nn.functional as F

    from posenc.backends import sdpa as leaves

    if mask == "causal" and tq != 40:
        pytest.skip("is_causal: Tq == Tk")
    torch.manual_seed(tq)
    B, H, Tk, D, Dv = 2, 3, 40, 8, 4
    q = torch.randn(B, H, tq, D, dtype=dtype, requires_grad=True)
    k = torch.randn(B, H, Tk, D, dtype=dtype, requires_grad=True)
    v = torch.randn(B, H, Tk, Dv, dtype=dtype, requires_grad=True)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    visible = torch.rand(tq, Tk) < 0.7
    visible[:, 0] = True
    attn = {"none": None, "bool": visible, "float": torch.randn(B, H, tq, Tk, dtype=dtype), "causal": None}[mask]
    calls, real = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, k, v, **kw: calls.append(v.shape[-1]) or real(q, k, v, **kw))
    got = leaves.sdpa(q, k, v, attn_mask=attn, is_causal=mask == "causal", scale=0.4)
    assert got.shape == (B, H, tq, Dv) and calls == ([D] if tq > leaves.FEW_ROWS and mask in ("bool", "float") else [])
    want = torch.zeros(B, H, tq, Dv, dtype=dtype)
    for b in range(B):
        for h in range(H):
            for i in range(tq):
                logits = 0.4 * (k[b, h] @ q[b, h, i])  # (Tk,)
                if mask == "bool":
                    logits = logits.masked_fill(~visible[i], float("-inf"))
                elif mask == "float":
                    logits = logits + attn[b, h, i]
                elif mask == "causal":
                    logits = logits.masked_fill(torch.arange(Tk) > i, float("-inf"))
                want[b, h, i] = torch.softmax(logits, -1) @ v[b, h]
    torch.testing.assert_close(got, want, **tol)
    up = torch.randn_like(want)
    for a, w in zip(torch.autograd.grad((got * up).sum(), (q, k, v)), torch.autograd.grad((want * up).sum(), (q, k, v))):
        torch.testing.assert_close(a, w, **tol)
