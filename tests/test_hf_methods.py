"""posenc.hf.methods: Self-Extend, (leaky) ReRoPE and Dual Chunk Attention on tiny random Llama and Qwen2 models through
``patch_model(model, method=...)``, against a forward written from the weights with the slow loop
over each paper's formula, and the properties a user relies on: decoding = the full forward,
left padding = the row alone, packed = separate, a window past the sequence = the plain model,
unpatching = the model as it was, and no (T, T) tensor at 2048 tokens."""

from __future__ import annotations

import pytest
import torch
import transformers

from posenc.hf import patch_model, patch_model as _patch, unpatch_model
from posenc.hf.methods import ATTENTION_NAME, MethodRotary, installed_method, key_positions
from tests.hf_helpers import VOCAB, logits, rel, tokens
from tests.methods_reference import dual_chunk_pair, rerope_pair, self_extend_pair, slow_attention
from tests.test_methods_blockwise import LargestTensor

FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
}
METHODS = {  # name -> (patch_model keywords, the slow loop's position pair)
    "self_extend": (dict(method="self_extend", group_size=3, neighbor_window=4), self_extend_pair(3, 4)),
    "rerope": (dict(method="rerope", window=3), rerope_pair(3)),
    "leaky_rerope": (dict(method="rerope", window=4, slope=0.25), rerope_pair(4, 0.25)),
    "dual_chunk": (dict(method="dual_chunk", chunk_size=5, local_size=2), dual_chunk_pair(5, 2)),
}


def tiny(family: str = "llama", attn: str = "sdpa", seed: int = 0):
    cfg_cls, model_cls = FAMILIES[family]
    # a wide init makes attention peaky, so that the methods' logits differ visibly from RoPE's
    cfg = cfg_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3,
                  attn_implementation=attn)
    torch.manual_seed(seed)
    return model_cls(cfg).eval()


def reference_logits(model, ids, rope, pair, position_ids=None, visible=None):
    """The model's forward written from its weights, attention by the slow loop over ``pair``."""
    base = model.model
    B, T = ids.shape
    pos = torch.arange(T).expand(B, T) if position_ids is None else position_ids
    inv, factor = rope.frequencies(int(pos.max()) + 1)
    with torch.no_grad():
        x = base.embed_tokens(ids)
        for layer in base.layers:
            a, h = layer.self_attn, layer.input_layernorm(x)
            q, k, v = (p(h).view(B, T, -1, a.head_dim).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
            o = slow_attention(q, k, v, pos, pos, inv, pair, scale=a.scaling, factor=factor, visible=visible)
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, T, -1).to(x.dtype))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return model.lm_head(base.norm(x))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", METHODS)
def test_logits_equal_the_reference_built_from_the_weights(family, name):
    model, ids = tiny(family), tokens(2, 14)
    kw, pair = METHODS[name]
    plain = logits(model, ids)
    rope = patch_model(model, **kw, block_rows=5)
    assert model.config._attn_implementation == ATTENTION_NAME and installed_method(model).name == kw["method"]
    got = logits(model, ids)
    assert rel(got, reference_logits(model, ids, rope, pair)) < 1e-4
    assert rel(got, plain) > 1e-2  # the method is in effect


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", METHODS)
def test_decoding_with_the_kv_cache_equals_the_full_forward(family, name):
    model, ids = tiny(family), tokens(2, 20, seed=2)
    patch_model(model, **METHODS[name][0])
    full = logits(model, ids)
    cache = transformers.DynamicCache(config=model.config)
    steps = []
    with torch.no_grad():
        for a, b in [(0, 9), (9, 12), *((t, t + 1) for t in range(12, 20))]:  # a prefill, a chunk, single steps
            steps.append(model(ids[:, a:b], cache=cache, use_cache=True).logits)
    assert rel(torch.cat(steps, dim=1), full) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_with_left_padding_equals_each_row_alone(family):
    model, ids = tiny(family), tokens(2, 10, seed=3)
    patch_model(model, method="self_extend", group_size=2, neighbor_window=3)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # row 0: 3 pad tokens, then 7 real ones
    kw = dict(max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0, return_dict_in_generate=True,
              output_logits=True)
    with torch.no_grad():
        both = model.generate(ids, attention_mask=mask, **kw)
        alone = model.generate(ids[:1, 3:], **kw)
    assert torch.equal(both.sequences[0, 10:], alone.sequences[0, 7:])
    assert rel(torch.stack(both.logits)[:, 0], torch.stack(alone.logits)[:, 0]) < 1e-5


@pytest.mark.parametrize("name", METHODS)
def test_packed_documents_equal_separate_forwards(name):
    model = tiny("qwen2")
    patch_model(model, **METHODS[name][0])
    a, b = tokens(1, 9, seed=4), tokens(1, 7, seed=5)
    # transformers finds packed documents from position_ids only without a cache (a training forward)
    packed = logits(model, torch.cat((a, b), 1), position_ids=torch.cat((torch.arange(9), torch.arange(7)))[None],
                    use_cache=False)
    assert rel(packed[:, :9], logits(model, a)) < 1e-5
    assert rel(packed[:, 9:], logits(model, b)) < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kw", [dict(method="self_extend", group_size=4, neighbor_window=16),
                                dict(method="rerope", window=16), dict(method="rerope", window=40, slope=0.5),
                                dict(method="dual_chunk", chunk_size=20, local_size=4)])
