"""none (NoPE): attention with no positional encoding against a slow loop over softmax(q·k / sqrt(D))
with the causal mask, on the same weights; positions change nothing, and without a mask the
layer is permutation-equivariant (what every positional encoding exists to break)."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import Attention, SequenceInfo

C, H, T = 16, 2, 7


def _layer(causal: bool) -> Attention:
    torch.manual_seed(0)
    return Attention(C, H, pe=posenc.build("none", d_model=C, num_heads=H), causal=causal, impl="eager").double().eval()


def _slow(attn: Attention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Kazemnejad et al.'s NoPE, pair by pair: logit_ij = q_i·k_j / sqrt(D), keys j <= i if causal."""
    D = C // H
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)  # (B, T, C)
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for h in range(H):
            sl = slice(h * D, (h + 1) * D)
            for i in range(T):
                keys = range(i + 1) if causal else range(T)
                logits = torch.stack([q[b, i, sl] @ k[b, j, sl] / math.sqrt(D) for j in keys])
                w = torch.softmax(logits, dim=0)
                out[b, i, sl] = sum(w[n] * v[b, j, sl] for n, j in enumerate(keys))
    return attn.o_proj(out)


def test_none_overrides_no_hook():
    enc = posenc.build("none", d_model=C, num_heads=H)
    assert not (enc.has_bias or enc.has_terms or enc.has_rotate or enc.has_embed)
    assert list(enc.parameters()) == []


@pytest.mark.parametrize("causal", [True, False])
def test_none_attention_matches_plain_softmax_attention(causal):
    attn = _layer(causal)
    x = torch.randn(2, T, C, dtype=torch.float64)
    with torch.no_grad():
        got = attn(x, SequenceInfo.from_offset(2, T))
        want = _slow(attn, x, causal)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_positions_change_nothing():
    attn = _layer(True)
    x = torch.randn(2, T, C, dtype=torch.float64)
    with torch.no_grad():
        at_zero = attn(x, SequenceInfo.from_offset(2, T))
        far = attn(x, SequenceInfo.from_offset(2, T, 10**6))
    torch.testing.assert_close(far, at_zero, atol=0, rtol=0)


def test_without_a_mask_the_layer_is_permutation_equivariant():
    attn = _layer(False)
    x = torch.randn(1, T, C, dtype=torch.float64)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = attn(x, SequenceInfo.from_offset(1, T))
        permuted = attn(x[:, perm], SequenceInfo.from_offset(1, T))
    torch.testing.assert_close(permuted, out[:, perm], atol=1e-12, rtol=1e-12)
