"""llama.cpp's rule (posenc.engines.llamacpp, posenc.engines.gguf_meta) on published configs:
against a slow loop written from ggml's rope_yarn / ggml_rope_yarn_corr_dims and llama_context's
attention factor (llama.cpp 0c1e570, llama-cpp-python 0.3.36), against transformers' rule where
they agree, the documented differences asserted where they do not, and through a real .gguf file."""

from __future__ import annotations

import math

import pytest
import torch

from engine_configs import (DEEPSEEK_V3, GEMMA3_4B, GPT_OSS_20B, LLAMA31_8B, MISTRAL_7B, PHI3_128K, PHI3_LONG,
                            PHI3_SHORT, QWEN25_7B_YARN, SMOLLM2_135M, SMOLLM2_YARN, SMOLLM3_3B)
from posenc.engines import Unsupported, engine_rule
from posenc.engines.gguf_meta import FACTOR_TENSORS, NOTES, f32, gguf_rope_metadata, read_gguf_metadata
from posenc.engines.llamacpp import llamacpp_rope, rope_from_gguf_metadata

HF = engine_rule("transformers")


def ref_ggml(d, base, freq_scale=1.0, ext=0.0, orig=4096, beta_fast=32.0, beta_slow=1.0, factors=None,
             rounded=True):
    """Per pair i, the angle per position of ggml-cpu ops.cpp rope_yarn, one pair at a time;
    ``rounded=False`` leaves the ramp ends unrounded (transformers' truncate=False)."""
    def corr(beta):
        return d * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = corr(beta_fast), corr(beta_slow)
    if rounded:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(0, lo), min(d - 1, hi)
    out = []
    for i in range(d // 2):
        extrap = base ** (-2 * i / d) / (factors[i] if factors else 1.0)
        theta = freq_scale * extrap
        if ext:
            mix = (1 - min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo)))) * ext
            theta = theta * (1 - mix) + extrap * mix
        out.append(theta)
    return torch.tensor(out, dtype=torch.float64)


def close(a, b, rtol=1e-12):
    return torch.allclose(a, b, rtol=rtol, atol=0)


def test_llama31_writes_llama3_as_a_rope_freqs_tensor_giving_transformers_inv_freq():
    meta = gguf_rope_metadata(LLAMA31_8B)
    assert meta["general.architecture"] == "llama" and "llama.rope.scaling.type" not in meta
    assert meta["llama.rope.freq_base"] == 500000.0 and meta["llama.rope.dimension_count"] == 128
    factors = meta["rope_freqs"]
    # by hand: wavelength 2 pi 500000^(2i/128) < 8192/4 -> 1, > 8192 -> 8, else the blend
    for i, f in enumerate(factors):
        wavelen = 2 * math.pi * 500000.0 ** (2 * i / 128)
        if wavelen < 2048:
            assert f == 1.0
        elif wavelen > 8192:
            assert f == 8.0
        else:
            s = (8192 / wavelen - 1) / 3
            assert f == pytest.approx(1 / ((1 - s) / 8 + s), rel=1e-6)
    assert factors[0] == 1.0 and factors[-1] == 8.0 and any(1 < f < 8 for f in factors)
    (r,) = llamacpp_rope(LLAMA31_8B)
    assert close(r.inv_freq, ref_ggml(128, 500000.0, factors=factors))
    (t,) = HF(LLAMA31_8B)
    assert close(r.inv_freq, t.inv_freq, rtol=1e-6)  # the factors are float32 in the file
    assert r.attention_factor == t.attention_factor == 1.0 and r.layout == t.layout == "half"


def test_qwen25_yarn_agrees_with_transformers():
    meta = gguf_rope_metadata(QWEN25_7B_YARN)
    assert (meta["qwen2.rope.scaling.type"], meta["qwen2.rope.scaling.factor"],
            meta["qwen2.rope.scaling.original_context_length"]) == ("yarn", 4.0, 32768)
    (r,) = llamacpp_rope(QWEN25_7B_YARN)
    assert close(r.inv_freq, ref_ggml(128, 1e6, 0.25, 1.0, 32768))
    (t,) = HF(QWEN25_7B_YARN)
    assert close(r.inv_freq, t.inv_freq, rtol=1e-6)
    # llama_context sets mscale(4)/(1 + 0.1 ln 4) and ggml multiplies 1 + 0.1 ln 4 back
    assert r.attention_factor == pytest.approx(1 + 0.1 * math.log(4), rel=1e-12)
    assert t.attention_factor == pytest.approx(r.attention_factor, rel=1e-9)


