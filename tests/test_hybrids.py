"""NoPE/RoPE hybrids in posenc's own model: ``ModelConfig.layer_pattern`` (LayerSpec: encoding +
mask kind), the named patterns of ``posenc.hybrids`` against transformers' own layer rules, each
layer receiving its own mask (``nope_temperature``, the encoding of Llama 4's NoPE layers, is
tested in test_nope_temperature.py).

The registry-parametrized suites (test_backends, test_invariance, test_modes) run every named
hybrid too (``helpers.tiny_model`` builds them, shrunk to tiny windows).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from helpers import hybrid_pattern, tiny_model
from posenc import ModelConfig, SequenceInfo, Transformer
from posenc.hybrids import HYBRIDS, cohere2, gemma3, interleave, llama4, smollm3
from posenc.model_config import ATTENTION_KINDS, EncodingSpec, LayerSpec

V = 64


def _cfg(pattern, n_layer=4, **over) -> ModelConfig:
    return ModelConfig(vocab_size=V, d_model=32, n_head=4, n_layer=n_layer, layer_pattern=pattern, **over)


# ---- the configuration ------------------------------------------------------------------------
def test_hybrids_table_is_not_empty_and_every_entry_builds_a_model():
    assert set(HYBRIDS) >= {"llama4", "smollm3", "cohere2", "gemma3"}
    for name, fn in HYBRIDS.items():
        kinds = _cfg(fn(every=4), n_layer=8).layer_kinds()
        last = [(i + 1) % 4 == 0 for i in range(8)]  # the global layer ends each cycle
        nope = [k.encoding is None or k.encoding.name == "nope_temperature" for k in kinds]
        assert nope == (last if name != "gemma3" else [False] * 8), name
        assert all(k.attention == "global" for k, g in zip(kinds, last) if g), name
        assert {k.attention for k in kinds} <= set(ATTENTION_KINDS)


@pytest.mark.parametrize("n_layer", [6, 18])
def test_gemma3_layers_and_bases_match_transformers(n_layer):
    """Gemma3TextConfig's layer_types (every 6th layer full) and its rope_parameters per layer
    type (sliding base 1e4, full 1e6), layer by layer; the window is the one given."""
    from transformers import Gemma3TextConfig

    hf = Gemma3TextConfig(num_hidden_layers=n_layer, sliding_window=512)
    kinds = _cfg(gemma3(window=hf.sliding_window), n_layer=n_layer).layer_kinds()
    assert [f"{k.attention}_attention" if k.attention == "sliding" else "full_attention" for k in kinds] == hf.layer_types
    for k, t in zip(kinds, hf.layer_types):
        assert k.encoding == EncodingSpec.of("rope", base=hf.rope_parameters[t]["rope_theta"])
    assert {k.size for k in kinds if k.attention == "sliding"} == {512}


def test_gemma3_pattern_gives_each_layer_type_its_own_rope():
    """A model built from gemma3(): one RoPE module per layer type, each at its own base, and the
    layers use them in the pattern's order."""
    model = Transformer(_cfg(gemma3(every=3, window=4), n_layer=6))
    bases = [model.encoding_of(i).config.base for i in range(6)]
    assert bases == [1e4, 1e4, 1e6] * 2
    assert model.encoding_of(0) is model.encoding_of(1) and model.encoding_of(0) is not model.encoding_of(2)


def test_pattern_repeats_and_is_cut_at_n_layer():
    a, b = LayerSpec("rope", "sliding", 16), LayerSpec(None)
    cfg = _cfg((a, a, b), n_layer=7)
    assert cfg.layer_kinds() == [a, a, b, a, a, b, a]
    assert cfg.layer_specs() == [EncodingSpec("rope")] * 2 + [None] + [EncodingSpec("rope")] * 2 + [None, EncodingSpec("rope")]


