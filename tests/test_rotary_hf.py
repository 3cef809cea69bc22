"""Parity with Hugging Face transformers (an independent implementation), for every rope type.

For each config: posenc.rotary.from_hf gives the inv_freq and attention_factor that
transformers' ROPE_INIT_FUNCTIONS compute, and rotated q/k equal transformers'
``apply_rotary_pos_emb`` fed with its own cos/sin (LlamaRotaryEmbedding, which applies the
attention factor to cos and sin). Also: checkpoint layout conversion preserves scores.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GPTNeoXConfig, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

import posenc  # noqa: E402
from posenc.rotary import SCALINGS, from_hf  # noqa: E402

transformers.logging.set_verbosity_error()

g = torch.Generator().manual_seed(0)
PHI3_SHORT = (1.0 + torch.rand(48, generator=g)).tolist()
PHI3_LONG = (1.0 + 30 * torch.rand(48, generator=g)).tolist()

CONFIGS = {
    "default-llama2": dict(hidden_size=256, num_attention_heads=4, rope_theta=10000.0, max_position_embeddings=4096),
    "default-theta1e6-hd128": dict(hidden_size=512, num_attention_heads=4, head_dim=128, rope_theta=1e6),
    "default-partial": dict(hidden_size=256, num_attention_heads=4, rope_theta=10000.0, partial_rotary_factor=0.25),
    "linear-2": dict(hidden_size=256, num_attention_heads=4, max_position_embeddings=4096,
                     rope_scaling={"type": "linear", "factor": 2.0}),
    "linear-4.5-partial": dict(hidden_size=384, num_attention_heads=4, rope_theta=5e5, partial_rotary_factor=0.5,
                               rope_scaling={"rope_type": "linear", "factor": 4.5}),
    "dynamic-2": dict(hidden_size=256, num_attention_heads=4, max_position_embeddings=2048,
                      rope_scaling={"type": "dynamic", "factor": 2.0}),
    "dynamic-8-hd128": dict(hidden_size=1024, num_attention_heads=8, rope_theta=1e6, max_position_embeddings=512,
                            rope_scaling={"rope_type": "dynamic", "factor": 8.0}),
    "yarn-qwen": dict(hidden_size=1024, num_attention_heads=8, rope_theta=1e6, max_position_embeddings=131072,
                      rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    "yarn-deepseek-mscale": dict(hidden_size=512, num_attention_heads=8, rope_theta=10000.0,
                                 max_position_embeddings=163840,
                                 rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                               "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                               "mscale_all_dim": 0.707}),
    "yarn-no-truncate-partial": dict(hidden_size=256, num_attention_heads=4, rope_theta=150000.0,
                                     partial_rotary_factor=0.5, max_position_embeddings=131072,
                                     rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 16.0,
                                                   "beta_slow": 2.0, "truncate": False,
                                                   "original_max_position_embeddings": 4096}),
    "yarn-implicit-factor-af": dict(hidden_size=256, num_attention_heads=2, max_position_embeddings=8192,
                                    rope_scaling={"rope_type": "yarn", "factor": None, "attention_factor": 1.3,
                                                  "original_max_position_embeddings": 2048}),
    "llama3.1-8b": dict(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0, max_position_embeddings=131072,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama3.2-hd64": dict(hidden_size=2048, num_attention_heads=32, rope_theta=500000.0,
                          max_position_embeddings=131072,
                          rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 2.0,
                                        "high_freq_factor": 8.0, "original_max_position_embeddings": 8192}),
    "longrope-phi3": dict(hidden_size=3072, num_attention_heads=32, rope_theta=10000.0, max_position_embeddings=131072,
                          original_max_position_embeddings=4096,
                          rope_scaling={"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG}),
    "longrope-partial-af": dict(hidden_size=3072, num_attention_heads=16, partial_rotary_factor=0.5,
                                max_position_embeddings=65536,
                                rope_scaling={"rope_type": "longrope", "short_factor": PHI3_SHORT,
                                              "long_factor": PHI3_LONG, "factor": 8.0, "attention_factor": 1.1,
                                              "original_max_position_embeddings": 8192}),
    # p-RoPE as Gemma 4's full layers spell it: the rope dict's partial_rotary_factor is the
    # fraction of pairs that rotate (over the whole head), not the rotated width
    "proportional-gemma4": dict(hidden_size=512, num_attention_heads=2, head_dim=256,
                                rope_scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                              "rope_theta": 1e6}),
    "proportional-top-level-factor": dict(hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.5,
                                          rope_scaling={"rope_type": "proportional", "factor": 2.0}),
}


def hf_rotary(cfg: dict):
    """transformers' rotary module for a config dict (GPT-NeoX's for default partial rotary,
    since Llama's default ignores partial_rotary_factor)."""
    cfg = copy.deepcopy(cfg)  # transformers edits rope dicts in place
    if not cfg.get("rope_scaling") and cfg.get("partial_rotary_factor", 1.0) < 1:
        prf = cfg.pop("partial_rotary_factor")
        return GPTNeoXRotaryEmbedding(GPTNeoXConfig(rotary_pct=prf, **cfg))
    return LlamaRotaryEmbedding(LlamaConfig(**cfg))


