"""attention.py: Attention against explicit per-head softmax loops (GQA, cross-attention, float64),
its bad inputs, and the KV cache's growing buffers."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import Attention, AttentionContext, SequenceInfo
from posenc.kv_cache import KVCache


def reference_attention(attn: Attention, x, ctx_x, mask):
    """Multi-head attention written per head with explicit softmax, no positional encoding."""
    B, Tq, C = x.shape
    H, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(B, Tq, H, D)
    k = attn.k_proj(ctx_x).view(B, -1, Hkv, D)
    v = attn.v_proj(ctx_x).view(B, -1, Hkv, D)
    out = torch.zeros(B, Tq, H, D, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            logits = q[b, :, h] @ k[b, :, g].T / math.sqrt(D)
            if mask is not None:
                logits = logits.masked_fill(~mask[b if mask.shape[0] > 1 else 0, 0], float("-inf"))
            out[b, :, h] = torch.softmax(logits, -1) @ v[b, :, g]
    return attn.o_proj(out.reshape(B, Tq, H * D))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_matches_reference_with_gqa(impl, causal):
    attn = Attention(32, 4, 2, causal=causal, impl=impl).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    seq = SequenceInfo.from_padding_mask(torch.tensor([[1] * 7, [0, 0] + [1] * 5]))
    ctx = AttentionContext.build(seq, causal=causal)
    torch.testing.assert_close(attn(x, ctx), reference_attention(attn, x, x, ctx.mask.dense()))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_cross_attention_q_len_differs_from_k_len(impl):
    attn = Attention(16, 2, causal=False, impl=impl).double()
    x, mem = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 8, 16, dtype=torch.float64)
    q_seq, k_seq = SequenceInfo.from_offset(2, 3), SequenceInfo.from_offset(2, 8)
    ctx = AttentionContext.build(q_seq, k_seq, causal=False)
    torch.testing.assert_close(attn(x, ctx, context=mem), reference_attention(attn, x, mem, None))


def test_attention_bad_inputs():
    with pytest.raises(ValueError, match="num_kv_heads"):
        Attention(32, 4, 3)
    with pytest.raises(ValueError, match="impl"):
        Attention(32, 4, impl="flash")
    attn = Attention(32, 4)
    with pytest.raises(ValueError, match="positions cover 5 tokens but x has 4"):
        attn(torch.randn(1, 4, 32), SequenceInfo.from_offset(1, 5))


def test_kv_cache_append_equals_concatenation_across_growth():
    cache = KVCache(1)
    ks, vs = [], []
    with torch.no_grad():
        for t in (5, 1, 1, 20, 1, 3):  # crosses the initial capacity (16) and a doubling
            k, v = torch.randn(2, 3, t, 4), torch.randn(2, 3, t, 4)
            ks.append(k)
            vs.append(v)
            kk, vv = cache.update(0, k, v)
            assert torch.equal(kk, torch.cat(ks, 2)) and torch.equal(vv, torch.cat(vs, 2))
    assert cache.layers[0].kbuf.shape[2] >= 31 and cache.layers[0].n == 31
    with pytest.raises(ValueError, match="batch size changed"):
        cache.update(0, torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4))


class _ThirdOfDistance(posenc.PositionalEncoding):
    """A logit term (i - j) / 3 in the input dtype: not exact in float32."""

    def prepare(self, q_pos, k_pos):
        return q_pos, k_pos

    def terms(self, q, k, state, proj):
        from posenc.terms import DenseTerm

        d = posenc.positions.relative_positions(*state).to(q.dtype) / 3  # (B, Tq, Tk)
        return [DenseTerm(d[:, None].expand(q.shape[0], q.shape[1], -1, -1))]


@pytest.mark.parametrize("with_score", [False, True])
def test_float64_attention_stays_float64(with_score):
    """Eager attention in float64 against a float64 loop: 1e-12, where rounding the logits or
    the score term to float32 (as before) errs by ~1e-7."""
    torch.manual_seed(0)
    pe = _ThirdOfDistance(posenc.config.EncodingConfig(), posenc.Dims(32, 4, 8)) if with_score else None
    attn = Attention(32, 4, pe=pe, impl="eager").double()
    x = torch.randn(2, 6, 32, dtype=torch.float64) * 4  # large logits: float32 rounding shows
    seq = SequenceInfo.from_offset(2, 6, 3)
    B, T, H, D = 2, 6, 4, 8
    q = attn.q_proj(x).view(B, T, H, D)
    k = attn.k_proj(x).view(B, T, H, D)
    v = attn.v_proj(x).view(B, T, H, D)
    out = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = torch.stack([q[b, i, h] @ k[b, j, h] / math.sqrt(D) + (i - j) / 3 * with_score for j in range(i + 1)])
                out[b, i, h] = torch.softmax(logits, -1) @ v[b, : i + 1, h]
    want = attn.o_proj(out.reshape(B, T, H * D))
    torch.testing.assert_close(attn(x, seq), want, atol=1e-12, rtol=1e-12)