@pytest.mark.parametrize("n_layer", [4, 8, 48])
def test_llama4_layers_match_transformers(n_layer):
    """Llama4TextConfig's defaults (no_rope_layer_interval 4, attention_chunk_size 8192):
    which layers rotate and which are chunked, layer by layer."""
    from transformers import Llama4TextConfig

    hf = Llama4TextConfig(num_hidden_layers=n_layer)
    kinds = _cfg(llama4(), n_layer=n_layer).layer_kinds()
    assert [int(k.encoding is not None and k.encoding.name == "rope") for k in kinds] == hf.no_rope_layers
    assert [f"{k.attention}_attention" if k.attention == "chunked" else "full_attention" for k in kinds] == hf.layer_types
    assert {k.size for k in kinds if k.attention == "chunked"} == {hf.attention_chunk_size}
    nope = {k.encoding for k in kinds if k.attention == "global"}
    assert nope == {EncodingSpec.of("nope_temperature", floor_scale=hf.floor_scale, attn_scale=hf.attn_scale)}
    assert hf.attn_temperature_tuning


def test_smollm3_and_cohere2_layers_match_transformers():
    from transformers import Cohere2Config, SmolLM3Config

    hf = SmolLM3Config(num_hidden_layers=12)
    kinds = _cfg(smollm3(), n_layer=12).layer_kinds()
    assert [int(k.encoding is not None) for k in kinds] == hf.no_rope_layers
    assert {k.attention for k in kinds} == {"global"}
    hf = Cohere2Config(num_hidden_layers=8)
    kinds = _cfg(cohere2(window=hf.sliding_window), n_layer=8).layer_kinds()
    assert [f"{k.attention}_attention" if k.attention == "sliding" else "full_attention" for k in kinds] == hf.layer_types
    # Cohere2 rotates only on its sliding layers (modeling_cohere2: `if self.sliding_window is not None`).
    assert [k.encoding is not None for k in kinds] == [t == "sliding_attention" for t in hf.layer_types]


def test_layer_pattern_round_trips_through_to_dict():
    cfg = _cfg(llama4(chunk=64), n_layer=4)
    again = ModelConfig(**cfg.to_dict())
    assert again.layer_pattern == cfg.layer_pattern and again.layer_kinds() == cfg.layer_kinds()


@pytest.mark.parametrize("make,error,msg", [
    (lambda: LayerSpec("rope", "local", 4), ValueError, r"attention must be one of 'global', 'sliding', 'chunked'; got 'local'"),
    (lambda: LayerSpec("rope", "sliding"), ValueError, r"size must be given for attention='sliding' \(the window in keys\)"),
    (lambda: LayerSpec("rope", "chunked", 0), ValueError, r"size must be >= 1, got 0"),
    (lambda: LayerSpec("rope", "global", 8), ValueError, r"size must be None for attention='global'"),
    (lambda: LayerSpec("rope", "sliding", 4.0), TypeError, r"size must be an int or None, got float 4.0"),
    (lambda: LayerSpec("ropee"), ValueError, r"encoding: unknown encoding 'ropee'"),
    (lambda: _cfg((LayerSpec("rope"),) * 5), ValueError, r"layer_pattern must have 1 to n_layer \(4\) entries"),
    (lambda: _cfg(()), ValueError, r"layer_pattern must have 1 to n_layer \(4\) entries .*got 0"),
    (lambda: _cfg((LayerSpec("rope"),), layer_encodings=("rope",) * 4), ValueError,
     r"layer_pattern gives every layer's encoding; layer_encodings must be unset"),
    (lambda: _cfg((LayerSpec("rope"),), encoding_config={"base": 1e4}), ValueError,
     r"encoding_config must be unset with it"),
    (lambda: _cfg(({"encoding": "rope", "attention": "sliding"},)), ValueError,
     r"layer_pattern\[0\]: size must be given for attention='sliding'"),
    (lambda: _cfg(({"encoding": "rope", "window": 4},)), ValueError,
     r"layer_pattern\[0\] takes the keys 'encoding' \(required\), 'attention' and 'size', got 'encoding', 'window'"),
    (lambda: _cfg(("rope",)), TypeError, r"layer_pattern\[0\] must be a LayerSpec or a dict, got str 'rope'"),
    (lambda: interleave(LayerSpec("rope"), LayerSpec(None), 0), ValueError, r"every must be >= 1, got 0"),
])
def test_bad_patterns_are_refused_by_name(make, error, msg):
    with pytest.raises(error, match=msg):
        make()