def rope_type_of(cfg: dict) -> str:
    rs = cfg.get("rope_scaling") or {}
    return rs.get("rope_type", rs.get("type", "default"))


def test_every_registered_type_is_covered():
    # Every registered scaling transformers also has is compared with it here; static NTK and
    # types registered beyond transformers' own have no counterpart.
    covered = {rope_type_of(c) for c in CONFIGS.values()}
    in_transformers = {n for n, e in SCALINGS.items()
                       if e.hf is not None and (e.hf.rope_type == "default" or e.hf.rope_type in ROPE_INIT_FUNCTIONS)}
    assert covered == in_transformers
    assert {"default", "linear", "dynamic", "yarn", "llama3", "longrope"} <= covered


@pytest.mark.parametrize("name", list(CONFIGS))
def test_inv_freq_and_attention_factor_match_transformers(name):
    cfg = CONFIGS[name]
    hf = hf_rotary(cfg)
    rope = from_hf(copy.deepcopy(cfg))
    assert rope.inv_freq.shape == hf.inv_freq.shape
    # transformers computes base ** float32(2i/d) in float32: rounding the exponent alone
    # costs a relative |ln theta_i| * 2^-24 <= ~1e-6 (base 5e5); ours is float64.
    torch.testing.assert_close(rope.inv_freq.float(), hf.inv_freq, rtol=1e-6, atol=0)
    assert rope.attention_factor == pytest.approx(hf.attention_scaling, rel=1e-12)


@pytest.mark.parametrize("name", [n for n in CONFIGS if rope_type_of(CONFIGS[n]) in ("dynamic", "longrope")])
@pytest.mark.parametrize("seq_len", [100, 5000, 300000])
def test_length_dependent_types_match_transformers(name, seq_len):
    cfg = CONFIGS[name]
    hf_cfg = LlamaConfig(**copy.deepcopy(cfg))
    inv, af = ROPE_INIT_FUNCTIONS[rope_type_of(cfg)](hf_cfg, seq_len=seq_len)
    ours, our_af = from_hf(copy.deepcopy(cfg)).frequencies(seq_len)
    torch.testing.assert_close(ours.float(), inv, rtol=1e-6, atol=0)
    assert our_af == pytest.approx(af, rel=1e-12)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_rotated_qk_match_apply_rotary_pos_emb(name):
    cfg = CONFIGS[name]
    hf = hf_rotary(cfg)
    rope = from_hf(copy.deepcopy(cfg))
    D, r = rope.dims.head_dim, rope.rotary_dim
    B, T = 2, 9
    q, k = torch.randn(B, 4, T, D), torch.randn(B, 2, T, D)
    pos = torch.randint(0, 1000, (B, T))
    if rope_type_of(cfg) in ("dynamic", "longrope"):
        pos[0, 0] = 2 * rope.config.original_max_position_embeddings  # use the scaled frequencies
    cos, sin = hf(q, pos)  # (B, T, r) float32, times the attention factor
    hq, hk = apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin)
    rq, rk = rope.rotate(q, k, pos, pos)
    # transformers' angles are float32 products: error ~ max_pos * 2^-24 rad per entry.
    tol = max(4 * float(pos.max()) * 2**-24, 1e-5)
    torch.testing.assert_close(rq[..., :r], hq, atol=tol * 10, rtol=1e-4)
    torch.testing.assert_close(rk[..., :r], hk, atol=tol * 10, rtol=1e-4)
    assert torch.equal(rq[..., r:], q[..., r:])


def test_from_hf_rejects_unknown_types_and_keys():
    base = dict(hidden_size=64, num_attention_heads=2, max_position_embeddings=128)
    with pytest.raises(ValueError, match=r"rope_scaling\['rope_type'\] must be one of .*; got 'ntk'"):
        from_hf(base | {"rope_scaling": {"rope_type": "ntk", "factor": 2.0}})  # posenc's name, not transformers'

    with pytest.raises(ValueError, match="unknown key.*'beta_fast' in rope_scaling"):
        from_hf(base | {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 4}})
    with pytest.raises(ValueError, match=r"needs rope_scaling\['factor'\]"):
        from_hf(base | {"rope_scaling": {"type": "dynamic"}})
    with pytest.raises(ValueError, match="disagree"):
        from_hf(base | {"rope_scaling": {"type": "dynamic", "rope_type": "linear", "factor": 2.0}})
    with pytest.raises(ValueError, match=r"rope_scaling\['factor'\] must be"):
        from_hf(base | {"rope_scaling": {"type": "linear", "factor": 0.5}})
    with pytest.raises(ValueError, match="head_dim"):
        from_hf({"num_attention_heads": 2})
    with pytest.raises(ValueError, match=r"partial_rotary_factor=0.5 gives int\(head_dim 10 \* 0.5\) = 5"):
        from_hf(dict(head_dim=10, num_attention_heads=2, partial_rotary_factor=0.5))
