"""NoPE/RoPE hybrids in posenc.hf: SmolLM3 and Llama 4 (``no_rope_layers``: every 4th layer
NoPE; Llama 4's RoPE layers in chunked attention, its NoPE layers' query temperature
``log1p(floor((t + 1) / floor_scale)) * attn_scale + 1``), Cohere2 (sliding-window RoPE layers,
global NoPE layers), on tiny random models built with transformers.

``layer_ropes`` is checked against the models' own attention layers (which of them rotate);
``patch_model`` against the unpatched model (same config => same logits, with packing, left
padding and cached decoding) and against transformers' model built with another base or rope
type and the same weights. The sequences (24 tokens) are longer than the chunks and windows (8),
and floor_scale (4) is small, so the masks and the temperature all act.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")

from posenc.encoding import Dims  # noqa: E402
from posenc.hf import patch_model, patched_rope, unpatch_model  # noqa: E402
from posenc.rotary import RotaryConfig, RotaryEmbedding, from_hf  # noqa: E402
from posenc.rotary.hf_config import layer_ropes  # noqa: E402

from hf_helpers import generate_unpatched_then_patched, logits, rel, tokens  # noqa: E402

VOCAB, L, T, WINDOW = 64, 32, 24, 8
_SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
              num_hidden_layers=4, max_position_embeddings=L, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
FAMILIES = {  # model_type -> (config class, causal LM class, config kwargs)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM",
                    dict(head_dim=8, intermediate_size_mlp=64, num_local_experts=2, attention_chunk_size=WINDOW,
                         floor_scale=4, attn_scale=0.5, attn_temperature_tuning=True)),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=WINDOW)),
}
ALL_NOPE = {"smollm3": dict(no_rope_layers=[0, 0, 0, 0]), "llama4_text": dict(no_rope_layers=[0, 0, 0, 0]),
            "cohere2": dict(layer_types=["full_attention"] * 4)}


def config(name: str, **over):
    cfg_cls, _, kw = FAMILIES[name]
    return getattr(transformers, cfg_cls)(**(_SIZES | kw | over))


def make(name: str, **over) -> torch.nn.Module:
    torch.manual_seed(0)
    return getattr(transformers, FAMILIES[name][1])(config(name, **over)).eval()


def twin(model, name: str, **over) -> torch.nn.Module:
    """transformers' own model with ``over`` in its config and ``model``'s weights."""
    other = make(name, **over)
    other.load_state_dict(model.state_dict())
    return other


def rotates(name: str, attn: torch.nn.Module) -> bool:
    """Whether transformers' attention layer applies RoPE (its own flag)."""
    return bool(attn.use_rope) if name != "cohere2" else attn.sliding_window is not None


@pytest.mark.parametrize("name", list(FAMILIES))
def test_layer_ropes_say_which_layers_rotate_as_the_attention_layers_do(name):
    for over in ({}, ALL_NOPE[name]):
        model = make(name, **over)
        ropes = layer_ropes(model.config)
        flags = [rotates(name, layer.self_attn) for layer in model.model.layers]
        assert [r is not None for r in ropes] == flags
        if not over:
            assert flags == [True, True, True, False]  # every 4th layer NoPE, each family's default
            rope = from_hf(model.config)
            assert all(r is None or torch.equal(r.inv_freq, rope.inv_freq) for r in ropes)
            hf_rotary = model.model.rotary_emb
            torch.testing.assert_close(rope.inv_freq, hf_rotary.inv_freq.double(), rtol=1e-6, atol=0)
            assert rope.config.layout == ("half" if name == "smollm3" else "interleaved")
    smol = layer_ropes(config("smollm3", no_rope_layers=[0, 1, 1, 0]))
    assert [r is not None for r in smol] == [False, True, True, False]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_same_config_same_logits_and_unpatch_restores_bitwise(name):
    model = make(name)
    original = model.model.rotary_emb
    ids = tokens(2, T)
    packed = torch.tensor([[*range(10), *range(14)], [*range(T)]])
    mask = torch.tensor([[0, 0, 0, *[1] * (T - 3)], [1] * T])
    padded = (mask.cumsum(-1) - 1).clamp(min=0)
    cases = [{}, {"position_ids": packed}, {"attention_mask": mask, "position_ids": padded}]
    want = [logits(model, ids, **kw) for kw in cases]
    assert rel(want[1], want[0]) > 1e-3
    rope = patch_model(model)
    assert rope is patched_rope(model) and rope.config == from_hf(model.config).config
    for kw, w in zip(cases, want):
        assert rel(logits(model, ids, **kw), w) <= 1e-5, list(kw)
    assert unpatch_model(model) is True and model.model.rotary_emb is original
    for kw, w in zip(cases, want):
        assert torch.equal(logits(model, ids, **kw), w)


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("over,rope_parameters", [
    ({"base": 123.0}, {"rope_theta": 123.0}),
    ({"scaling": "yarn", "factor": 4.0}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L}),
])
def test_new_rope_equals_transformers_with_it_and_nope_layers_stay_nope(name, over, rope_parameters):
    """patch_model(base= / scaling=) = transformers' model with that rope_parameters (same
    weights): the RoPE layers take the new frequencies in the family's form (half, interleaved,
    complex), the NoPE layers stay NoPE in both."""
    model = make(name)
    hf = twin(model, name, rope_parameters=dict(model.config.rope_parameters) | rope_parameters)
    ids = tokens(2, T, seed=2)
    want = logits(hf, ids)
    assert rel(want, logits(model, ids)) > 1e-4
    patch_model(model, **over)
    assert rel(logits(model, ids), want) <= 1e-5


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_model_of_nope_layers_only_ignores_the_patched_rope(name):
    """No layer rotates, so no RoPE (here a base of 7) can change a logit: bit for bit."""
    model = make(name, **ALL_NOPE[name])
    ids = tokens(2, T, seed=3)
    want = logits(model, ids)
    patch_model(model, base=7.0)
    assert torch.equal(logits(model, ids), want)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_generate_with_cache_and_left_padding_equals_unpatched(name):
    model = make(name)
    want, got = generate_unpatched_then_patched(model, tokens(2, 12, seed=4), pad=5)
    assert torch.equal(got.sequences, want.sequences) and len(got.logits) == 6
    assert all(rel(g, w) <= 1e-5 for g, w in zip(got.logits, want.logits))


