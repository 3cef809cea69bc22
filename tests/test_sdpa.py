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
