"""posenc.hf.attention: transformers' SDPA with the key/value heads expanded (float32 on CUDA).

On this CPU-only suite the function is checked against transformers' own SDPA and eager
attention on a tiny grouped-query Llama (prefill, padding, decoding with a cache, a method on
top), and the rule that picks it is checked for every device/dtype/choice. Its reason to exist,
the memory of a float32 forward on CUDA, was seen on an H100 (module docstring).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from posenc.hf import patch_model, unpatch_model
from posenc.hf.attention import ATTENTION_NAME, attention_for, register
from tests.hf_helpers import VOCAB, rel, tokens


def tiny(attn: str, seed: int = 0):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                                   initializer_range=0.3, attn_implementation=attn)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def expanded(seed: int = 0):
    register()
    model = tiny("sdpa", seed)
    model.set_attn_implementation(ATTENTION_NAME)
    return model


@pytest.mark.parametrize("device,dtype,chosen,want", [
    ("cuda", torch.float32, "sdpa", ATTENTION_NAME),
    ("cuda:1", torch.float32, "sdpa", ATTENTION_NAME),
    ("cuda", torch.float64, "sdpa", ATTENTION_NAME),
    ("cuda", torch.bfloat16, "sdpa", None),  # flash takes 16-bit GQA as it is
    ("cuda", torch.float16, "sdpa", None),
    ("cpu", torch.float32, "sdpa", None),  # the CPU kernels take enable_gqa (no T^2 tensor)
    ("cuda", torch.float32, "eager", None),  # not transformers' SDPA: left alone
    ("cuda", torch.float32, "flex_attention", None),
    ("cuda", torch.float32, None, None),
])
def test_attention_for(device, dtype, chosen, want):
    assert attention_for(device, dtype, chosen) == want


def test_prefill_equals_transformers_sdpa_and_eager():
    ids = tokens(2, 24)
    with torch.no_grad():
        want = tiny("sdpa")(ids).logits
        eager = tiny("eager")(ids).logits
        got = expanded()(ids).logits
    assert rel(got, want) < 1e-6 and rel(got, eager) < 1e-5


def test_padding_and_cached_decoding_equal_transformers_sdpa():
    ids = tokens(2, 20, seed=3)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding: a mask reaches SDPA
    outs = []
    for model in (tiny("sdpa"), expanded()):
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                 pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        outs.append(out)
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    for a, b in zip(outs[0].scores, outs[1].scores):
        assert rel(b, a) < 1e-5


def test_a_method_on_top_restores_the_expanded_attention():
    model = expanded()
    ids = tokens(1, 24, seed=5)
    with torch.no_grad():
        before = model(ids).logits
        patch_model(model, method="rerope", window=4)
        assert model.config._attn_implementation != ATTENTION_NAME
        assert not torch.equal(model(ids).logits, before)  # a window of 4 in 24 tokens changes the logits
        unpatch_model(model)
        assert model.config._attn_implementation == ATTENTION_NAME
        assert torch.equal(model(ids).logits, before)


def test_registered_names_are_transformers_own():
    register()
    register()  # idempotent
    assert ATTENTION_NAME in transformers.AttentionInterface._global_mapping