def test_llama4_temperature_tuning_and_chunks_act_in_these_comparisons():
    """The tiny Llama 4 is one where the NoPE layers' temperature and the chunked mask change
    the logits, so the equalities above run through them (transformers' own code, unpatched)."""
    model = make("llama4_text")
    ids = tokens(2, T, seed=5)
    want = logits(model, ids)
    assert rel(logits(twin(model, "llama4_text", attn_temperature_tuning=False), ids), want) > 1e-3
    assert rel(logits(twin(model, "llama4_text", attention_chunk_size=T), ids), want) > 1e-3
    patch_model(model, scaling="linear", factor=2.0)
    assert rel(logits(model, ids), want) > 1e-4  # and the RoPE layers take posenc's


def test_refusals():
    cohere = config("cohere2")
    with pytest.raises(ValueError, match=r"^layer type 'full_attention' of model_type 'cohere2' has no rotary "
                                         r"embedding \(NoPE\): only its 'sliding_attention' layers rotate$"):
        from_hf(cohere, layer_type="full_attention")
    assert from_hf(cohere, layer_type="sliding_attention").config == from_hf(cohere).config
    llama4 = config("llama4_text")  # its full-attention layers are its NoPE ones (layer 3 here)
    with pytest.raises(ValueError, match=r"^layer type 'full_attention' of model_type 'llama4_text' has no rotary "
                                         r"embedding \(NoPE\): no_rope_layers is 0 for each of its layers \[3\]$"):
        from_hf(llama4, layer_type="full_attention")
    assert from_hf(llama4, layer_type="chunked_attention").config == from_hf(llama4).config
    with pytest.raises(ValueError, match=r"^no_rope_layers must list one flag per layer \(1: RoPE, 0: NoPE; "
                                         r"num_hidden_layers = 4\), got \[1, 1, 0\]$"):
        layer_ropes(config("smollm3").to_dict() | {"no_rope_layers": [1, 1, 0]})
    with pytest.raises(ValueError, match=r"^no_rope_layers must list one flag per layer .*got \[1, 2, 1, 0\]$"):
        layer_ropes(config("llama4_text").to_dict() | {"no_rope_layers": [1, 2, 1, 0]})
    with pytest.raises(ValueError, match=r"^layer_type must be None for model_type 'llama4_text': one RoPE serves "
                                         r"all its layers"):
        patch_model(make("llama4_text"), layer_type="chunked_attention", base=2.0)
    half = RotaryEmbedding(RotaryConfig(rotary_dim=8, layout="half"), Dims(d_model=32, num_heads=4, head_dim=8))
    with pytest.raises(ValueError, match=r"^rope.layout must be 'interleaved', the checkpoint's \(model_type "
                                         r"'cohere2'\); got 'half'$"):
        patch_model(make("cohere2"), half)