def test_deepseek_v3_mscale_all_dim_goes_to_the_softmax_scale_as_in_transformers():
    meta = gguf_rope_metadata(DEEPSEEK_V3)
    assert meta["general.architecture"] == "deepseek2" and meta["deepseek2.rope.dimension_count"] == 64
    assert meta["deepseek2.rope.scaling.yarn_log_multiplier"] == f32(0.1)
    (r,) = llamacpp_rope(DEEPSEEK_V3)
    assert r.layout == "interleaved" and r.rotary_dim == 64
    assert close(r.inv_freq, ref_ggml(64, 10000.0, 1 / 40, 1.0, 4096))
    m = 1 + 0.1 * math.log(40)
    assert r.attention_factor == pytest.approx(1.0, rel=1e-12)
    assert r.softmax_scale == pytest.approx(m * m, rel=1e-6)  # yarn_log_multiplier / 0.1 in float32
    (t,) = HF(DEEPSEEK_V3)
    assert close(r.inv_freq, t.inv_freq, rtol=1e-6) and t.layout == "interleaved"
    assert t.logit_scale() == pytest.approx(r.logit_scale(), rel=1e-6)


def test_deepseek_yarn_without_mscale_all_dim_differs_from_transformers():
    """deepseek2.cpp pre-scales kq by attn_factor (1 + 0.1 ln s): without yarn_log_multiplier the
    rope's mscale is applied on cos/sin and again in kq_scale: mscale^4 on the logits, where
    transformers gives its default attention factor once (mscale^2)."""
    rope = {k: v for k, v in DEEPSEEK_V3["rope_scaling"].items() if k not in ("mscale", "mscale_all_dim")}
    cfg = {**DEEPSEEK_V3, "rope_scaling": rope}
    (r,), (t,) = llamacpp_rope(cfg), HF(cfg)
    m = 1 + 0.1 * math.log(40)
    assert r.attention_factor == pytest.approx(m) and r.softmax_scale == pytest.approx(m * m)
    assert r.logit_scale() == pytest.approx(m ** 4) and t.logit_scale() == pytest.approx(m ** 2)
    assert any("mscale^4" in n for n in r.notes)


def test_phi3_longrope_factors_chosen_by_context_size():
    meta = gguf_rope_metadata(PHI3_128K)
    assert "phi3.rope.scaling.type" not in meta  # Phi3MiniModel never calls the base class
    assert meta["rope_factors_long"] == [f32(v) for v in PHI3_LONG]
    attn = math.sqrt(1 + math.log(32) / math.log(4096))
    assert meta["phi3.rope.scaling.attn_factor"] == f32(attn)
    (r,) = llamacpp_rope(PHI3_128K)
    assert r.beyond == "switch" and r.switch_at == 4096
    short = ref_ggml(96, 10000.0, factors=[f32(v) for v in PHI3_SHORT])
    long = ref_ggml(96, 10000.0, factors=[f32(v) for v in PHI3_LONG])
    assert close(r.inv_freq, short) and close(r.frequencies(4096)[0], short)
    assert close(r.frequencies(4097)[0], long)  # 4097 pads to 4352 > 4096
    assert r.attention_factor == pytest.approx(f32(attn), rel=1e-12)
    (t,) = HF(PHI3_128K)
    assert close(t.frequencies(4096)[0], short, rtol=1e-6) and close(t.frequencies(8192)[0], long, rtol=1e-6)
    assert t.attention_factor == pytest.approx(attn, rel=1e-9)
    # -c 0 (the model's 131072): the long factors from the first token; transformers: short there
    (static,) = rope_from_gguf_metadata(meta, {"ctx-size": 0})
    assert static.beyond == "static" and close(static.inv_freq, long)
    assert not close(t.frequencies(100)[0], static.inv_freq, rtol=1e-3)
    (small,) = rope_from_gguf_metadata(meta, {"--ctx-size": 4000})  # pads to 4096: short
    assert close(small.inv_freq, short)