# ---- the model: each layer its own mask ---------------------------------------------------------
def test_each_layer_attends_under_its_own_mask():
    pattern = (LayerSpec("rope", "chunked", 4), LayerSpec("alibi", "sliding", 3), LayerSpec("nope_temperature"),
               LayerSpec("alibi"))
    model = Transformer(_cfg(pattern)).eval()
    seen = []
    hooks = [b.attn.register_forward_hook(lambda m, args, kw, out: seen.append(args[1].mask), with_kwargs=True)
             for b in model.blocks]
    with torch.no_grad():
        model(torch.randint(0, V, (2, 9)))
    for h in hooks:
        h.remove()
    assert [(m.window, m.chunk) for m in seen] == [(None, 4), (3, None), (None, None), (None, None)]
    assert seen[2] is seen[3]  # global layers share the forward's mask (and its memoized forms)


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
def test_a_bias_shared_by_a_sliding_and_a_global_layer_equals_a_slow_model(impl, monkeypatch):
    """ALiBi (one shared module) under a window on layer 0 and globally on layer 1: the model's
    forward equals a forward written out layer by layer with the loop's masks."""
    from posenc.backends import flex

    monkeypatch.setattr(flex, "COMPILE", False)
    from test_masks_window import reference_mask

    pattern = (LayerSpec("alibi", "sliding", 3), LayerSpec("alibi"))
    model = Transformer(_cfg(pattern, n_layer=2, attn_impl=impl)).double().eval()
    assert len(model.encodings) == 1
    tokens = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(0))
    seq = SequenceInfo.from_padding_mask(torch.tensor([[0, 0] + [1] * 8, [1] * 10]))
    with torch.no_grad():
        got = model(tokens, seq)
        x = model.tok_emb(tokens)
        bias = model.encodings[0].logit_bias().dense(seq.positions, seq.positions)  # (B, H, T, T)
        for layer, block in enumerate(model.blocks):
            a = block.attn
            h = block.ln1(x)
            q, k, v = (p(h).view(2, 10, 4, 8).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
            allowed = reference_mask(seq, seq, True, window=3 if layer == 0 else None)
            logits = (q @ k.transpose(-1, -2) / math.sqrt(8) + bias).masked_fill(~allowed, float("-inf"))
            out = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(2, 10, 32)
            x = x + a.o_proj(out)
            x = x + block.mlp(block.ln2(x))
        want = model.head(model.ln_f(x))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_hybrid_decodes_step_by_step_past_its_window(name):
    """KV-cache decoding one token at a time, far past the window / chunk (3), equals the full
    forward; and the local layers matter (a global model of the same weights differs)."""
    model = tiny_model(name, n_layer=4)
    tokens = torch.randint(0, V, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        parts = [model(tokens[:, :2], cache=cache)] + [model(tokens[:, t:t + 1], cache=cache) for t in range(2, 17)]
        torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
        if any(k.size for k in model.cfg.layer_kinds()):
            wide = dataclasses.replace(model.cfg, layer_pattern=tuple(
                dataclasses.replace(k, attention="global", size=None) for k in model.cfg.layer_pattern))
            other = Transformer(wide).eval()
            other.load_state_dict(model.state_dict())
            assert (other(tokens) - full).abs().max() > 1e-3


def test_hybrid_pattern_helper_shrinks_every_local_layer():
    for name in HYBRIDS:
        pattern = hybrid_pattern(name)
        assert len(pattern) == 2 and pattern[-1].attention == "global"
        assert all(k.size in (None, 3) for k in pattern)


def test_an_all_sliding_model_decodes_with_a_cache_of_window_minus_one_keys():
    """docs/new_encodings.md: with every layer sliding, ``new_cache(max_length=window - 1)``
    keeps all a query can see; decoding past it equals the full forward."""
    model = Transformer(_cfg((LayerSpec("rope", "sliding", 4), LayerSpec("alibi", "sliding", 4)), n_layer=2)).eval()
    tokens = torch.randint(0, V, (2, 15), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache(max_length=3)
        parts = [model(tokens[:, :5], cache=cache)] + [model(tokens[:, t:t + 1], cache=cache) for t in range(5, 15)]
    assert max(c.n for c in cache.layers) <= 4
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_the_docs_example_runs():
    """The python block of docs/new_encodings.md's hybrids section, as written."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "new_encodings.md").read_text()
    section = text.split("## NoPE/RoPE hybrids", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(block, scope)
    assert [k.attention for k in scope["model"].cfg.layer_kinds()] == ["chunked"] * 3 + ["global"] + ["chunked"] * 3 + ["global"]


@pytest.mark.parametrize("name", ["llama4", "cohere2"])
def test_long_hybrid_takes_the_local_leaf_and_decodes_like_the_full_forward(name, plans):
    """Past 128 tokens the sliding / chunked layers run in row blocks (SDPA_LOCAL_ROWS); a
    prefill of 200 then 100 single steps equals that forward."""
    from posenc.backends import Leaf

    pattern = tuple(dataclasses.replace(k, size=50) if k.size else k for k in HYBRIDS[name](every=2))
    model = Transformer(_cfg(pattern, n_layer=2)).eval()
    tokens = torch.randint(0, V, (1, 300), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = model(tokens)
        assert Leaf.SDPA_LOCAL_ROWS in {p.leaf for p in plans}
        cache = model.new_cache()
        parts = [model(tokens[:, :200], cache=cache)] + [model(tokens[:, t:t + 1], cache=cache) for t in range(200, 300)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("make,error,msg", [
    (lambda: llama4(rope="ropee"), ValueError, r"^rope: unknown encoding 'ropee'"),
    (lambda: smollm3(rope=5), TypeError, r"^rope must be an EncodingSpec, an encoding name, a dict with 'name', or None; got int 5$"),
    (lambda: cohere2(rope={"name": "rope", "base": -1.0}), ValueError, r"^rope: base must be > 0, got -1.0$"),
    (lambda: llama4(rope={"name": "rope", "bogus": 1}), TypeError, r"^rope: unknown key 'bogus' for encoding 'rope'"),
    (lambda: gemma3(local_base=1.0), ValueError, r"^local_base: base must be != 1 .*got 1.0$"),
    (lambda: gemma3(global_base=1.0), ValueError, r"^global_base: base must be != 1 .*got 1.0$"),
    (lambda: gemma3(local_base="x"), TypeError, r"^local_base must be a number, got str 'x'$"),
    (lambda: llama4(temperature="no"), TypeError, r"^temperature must be a bool, got str 'no'$"),
    (lambda: llama4(temperature=0), TypeError, r"^temperature must be a bool, got int 0$"),
])
def test_pattern_functions_name_their_own_parameter(make, error, msg):
    """A bad ``rope`` / ``local_base`` is refused naming the pattern function's parameter, not
    the ``encoding`` or ``base`` of the LayerSpec it becomes; a truthy non-bool temperature is
    not taken as True."""
    with pytest.raises(error, match=msg):
        make()


def test_pattern_functions_keep_their_good_parameters():
    assert llama4(temperature=False)[-1].encoding is None
    assert llama4()[-1].encoding.name == "nope_temperature"
    assert smollm3(rope={"name": "rope", "base": 5e5})[0].encoding == EncodingSpec.of("rope", base=5e5)
    assert dict(gemma3(local_base=2e4)[0].encoding.config) == {"base": 2e4}