@pytest.mark.parametrize("scaling", [{}, dict(scaling="yarn", factor=2.0, original_max_position_embeddings=8)])
def test_a_window_past_the_sequence_equals_the_plain_patched_model(family, kw, scaling):
    model, ids = tiny(family), tokens(2, 16, seed=6)
    patch_model(model, **scaling)
    plain = logits(model, ids)
    patch_model(model, **kw, **scaling)
    assert rel(logits(model, ids), plain) < 1e-5


def test_the_method_composes_with_a_scaling():
    model, ids = tiny("llama"), tokens(2, 14)
    kw, pair = METHODS["self_extend"]
    rope = patch_model(model, **kw, scaling="yarn", factor=4.0, original_max_position_embeddings=8)
    assert rope.attention_factor > 1.0  # YaRN's temperature reaches the logits
    assert rel(logits(model, ids), reference_logits(model, ids, rope, pair)) < 1e-4


def test_unpatching_gives_back_the_model_as_it_was():
    model, ids = tiny("llama", attn="eager"), tokens(2, 12)
    before, keys, rotary = logits(model, ids), set(model.state_dict()), model.model.rotary_emb
    patch_model(model, method="rerope", window=3)
    assert isinstance(model.model.rotary_emb, MethodRotary) and set(model.state_dict()) == keys
    patch_model(model, method="self_extend", group_size=2, neighbor_window=3)  # a second method replaces the first
    assert installed_method(model).name == "self_extend"
    assert unpatch_model(model)
    assert model.model.rotary_emb is rotary and model.config._attn_implementation == "eager"
    assert not any(hasattr(layer.self_attn, "posenc_method") for layer in model.model.layers)
    assert torch.equal(logits(model, ids), before)


def test_patching_again_without_a_method_keeps_posenc_rope_alone():
    model, ids = tiny("qwen2"), tokens(2, 12)
    patch_model(model)
    plain = logits(model, ids)
    patch_model(model, method="rerope", window=2)
    patch_model(model)
    assert installed_method(model) is None and model.config._attn_implementation == "sdpa"
    assert torch.equal(logits(model, ids), plain)


def test_cached_key_positions_follow_left_padding():
    # row 0: two pad tokens, then positions 0, 1; the query (position 2) is the last key
    pid = torch.tensor([[2], [4]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None]
    assert key_positions(pid, mask, 5).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert key_positions(pid[1:], None, 5).tolist() == [[0, 1, 2, 3, 4]]
    # a key the query does not see inside the stream: the keys before it keep their own positions
    hole = torch.tensor([[1, 1, 0, 1, 1]], dtype=torch.bool)[:, None, None]
    assert key_positions(torch.tensor([[3]]), hole, 5).tolist() == [[0, 1, 1, 2, 3]]


@pytest.mark.parametrize("name", METHODS)
def test_decoding_past_a_masked_token_equals_the_full_forward(name):
    # a token masked out inside the stream (position ids count the others): the cached keys'
    # positions must come from the mask, not from their index
    model, ids = tiny("llama"), tokens(1, 14, seed=8)
    patch_model(model, **METHODS[name][0])
    mask = torch.ones_like(ids)
    mask[0, 4] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    full = logits(model, ids, attention_mask=mask, position_ids=pos, use_cache=False)
    cache, steps = transformers.DynamicCache(config=model.config), []
    with torch.no_grad():
        for a, b in [(0, 8), *((t, t + 1) for t in range(8, 14))]:
            steps.append(model(ids[:, a:b], attention_mask=mask[:, :b], position_ids=pos[:, a:b], cache=cache,
                               use_cache=True).logits)
    keep = mask[0].bool()
    assert rel(torch.cat(steps, dim=1)[:, keep], full[:, keep]) < 1e-5


def test_no_t_by_t_tensor_in_a_patched_forward_at_2048_tokens():
    T = 2048
    model, ids = tiny("llama"), tokens(1, T, seed=7)
    with torch.no_grad(), LargestTensor() as plain:  # the recorder sees the plain eager model's (T, T) scores
        model.set_attn_implementation("eager")
        model(ids)
    assert plain.largest >= T * T
    patch_model(model, method="self_extend", group_size=4, neighbor_window=256, block_rows=128)
    with torch.no_grad(), LargestTensor() as rec:
        model(ids)
    assert rec.largest <= 4 * 128 * T  # one block of 4 heads x 128 rows x T keys: an eighth of T * T


@pytest.mark.parametrize("kw,err,match", [
    (dict(method="yarn"), ValueError, r"method must be one of 'self_extend', 'rerope', 'dual_chunk'; got 'yarn'"),
    (dict(method="self_extend", group_size=0, neighbor_window=4), ValueError, r"group_size must be in \[1, "),
    (dict(method="self_extend", group_size=2, neighbor_window=4, window=3), ValueError,
     r"window is a parameter of method 'rerope', not 'self_extend'"),
    (dict(group_size=2), ValueError, r"group_size is a parameter of an attention method: pass method="),
    (dict(method="rerope", window=2, block_rows=0), ValueError, r"block_rows must be an int >= 1"),
    (dict(method="rerope", window=2, factor=2.0, scaling="bogus"), ValueError, r"scaling"),
])
def test_bad_arguments_leave_the_model_as_it_was(kw, err, match):
    model = tiny("llama")
    rotary = model.model.rotary_emb
    with pytest.raises(err, match=match):
        _patch(model, **kw)
    assert model.model.rotary_emb is rotary and model.config._attn_implementation == "sdpa"


def test_an_unsupported_model_type_is_refused():
    model = transformers.GemmaForCausalLM(transformers.GemmaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=32))
    with pytest.raises(ValueError, match=r"model_type must be one of llama, mistral, qwen2, qwen3 for method=..."):
        patch_model(model, method="rerope", window=4)