def test_gemma3_sliding_and_global_layers_agree_with_transformers():
    meta = gguf_rope_metadata(GEMMA3_4B)
    assert meta["gemma3.rope.freq_base_swa"] == 10000.0 and meta["gemma3.rope.scaling.factor"] == 8.0
    ropes = {r.layer_type: r for r in llamacpp_rope(GEMMA3_4B)}
    assert ropes["full_attention"].layers == (5, 11, 17, 23, 29)
    assert len(ropes["sliding_attention"].layers) == 29
    assert close(ropes["sliding_attention"].inv_freq, ref_ggml(256, 10000.0))
    assert close(ropes["full_attention"].inv_freq, ref_ggml(256, 1e6, 1 / 8))
    for t in HF(GEMMA3_4B):
        r = ropes[t.layer_type]
        assert close(r.inv_freq, t.inv_freq, rtol=1e-9) and r.layers == t.layers
        assert r.attention_factor == t.attention_factor == 1.0


def test_gpt_oss_rounds_the_ramp_where_transformers_does_not():
    (r,) = llamacpp_rope(GPT_OSS_20B)  # sliding and full layers share base and scale
    assert r.layers is None and any("truncate=false" in n for n in r.notes)
    rounded = ref_ggml(64, 150000.0, 1 / 32, 1.0, 4096)
    assert close(r.inv_freq, rounded)
    assert r.attention_factor == pytest.approx(1 + 0.1 * math.log(32), rel=1e-12)
    # transformers reads truncate=false (its rule on the same yarn dict, a llama config)
    as_llama = {**SMOLLM2_135M, "head_dim": 64, "rope_theta": 150000, "max_position_embeddings": 131072,
                "rope_scaling": GPT_OSS_20B["rope_scaling"]}
    (t,) = HF(as_llama)
    exact = ref_ggml(64, 150000.0, 1 / 32, 1.0, 4096, rounded=False)
    assert close(t.inv_freq, exact, rtol=1e-6)
    differ = ~torch.isclose(r.inv_freq, exact, rtol=1e-6, atol=0)
    assert 0 < int(differ.sum()) < 32  # only the pairs inside the ramp


@pytest.mark.parametrize("cfg", [MISTRAL_7B, SMOLLM2_135M, SMOLLM2_YARN], ids=["mistral", "smollm2", "smollm2-yarn"])
def test_llama_family_agrees_with_transformers(cfg):
    (r,), (t,) = llamacpp_rope(cfg), HF(cfg)
    assert gguf_rope_metadata(cfg)["general.architecture"] == "llama"
    assert close(r.inv_freq, t.inv_freq, rtol=1e-6) and r.layout == t.layout == "half"
    assert r.attention_factor == pytest.approx(t.attention_factor, rel=1e-9)


def test_smollm3_skips_every_fourth_layer():
    (r,) = llamacpp_rope(SMOLLM3_3B)
    assert r.layers == tuple(i for i in range(36) if (i + 1) % 4)
    assert close(r.inv_freq, ref_ggml(128, 5e6))
    (t,) = HF(SMOLLM3_3B)
    assert close(r.inv_freq, t.inv_freq, rtol=1e-9)


def test_an_explicit_yarn_attention_factor_is_not_read():
    cfg = {**SMOLLM2_YARN, "rope_scaling": {**SMOLLM2_YARN["rope_scaling"], "attention_factor": 1.0}}
    assert gguf_rope_metadata(cfg)["llama.rope.scaling.yarn_attn_factor"] == 1.0  # written...
    (r,), (t,) = llamacpp_rope(cfg), HF(cfg)
    assert t.attention_factor == 1.0
    assert r.attention_factor == pytest.approx(1 + 0.1 * math.log(2))  # ...but not read
    assert any("yarn_attn_factor" in n for n in r.notes)


def test_flags_override_the_file_as_llama_context_does():
    meta = gguf_rope_metadata(SMOLLM2_135M)
    flags = {"--rope-scaling": "yarn", "--rope-scale": 4, "--yarn-orig-ctx": 8192}
    (r,) = rope_from_gguf_metadata(meta, flags)
    assert close(r.inv_freq, ref_ggml(64, 100000.0, 0.25, 1.0, 8192))
    assert r.attention_factor == pytest.approx(1 + 0.1 * math.log(4), rel=1e-12)
    hf = {**SMOLLM2_135M, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}}
    assert close(r.inv_freq, HF(hf)[0].inv_freq, rtol=1e-9)
    (lost,) = rope_from_gguf_metadata(meta, {**flags, "yarn_attn_factor": 0.5})
    assert lost.attention_factor == r.attention_factor and any("overwritten" in n for n in lost.notes)
    (linear,) = rope_from_gguf_metadata(meta, {"rope-scale": 2, "yarn-attn-factor": 0.5})
    assert close(linear.inv_freq, ref_ggml(64, 100000.0, 0.5)) and linear.attention_factor == 0.5
    (base,) = rope_from_gguf_metadata(meta, {"rope-freq-base": 1e6, "yarn-beta-fast": 16, "rope-scaling": "yarn",
                                             "rope-scale": 2})
    assert close(base.inv_freq, ref_ggml(64, 1e6, 0.5, 1.0, 8192, beta_fast=16))
    (none,) = rope_from_gguf_metadata(gguf_rope_metadata(SMOLLM2_YARN), {"rope-scaling": "none"})
    assert close(none.inv_freq, ref_ggml(64, 100000.0)) and none.attention_factor == 1.0


