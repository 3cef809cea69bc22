"""mlx-lm 0.32.2's rule (posenc.engines.mlx_lm) on published configs: against slow loops written
from rope_utils.py (Llama3RoPE, YarnRoPE, SuScaledRoPE, DynamicNTKScalingRoPE) and against
transformers' rule where they agree; the documented differences asserted where they do not."""

from __future__ import annotations

import math

import pytest
import torch

from engine_configs import (DEEPSEEK_V3, GEMMA3_4B, GPT_OSS_20B, LLAMA31_8B, MISTRAL_7B, PHI3_128K, PHI3_LONG,
                            PHI3_SHORT, QWEN25_7B_YARN, SMOLLM2_135M, SMOLLM2_YARN, SMOLLM3_3B)
from posenc.engines import Unsupported, engine_rule
from posenc.engines.mlx_lm import mlx_lm_rope

HF = engine_rule("transformers")


def theta(base, d, i):
    return base ** (-2 * i / d)


def ref_yarn(d, base, factor, orig, beta_fast=32, beta_slow=1):
    """YarnRoPE's frequencies, one pair at a time (floor/ceil ramp ends, always)."""
    def corr(rot):
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), d - 1)
    hi = hi + 0.001 if lo == hi else hi
    out = []
    for i in range(d // 2):
        keep = 1 - min(1.0, max(0.0, (i - lo) / (hi - lo)))  # 1: extrapolate (the original theta)
        out.append(theta(base, d, i) * keep + theta(base, d, i) / factor * (1 - keep))
    return torch.tensor(out, dtype=torch.float64)


def close(a, b, rtol=1e-12):
    return torch.allclose(a, b, rtol=rtol, atol=0)


def test_llama3_equals_transformers_and_the_loop():
    (r,), (t,) = mlx_lm_rope(LLAMA31_8B), HF(LLAMA31_8B)
    ref = []
    for i in range(64):
        period = 500000.0 ** (2 * i / 128)
        wavelen = 2 * math.pi * period
        if wavelen > 8192:
            ref.append(1 / (period * 8))
        elif wavelen > 2048:
            s = (8192 / wavelen - 1) / 3
            ref.append(1 / (period / ((1 - s) / 8 + s)))
        else:
            ref.append(1 / period)
    assert close(r.inv_freq, torch.tensor(ref, dtype=torch.float64))
    assert close(r.inv_freq, t.inv_freq, rtol=1e-9) and r.attention_factor == t.attention_factor == 1.0


def test_qwen25_yarn_agrees_but_an_explicit_attention_factor_is_ignored():
    (r,), (t,) = mlx_lm_rope(QWEN25_7B_YARN), HF(QWEN25_7B_YARN)
    assert close(r.inv_freq, ref_yarn(128, 1e6, 4.0, 32768)) and close(r.inv_freq, t.inv_freq, rtol=1e-6)
    assert r.attention_factor == pytest.approx(1 + 0.1 * math.log(4), rel=1e-12)
    assert t.attention_factor == pytest.approx(r.attention_factor, rel=1e-9)
    cfg = {**QWEN25_7B_YARN, "rope_scaling": {**QWEN25_7B_YARN["rope_scaling"], "attention_factor": 1.0}}
    (r1,), (t1,) = mlx_lm_rope(cfg), HF(cfg)
    assert t1.attention_factor == 1.0 and r1.attention_factor == r.attention_factor  # YarnRoPE never reads it
    assert any("attention_factor" in n for n in r1.notes)


def test_deepseek_v3_agrees_with_transformers():
    (r,), (t,) = mlx_lm_rope(DEEPSEEK_V3), HF(DEEPSEEK_V3)
    assert r.layout == t.layout == "interleaved" and r.rotary_dim == 64
    assert close(r.inv_freq, ref_yarn(64, 10000.0, 40.0, 4096)) and close(r.inv_freq, t.inv_freq, rtol=1e-6)
    m = 1 + 0.1 * math.log(40)
    assert r.attention_factor == 1.0 and r.softmax_scale == pytest.approx(m * m, rel=1e-12)
    assert t.logit_scale() == pytest.approx(r.logit_scale(), rel=1e-9)


def test_deepseek_mscale_without_mscale_all_dim_differs_from_transformers():
    """YarnRoPE divides by mscale(f, 0) = 1: mscale alone scales cos/sin by 1 + 0.1 mscale ln f,
    where transformers (which needs both keys for the ratio) takes 1 + 0.1 ln f."""
    rope = {k: v for k, v in DEEPSEEK_V3["rope_scaling"].items() if k != "mscale_all_dim"}
    cfg = {**DEEPSEEK_V3, "rope_scaling": {**rope, "mscale": 0.707}}
    (r,), (t,) = mlx_lm_rope(cfg), HF(cfg)
    assert r.attention_factor == pytest.approx(1 + 0.0707 * math.log(40), rel=1e-12)
    assert t.attention_factor == pytest.approx(1 + 0.1 * math.log(40), rel=1e-9)
    assert r.softmax_scale == t.softmax_scale == 1.0


def test_phi3_longrope_uses_the_long_factors_at_every_length():
    (r,), (t,) = mlx_lm_rope(PHI3_128K), HF(PHI3_128K)
    long = torch.tensor([theta(10000.0, 96, i) / PHI3_LONG[i] for i in range(48)], dtype=torch.float64)
    short = torch.tensor([theta(10000.0, 96, i) / PHI3_SHORT[i] for i in range(48)], dtype=torch.float64)
    assert r.beyond == "static" and close(r.inv_freq, long)
    assert r.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)), rel=1e-12)
    assert t.attention_factor == pytest.approx(r.attention_factor, rel=1e-9)
    assert close(t.frequencies(8192)[0], long, rtol=1e-6)  # past 4096 tokens: the same
    assert close(t.frequencies(100)[0], short, rtol=1e-6)  # below: transformers' short factors
    assert not close(r.frequencies(100)[0], short, rtol=1e-3)


