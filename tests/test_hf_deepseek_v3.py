"""posenc.hf.patch_model on DeepSeek-V3 (multi-head latent attention, MLA): the decoupled RoPE of
the ``qk_rope_head_dim`` slice (q_pe, and the one k_pe all heads share), in the interleaved
order the attention makes (``rope_interleave``), with YaRN and DeepSeek's ``mscale`` /
``mscale_all_dim``, against transformers' own DeepseekV3 on a tiny random model."""

from __future__ import annotations

import pytest
import torch
import transformers

from posenc.hf import patch_model, unpatch_model
from posenc.rotary import from_hf
from tests.hf_helpers import rel

V = 64
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}


def tiny(rope: dict, interleave: bool = True, seed: int = 0):
    cfg = transformers.DeepseekV3Config(
        vocab_size=V, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=256, rope_parameters=dict(rope),
        initializer_range=0.3, rope_interleave=interleave)
    torch.manual_seed(seed)
    return transformers.DeepseekV3ForCausalLM(cfg).eval()


CASES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "yarn": YARN,
    "yarn_mscale": {**YARN, "mscale": 1.0, "mscale_all_dim": 1.0},  # DeepSeek-V3's published block
    "yarn_mscale_ratio": {**YARN, "mscale": 1.0, "mscale_all_dim": 0.5},  # attention factor != 1
}


@pytest.mark.parametrize("interleave", (True, False))
@pytest.mark.parametrize("name", CASES)
def test_patched_logits_equal_transformers(name, interleave):
    model = tiny(CASES[name], interleave)
    ids = torch.randint(0, V, (2, 200), generator=torch.Generator().manual_seed(1))  # past the original 64
    with torch.no_grad():
        want = model(ids).logits
        rope = patch_model(model)
        got = model(ids).logits
        unpatch_model(model)
        back = model(ids).logits
    assert rope.rotary_dim == 8 and rope.config.layout == ("interleaved" if interleave else "half")
    assert rel(got, want) <= 1e-5
    assert torch.equal(back, want)


def test_cached_generation_equals_transformers():
    model = tiny(CASES["yarn_mscale"])
    ids = torch.randint(0, V, (1, 90), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=8, do_sample=False, output_scores=True, return_dict_in_generate=True)
        patch_model(model)
        got = model.generate(ids, max_new_tokens=8, do_sample=False, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(got.sequences, want.sequences)
    assert max(rel(g, w) for g, w in zip(got.scores, want.scores)) <= 1e-5


def test_a_yarn_patched_onto_the_plain_model_equals_the_model_built_with_it():
    """Without mscale_all_dim the softmax scale is untouched, so patching is the whole change."""
    built = tiny(CASES["yarn"])
    plain = tiny(CASES["default"])
    ids = torch.randint(0, V, (1, 200), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        patch_model(plain, scaling="yarn", factor=4.0, original_max_position_embeddings=64)
        assert rel(plain(ids).logits, built(ids).logits) <= 1e-5


def test_an_override_that_needs_another_softmax_scale_is_refused():
    plain = tiny(CASES["default"])
    with pytest.raises(ValueError, match=r"model_type 'deepseek_v3': its attention multiplies the softmax scale by "
                                         r"YaRN's mscale\(factor, mscale_all_dim\)\^2.*\(1 here\); this RoPE needs 1\.2"):
        patch_model(plain, scaling="yarn", factor=4.0, original_max_position_embeddings=64, mscale=1.0,
                    mscale_all_dim=1.0)
    assert type(plain.model.rotary_emb).__name__ == "DeepseekV3RotaryEmbedding"  # left as it was
    scaled = tiny(CASES["yarn_mscale"])
    patch_model(scaled, rope=from_hf(scaled.config))  # the same factor: accepted


def test_the_reading_is_the_rope_slice():
    cfg = tiny(CASES["yarn_mscale_ratio"]).config
    rope = from_hf(cfg)
    assert rope.rotary_dim == cfg.qk_rope_head_dim
    inv_freq, factor = rope.frequencies()
    hf = transformers.DeepseekV3ForCausalLM(cfg).model.rotary_emb
    assert torch.allclose(inv_freq.float(), hf.inv_freq, rtol=1e-6) and factor == pytest.approx(hf.attention_scaling)