def write_gguf(path, meta):
    """A tiny GGUF file holding ``meta`` (ints as uint32, floats as float32) and its factor tensors."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), meta["general.architecture"])
    for key, value in meta.items():
        if key in ("general.architecture", NOTES) or key in FACTOR_TENSORS:
            continue
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_float32(key, value)
    for name in FACTOR_TENSORS:
        if name in meta:
            w.add_tensor(name + ".weight", np.array(meta[name], dtype=np.float32))
    w.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("cfg", [LLAMA31_8B, QWEN25_7B_YARN, DEEPSEEK_V3, PHI3_128K, GEMMA3_4B, GPT_OSS_20B,
                                 SMOLLM3_3B, SMOLLM2_YARN],
                         ids=["llama31", "qwen25", "deepseek_v3", "phi3", "gemma3", "gpt_oss", "smollm3", "smollm2-yarn"])
def test_a_written_gguf_reads_back_to_the_same_rope(tmp_path, cfg):
    pytest.importorskip("gguf")
    meta = gguf_rope_metadata(cfg)
    back = read_gguf_metadata(write_gguf(tmp_path / "m.gguf", meta))
    assert {k: v for k, v in meta.items() if k != NOTES}.items() <= back.items()
    direct, read = llamacpp_rope(cfg), rope_from_gguf_metadata(back)
    assert len(direct) == len(read) > 0
    for a, b in zip(direct, read):
        assert torch.equal(a.inv_freq, b.inv_freq)
        assert (a.attention_factor, a.softmax_scale, a.layers, a.layer_type, a.layout, a.beyond, a.switch_at) == \
               (b.attention_factor, b.softmax_scale, b.layers, b.layer_type, b.layout, b.beyond, b.switch_at)


def test_unreadable_files_are_one_line_errors(tmp_path):
    pytest.importorskip("gguf")
    with pytest.raises(ValueError, match=r"missing\.gguf: no such file"):
        read_gguf_metadata(tmp_path / "missing.gguf")
    (tmp_path / "a.json").write_text("{}")
    with pytest.raises(ValueError, match=r"is not a GGUF file"):
        read_gguf_metadata(tmp_path / "a.json")
    good = write_gguf(tmp_path / "m.gguf", gguf_rope_metadata(SMOLLM2_135M)).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(good[:60])
    with pytest.raises(ValueError, match=r"unreadable \(truncated or corrupt\)") as e:
        read_gguf_metadata(tmp_path / "cut.gguf")
    assert "\n" not in str(e.value)


def test_refusals():
    with pytest.raises(Unsupported, match="wrong number of tensors"):
        llamacpp_rope({**SMOLLM3_3B, "rope_scaling": LLAMA31_8B["rope_scaling"]})
    phi = {k: v for k, v in PHI3_128K.items() if k != "original_max_position_embeddings"}
    with pytest.raises(Unsupported, match="original_max_position_embeddings"):
        llamacpp_rope(phi)
    with pytest.raises(ValueError, match="unknown llama.cpp flag"):
        rope_from_gguf_metadata(gguf_rope_metadata(SMOLLM2_135M), {"--rope-sclae": 2})
    (plain,) = llamacpp_rope({**SMOLLM2_135M, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    assert close(plain.inv_freq, ref_ggml(64, 100000.0)) and any("dynamic" in n for n in plain.notes)


def test_llama3_scaling_outside_the_llama_converters_is_dropped_with_a_note():
    cfg = {**QWEN25_7B_YARN, "rope_scaling": LLAMA31_8B["rope_scaling"]}
    assert "rope_freqs" not in gguf_rope_metadata(cfg)
    (r,) = llamacpp_rope(cfg)
    assert close(r.inv_freq, ref_ggml(128, 1e6)) and any("llama3 scaling is dropped" in n for n in r.notes)
