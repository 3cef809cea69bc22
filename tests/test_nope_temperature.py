"""nope_temperature: the query factor against transformers' Llama 4 formula and an exact integer
loop (exact where float32 is not), only queries scaled, and posenc's Attention against
transformers' Llama4TextAttention on the same weights, prompt and KV-cache step."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import Attention, SequenceInfo
from posenc.absolute.nope_temperature import temperature_scale


def _hf_scale(positions: torch.Tensor, floor_scale: int, attn_scale: float) -> torch.Tensor:
    """transformers' Llama4TextAttention.forward, verbatim on the same positions (float32)."""
    return torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0


def test_temperature_scale_matches_transformers_formula():
    p = torch.tensor([0, 1, 8190, 8191, 8192, 16382, 16383, 10**5, 2**20, 2**24 - 2, 2**24 - 1])
    for fs, a in ((8192, 0.1), (4, 0.5), (1, 2.0)):
        got = temperature_scale(p, fs, a)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got.float(), _hf_scale(p, fs, a))
        exact = torch.tensor([1 + a * math.log1p((int(x) + 1) // fs) for x in p], dtype=torch.float64)
        torch.testing.assert_close(got, exact, atol=1e-15, rtol=1e-15)
    assert temperature_scale(torch.tensor([8190]), 8192, 0.1).item() == 1.0  # untouched below floor_scale
    assert temperature_scale(torch.tensor([8191]), 8192, 0.1).item() == pytest.approx(1 + 0.1 * math.log(2))


def test_temperature_floor_is_exact_where_float32_is_not():
    """Past 2^24 float32 rounds p + 1 and crosses floor boundaries; the integer division does not."""
    p = torch.tensor([3 * 2**24 - 2], dtype=torch.int64)  # p + 1 = 3·2^24 - 1, one below a multiple of 2^24
    ours = temperature_scale(p, 2**24, 1.0).item()
    assert ours == pytest.approx(1 + math.log1p(2))  # floor((3·2^24 - 1) / 2^24) = 2
    assert _hf_scale(p, 2**24, 1.0).item() == pytest.approx(1 + math.log1p(3))  # float32 rounds to 3·2^24


def test_temperature_scales_queries_only():
    from posenc import build

    enc = build("nope_temperature", d_model=32, num_heads=4, floor_scale=2, attn_scale=0.5)
    q, k = torch.randn(2, 4, 6, 8, dtype=torch.bfloat16), torch.randn(2, 2, 6, 8, dtype=torch.bfloat16)
    pos = torch.arange(6).expand(2, 6) + torch.tensor([[0], [100]])
    q2, k2 = enc.rotate(q, k, pos, pos, enc.prepare(pos, pos))
    assert k2 is k and q2.dtype == torch.bfloat16
    want = (q.float() * _hf_scale(pos, 2, 0.5)[:, None, :, None]).to(torch.bfloat16)
    assert torch.equal(q2, want)
    q3, _ = enc.rotate(q, k, pos, pos, None)  # without the prepared state (cross-attention)
    assert torch.equal(q3, want)


def test_nope_temperature_attention_matches_transformers_llama4_layer():
    """A Llama 4 NoPE layer (no_rope_layers[0] = 0, temperature tuning on) and posenc's
    Attention with ``nope_temperature`` on the same weights: the same output, for a prompt and
    then a KV-cache step at later positions."""
    from transformers import Llama4TextConfig
    from transformers.cache_utils import DynamicCache
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    C, H, Hkv, T = 32, 4, 2, 12
    hf_cfg = Llama4TextConfig(hidden_size=C, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=C // H,
                              num_hidden_layers=1, no_rope_layers=[0], floor_scale=4, attn_scale=0.5,
                              attn_temperature_tuning=True)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = Llama4TextAttention(hf_cfg, 0).eval()
    ours = Attention(C, H, Hkv, pe=tiny_pe(), impl="eager").eval()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        getattr(ours, name).weight.data.copy_(getattr(hf, name).weight.data)
    x = torch.randn(1, T, C)
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
    cache = DynamicCache(config=hf_cfg)
    with torch.no_grad():
        want = hf(x[:, :9], None, causal[..., :9, :9], cache=cache)[0]
        step = hf(x[:, 9:], None, causal[..., 9:, :], cache=cache)[0]
        ours_cache = _cache()
        got = ours(x[:, :9], SequenceInfo.from_offset(1, 9), cache=ours_cache)
        ours_cache.commit(SequenceInfo.from_offset(1, 9), 9)
        got_step = ours(x[:, 9:], SequenceInfo.from_offset(1, 3, 9), cache=ours_cache)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_step, step, atol=1e-6, rtol=1e-5)


def tiny_pe():
    from posenc import build

    return build("nope_temperature", d_model=32, num_heads=4, floor_scale=4, attn_scale=0.5)


def _cache():
    from posenc.kv_cache import KVCache

    return KVCache(1)
