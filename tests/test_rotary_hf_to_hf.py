"""``to_hf`` (issue 13): a posenc RoPE written as Hugging Face ``rope_parameters``.

For every registered scaling: ``from_hf(to_hf(rope))`` rebuilds the same frequencies and
attention factor bit for bit (static NTK, which transformers lacks, to float64 rounding), and
transformers' own ``ROPE_INIT_FUNCTIONS`` given a config built from ``to_hf`` (an independent
implementation) compute the same inv_freq / attention factor to float32 rounding. Also: the
readings of per-layer-type ``rope_parameters`` (Gemma 3, ModernBERT) from raw dicts and from
``PretrainedConfig`` objects, against each family's own rotary module.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

import posenc  # noqa: E402
from posenc.rotary import SCALINGS, from_hf, to_hf  # noqa: E402

transformers.logging.set_verbosity_error()

g = torch.Generator().manual_seed(0)
# Per scaling, parameters that make it do something at head_dim 64 / rotary_dim 48 (values
# chosen by hand inside each type's bounds; LongRoPE factors random in [1, 9)).
PARAMS = {
    "default": {},
    "linear": {"factor": 4.5},
    "ntk": {"factor": 3.0},
    "dynamic": {"factor": 2.0, "original_max_position_embeddings": 512},
    "yarn": {"factor": 8.0, "original_max_position_embeddings": 1024, "beta_fast": 16.0, "mscale": 0.9,
             "mscale_all_dim": 0.7, "truncate": False},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
    "longrope": {"short_factor": (1 + 8 * torch.rand(32, generator=g)).tolist(),
                 "long_factor": (1 + 8 * torch.rand(32, generator=g)).tolist(),
                 "original_max_position_embeddings": 512, "factor": 16.0},
}
# Every scaling to_hf can write; one without hand-chosen parameters above (a newly registered
# one) is tested with its registry rule at 16 x a trained length of 512.
WRITABLE = [n for n, e in SCALINGS.items() if e.hf is not None or e.hf_default_base is not None]
# A scaling whose own parameter is spelled partial_rotary_factor (proportional's p) is written for
# a whole-head rotation only (test_a_partial_width_is_refused_where_the_width_key_is_taken).
TAKES_WIDTH_KEY = [n for n in WRITABLE if SCALINGS[n].hf and "partial_rotary_factor" in SCALINGS[n].hf.keys.values()]
CASES = [(name, r) for name in WRITABLE for r in (48, 64) if r == 64 or name not in TAKES_WIDTH_KEY]
LENGTHS = (None, 100, 512, 513, 5000)


def _rope(name: str, rotary_dim: int, **over):
    if name not in PARAMS:
        params = SCALINGS[name].at_factor(16.0, 512, rotary_dim, illustrate=True)
        return posenc.build("rope", d_model=256, num_heads=4, rotary_dim=rotary_dim, base=5e5, scaling=name,
                            **(params | over))
    params = copy.deepcopy(PARAMS[name])
    if name == "longrope":
        params = {k: v[: rotary_dim // 2] if isinstance(v, list) else v for k, v in params.items()}
    return posenc.build("rope", d_model=256, num_heads=4, rotary_dim=rotary_dim, base=5e5, scaling=name,
                        **(params | over))


def test_every_scaling_is_covered():
    assert set(PARAMS) <= set(SCALINGS) and set(PARAMS) <= set(WRITABLE)
    assert [e.name for e in SCALINGS.values() if e.hf is None and e.hf_default_base is None] == [
        n for n in SCALINGS if n not in WRITABLE]  # refused by to_hf (test_rotary_schema)


@pytest.mark.parametrize("name,rotary_dim", CASES)
def test_round_trip_is_exact(name, rotary_dim):
    rope = _rope(name, rotary_dim)
    hf = to_hf(rope)
    assert json.loads(json.dumps(hf)) == hf  # a config.json fragment
    back = from_hf(hf)
    assert back.rotary_dim == rotary_dim and back.dims.head_dim == 64 and back.config.layout == "half"
    for n in LENGTHS:
        (ours, af), (theirs, af_back) = rope.frequencies(n), back.frequencies(n)
        if SCALINGS[name].hf is None:  # written as 'default' with its hf_default_base (ntk: base s^(d/(d-2))): float64 rounding
            assert back.config.scaling == "default"
            torch.testing.assert_close(theirs, ours, rtol=1e-14, atol=0)
        else:
            assert back.config.scaling == name and torch.equal(theirs, ours)
        assert af_back == af
    assert rope.to_hf() == hf


def _transformers_frequencies(hf: dict, seq_len: int | None):
    """transformers' (inv_freq, attention factor) for a config holding ``to_hf``'s entries."""
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, **copy.deepcopy(hf))
    rope_type = cfg.rope_parameters["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    return ROPE_INIT_FUNCTIONS[rope_type](cfg, seq_len=seq_len)


@pytest.mark.parametrize("name,rotary_dim", CASES)
def test_transformers_computes_the_same_frequencies_from_to_hf(name, rotary_dim):
    rope = _rope(name, rotary_dim)
    hf = to_hf(rope)
    rope_type = hf["rope_parameters"]["rope_type"]
    if rope_type == "default" and rotary_dim != 64:  # default, and ntk written as it
        pytest.skip("transformers' Llama default RoPE rotates the whole head (partial_rotary_factor is not read)")
    if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
        # test_rotary_hf checks that every paper scaling is one transformers has
        pytest.skip(f"transformers has no rope type {rope_type!r} (a scaling registered beyond its own)")
    for n in LENGTHS:
        inv, af = _transformers_frequencies(hf, n)
        ours, our_af = rope.frequencies(n)
        # transformers rounds base ** float32(2i/d) to float32 (<= ~1e-6 relative at base 5e5).
        torch.testing.assert_close(ours.float(), inv.float(), rtol=2e-6, atol=0)
        assert our_af == pytest.approx(af, rel=1e-12)


def test_a_partial_width_is_refused_where_the_width_key_is_taken():
    assert TAKES_WIDTH_KEY == ["proportional"]
    for name in TAKES_WIDTH_KEY:
        with pytest.raises(ValueError, match=rf"^rotary_dim must be head_dim \(64\) to write rope type '{name}'.*got 48$"):
            to_hf(_rope(name, 48))


def test_to_hf_spelling():
    # Spelled out by hand from transformers 5's rope_parameters keys.
    assert to_hf(_rope("yarn", 64)) == {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "original_max_position_embeddings": 1024,
        "beta_fast": 16.0, "mscale": 0.9, "mscale_all_dim": 0.7, "truncate": False}, "head_dim": 64}
    # dynamic's trained length is transformers' max_position_embeddings (top level).
    assert to_hf(_rope("dynamic", 48)) == {"rope_parameters": {
        "rope_type": "dynamic", "rope_theta": 5e5, "factor": 2.0, "partial_rotary_factor": 0.75},
        "head_dim": 64, "max_position_embeddings": 512}
    # llama3's defaults are written: transformers requires low/high_freq_factor.
    llama3 = posenc.build("rope", d_model=64, num_heads=1, scaling="llama3", factor=8.0,
                          original_max_position_embeddings=8192).to_hf()["rope_parameters"]
    assert llama3["low_freq_factor"] == 1.0 and llama3["high_freq_factor"] == 4.0


@pytest.mark.parametrize("head_dim,rotary_dim", [(48, 16), (96, 32), (80, 24), (120, 8)])
def test_partial_rotary_factor_gives_the_width_back(head_dim, rotary_dim):
    rope = posenc.build("rope", d_model=head_dim, num_heads=1, rotary_dim=rotary_dim)
    frac = to_hf(rope)["rope_parameters"]["partial_rotary_factor"]
    assert int(head_dim * frac) == rotary_dim  # transformers' int(head_dim * partial_rotary_factor)
    assert from_hf(to_hf(rope)).rotary_dim == rotary_dim


def test_to_hf_refuses_what_transformers_cannot_express():
    with pytest.raises(ValueError, match=r"layout must be 'half' to write transformers rope_parameters.*"
                                         r"got 'interleaved'.*convert_qk_layout"):
        to_hf(posenc.build("rope", d_model=32, num_heads=2, layout="interleaved"))
    with pytest.raises(TypeError, match=r"rope must be a RotaryEmbedding .*got XPos"):
        to_hf(posenc.build("xpos", d_model=32, num_heads=2))
    with pytest.raises(TypeError, match=r"rope must be a RotaryEmbedding .*got str"):
        to_hf("rope")


# ---- per-layer-type rope_parameters, PretrainedConfig objects ------------------------------
def _modernbert(**kw):
    return transformers.ModernBertConfig(hidden_size=128, num_attention_heads=2, num_hidden_layers=3, **kw)


@pytest.mark.parametrize("layer_type", ["full_attention", "sliding_attention"])
@pytest.mark.parametrize("form", ["object", "to_dict", "hub"])
def test_modernbert_reads_each_layer_types_rope(layer_type, form):
    cfg = _modernbert(global_rope_theta=80_000.0, local_rope_theta=5_000.0)
    raw = {"object": cfg, "to_dict": cfg.to_dict(),
           # A Hub config.json (before transformers 5): top-level thetas, no rope_parameters.
           "hub": {"model_type": "modernbert", "hidden_size": 128, "num_attention_heads": 2,
                   "global_rope_theta": 80_000.0, "local_rope_theta": 5_000.0, "global_attn_every_n_layers": 3}}[form]
    rope = from_hf(raw, layer_type=layer_type)
    from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding

    hf = ModernBertRotaryEmbedding(cfg)
    assert rope.config.base == {"full_attention": 80_000.0, "sliding_attention": 5_000.0}[layer_type]
    torch.testing.assert_close(rope.inv_freq.float(), getattr(hf, f"{layer_type}_inv_freq"), rtol=2e-6, atol=0)
    assert rope.attention_factor == getattr(hf, f"{layer_type}_attention_scaling")
    with pytest.raises(ValueError, match=r"per layer type: pass layer_type= one of 'full_attention', "
                                         r"'sliding_attention'"):
        from_hf(raw)  # not a misleading "unknown key(s)"


def test_modernbert_defaults_and_hub_scaling_apply_to_both_layer_types():
    raw = {"model_type": "modernbert", "hidden_size": 128, "num_attention_heads": 2}
    assert from_hf(raw, layer_type="full_attention").config.base == 160_000.0  # ModernBertConfig.default_theta
    assert from_hf(raw, layer_type="sliding_attention").config.base == 10_000.0
    scaled = raw | {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}  # convert_rope_params_to_dict
    for layer_type in ("full_attention", "sliding_attention"):
        assert from_hf(scaled, layer_type=layer_type).config.scaling == "linear"
    with pytest.raises(ValueError, match=r"'rope_local_base_freq' not read for model_type 'modernbert'"):
        from_hf(raw | {"rope_local_base_freq": 1e4}, layer_type="full_attention")


@pytest.mark.parametrize("layer_type,base", [("full_attention", 1e6), ("sliding_attention", 1e4)])
def test_gemma3_pretrained_config_object_per_layer_type(layer_type, base):
    cfg = transformers.Gemma3TextConfig(hidden_size=128, num_attention_heads=2, head_dim=64,
                                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                            "rope_theta": 1e6},
                                                         "sliding_attention": {"rope_type": "default",
                                                                               "rope_theta": 1e4}})
    rope = from_hf(cfg, layer_type=layer_type)
    assert rope.config.base == base
    assert rope.config.scaling == ("linear" if layer_type == "full_attention" else "default")
    assert torch.equal(rope.inv_freq, from_hf(cfg.to_dict(), layer_type=layer_type).inv_freq)
