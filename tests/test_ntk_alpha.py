"""ntk_alpha (Hunyuan's NTK-alpha, vLLM's DynamicNTKAlphaRotaryEmbedding): against a slow loop
of base' = base * alpha^(d/(d-2)), against vLLM's float32 computation written out from its source
(vllm/model_executor/layers/rotary_embedding/dynamic_ntk_alpha_rope.py and base.py's
``_compute_inv_freq``, commit a42938c), against transformers' own Hunyuan code, and its config
refused by name. The registry-parametrized scaling tests run it too (invariances, purity, the
schema, to_hf)."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.rotary import SCALINGS, base_inv_freq, rope_frequencies, to_hf


def _slow(alpha: float, base: float, d: int) -> list[float]:
    """theta'_i = base'^(-2i/d), base' = base * alpha^(d/(d-2)), pair by pair in Python floats."""
    stretched = base * alpha ** (d / (d - 2))
    return [stretched ** (-2 * i / d) for i in range(d // 2)]


@pytest.mark.parametrize("d", [4, 8, 64, 128])
@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0, 1000.0])
@pytest.mark.parametrize("base", [10000.0, 5e5])
def test_frequencies_equal_a_slow_loop(d, alpha, base):
    inv, af = rope_frequencies("ntk_alpha", d, base, alpha=alpha)
    assert inv.dtype == torch.float64 and af == 1.0
    torch.testing.assert_close(inv, torch.tensor(_slow(alpha, base, d), dtype=torch.float64), rtol=1e-13, atol=0)
    assert inv[0] == 1.0  # the highest frequency is kept


def test_frequencies_equal_vllms_float32_computation():
    """vLLM: base = self.base * self.scaling_alpha ** (self.rotary_dim / (self.rotary_dim - 2));
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))."""
    for d, alpha, base in ((128, 1000.0, 10000.0), (64, 50.0, 5e5), (32, 1.5, 10000.0)):
        vllm_base = base * alpha ** (d / (d - 2))
        vllm = 1.0 / (vllm_base ** (torch.arange(0, d, 2, dtype=torch.float) / d))
        ours, _ = rope_frequencies("ntk_alpha", d, base, alpha=alpha)
        torch.testing.assert_close(ours.float(), vllm, rtol=2e-6, atol=0)


def test_frequencies_equal_transformers_hunyuan():
    """transformers' own code for the checkpoints' {"rope_type": "dynamic", "alpha": ...}."""
    pytest.importorskip("transformers")
    from transformers import HunYuanMoEV1Config
    from transformers.models.hunyuan_v1_moe.modeling_hunyuan_v1_moe import HunYuanMoEV1RotaryEmbedding

    cfg = HunYuanMoEV1Config(hidden_size=256, num_attention_heads=4, head_dim=64, num_hidden_layers=1,
                             intermediate_size=64, vocab_size=16,
                             rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                                              "rope_theta": 10000.0})
    rotary = HunYuanMoEV1RotaryEmbedding(cfg)
    assert rotary.rope_type == "ntk_alpha"  # transformers reads it as the fixed-alpha type
    ours = posenc.build("rope", d_model=256, num_heads=4, scaling="ntk_alpha", alpha=1000.0)
    torch.testing.assert_close(ours.inv_freq.float(), rotary.inv_freq, rtol=2e-6, atol=0)


def test_same_frequencies_as_static_ntk_at_factor_alpha():
    """bloc97's base' is the same formula: ntk_alpha(alpha) = ntk(factor=alpha) for alpha >= 1."""
    for alpha in (1.0, 4.0, 1000.0):
        a, _ = rope_frequencies("ntk_alpha", 64, 10000.0, alpha=alpha)
        n, _ = rope_frequencies("ntk", 64, 10000.0, factor=alpha)
        torch.testing.assert_close(a, n, rtol=1e-13, atol=0)
    plain, _ = rope_frequencies("ntk_alpha", 64, 10000.0, alpha=1.0)
    torch.testing.assert_close(plain, base_inv_freq(64, 10000.0), rtol=1e-15, atol=0)


def test_entry_has_no_transformers_type_nor_extension_rule():
    entry = SCALINGS["ntk_alpha"]
    assert entry.hf is None and entry.extension is None and entry.label == "NTK-alpha"
    assert "ntk_alpha" not in posenc.rotary.list_scalings(extends=True)
    assert entry.at_factor(8.0, 4096, 64, illustrate=True) == {"alpha": 8.0}  # figures only
    # to_hf writes plain RoPE with the stretched base (transformers' Hunyuan spelling is dynamic's rope type).
    hf = to_hf(posenc.build("rope", d_model=256, num_heads=4, scaling="ntk_alpha", alpha=1000.0))
    assert hf["rope_parameters"]["rope_type"] == "default"
    assert hf["rope_parameters"]["rope_theta"] == pytest.approx(10000.0 * 1000.0 ** (64 / 62), rel=1e-15)


@pytest.mark.parametrize("config,error,match", [
    ({}, ValueError, r"^alpha is required for rope type 'ntk_alpha' .*got None$"),
    ({"alpha": 0.0}, ValueError, r"^alpha must be > 0, got 0.0$"),
    ({"alpha": -2.0}, ValueError, r"^alpha must be > 0, got -2.0$"),
    ({"alpha": math.inf}, ValueError, r"^alpha must be finite, got inf$"),
    ({"alpha": "2"}, TypeError, r"alpha must be a float or None, got str '2'"),
    ({"alpha": 1e300}, ValueError, r"^alpha=1e\+300 makes the base .* = inf at base=10000.0, rotary_dim=16: it must be finite"),
    ({"alpha": 0.01, "rotary_dim": 4}, ValueError, r"^alpha=0.01 makes the base .* = 1.0 at base=10000.0, rotary_dim=4: .*!= 1$"),
    ({"alpha": 2.0, "rotary_dim": 2}, ValueError, r"^rope type 'ntk_alpha' needs rotary_dim >= 4 .*got 2$"),
    ({"factor": 2.0}, ValueError, r"factor not a parameter of rope type 'ntk_alpha' \(it takes: alpha\)"),
])
def test_bad_configs_are_refused_by_name(config, error, match):
    with pytest.raises(error, match=match):
        posenc.build("rope", d_model=32, num_heads=2, scaling="ntk_alpha", **config)