def test_gemma3_layers_agree_with_transformers():
    ropes = {r.layer_type: r for r in mlx_lm_rope(GEMMA3_4B)}
    assert ropes["full_attention"].layers == (5, 11, 17, 23, 29)
    for t in HF(GEMMA3_4B):
        r = ropes[t.layer_type]
        assert close(r.inv_freq, t.inv_freq, rtol=1e-12) and r.layers == t.layers
    assert close(ropes["full_attention"].inv_freq,
                 torch.tensor([theta(1e6, 256, i) / 8 for i in range(128)], dtype=torch.float64))


def test_gpt_oss_ignores_truncate_false():
    (r,) = mlx_lm_rope(GPT_OSS_20B)
    assert close(r.inv_freq, ref_yarn(64, 150000.0, 32.0, 4096))
    assert close(r.inv_freq, engine_rule("llama.cpp")(GPT_OSS_20B)[0].inv_freq, rtol=1e-12)
    assert r.attention_factor == pytest.approx(1 + 0.1 * math.log(32)) and any("truncate" in n for n in r.notes)


@pytest.mark.parametrize("cfg", [MISTRAL_7B, SMOLLM2_135M, SMOLLM2_YARN], ids=["mistral", "smollm2", "smollm2-yarn"])
def test_llama_family_agrees_with_transformers(cfg):
    (r,), (t,) = mlx_lm_rope(cfg), HF(cfg)
    assert close(r.inv_freq, t.inv_freq, rtol=1e-6) and r.layout == t.layout == "half"
    assert r.attention_factor == pytest.approx(t.attention_factor, rel=1e-9)


def test_smollm3_reads_no_rope_layers():
    (r,) = mlx_lm_rope(SMOLLM3_3B)
    assert r.layers == tuple(i for i in range(36) if (i + 1) % 4)
    odd = {**SMOLLM3_3B, "no_rope_layers": [1] * 35 + [0]}
    assert mlx_lm_rope(odd)[0].layers == tuple(range(35))  # llama.cpp would still skip every 4th
    assert engine_rule("llama.cpp")(odd)[0].layers == r.layers


def test_dynamic_is_supported_and_recomputed_per_length():
    cfg = {**SMOLLM2_135M, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    (r,), (t,) = mlx_lm_rope(cfg), HF(cfg)
    assert r.beyond == "dynamic" and close(r.frequencies(4000)[0], r.inv_freq)
    base = 100000 * (2.0 * 16384 / 8192 - 1) ** (64 / 62)
    assert close(r.frequencies(16384)[0], torch.tensor([theta(base, 64, i) for i in range(32)], dtype=torch.float64))
    assert close(r.frequencies(16384)[0], t.frequencies(16384)[0], rtol=1e-9)


def test_refusals_and_what_is_not_read():
    with pytest.raises(Unsupported, match="Unsupported RoPE type su"):
        mlx_lm_rope({**SMOLLM2_135M, "rope_scaling": {"type": "su", "factor": 2.0}})
    with pytest.raises(Unsupported, match="must contain keys"):
        mlx_lm_rope({**PHI3_128K, "rope_scaling": {k: v for k, v in PHI3_128K["rope_scaling"].items() if k != "type"}})
    with pytest.raises(ValueError, match="model_type must be one of"):
        mlx_lm_rope({**SMOLLM2_135M, "model_type": "falcon"})
    v5 = {k: v for k, v in SMOLLM2_135M.items() if k not in ("rope_theta", "rope_scaling")}
    (r,) = mlx_lm_rope({**v5, "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}})
    assert close(r.inv_freq, torch.tensor([theta(10000.0, 64, i) for i in range(32)], dtype=torch.float64))
    assert any("rope_parameters is not read" in n for n in r.notes)
