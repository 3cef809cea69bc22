"""SGLang 0.5.23's reading of real families' config.json (posenc.engines.sglang) against the slow
loops of tests/test_engines_vllm.py, against vLLM where SGLang's classes equal vLLM's, and
against transformers where they agree or differ."""

from __future__ import annotations

import math

import pytest

from posenc.engines import Unsupported, engine_rule
from posenc.engines.vllm import vllm_ropes
from tests.test_engines_vllm import (DEEPSEEK_V3, DYNAMIC_LLAMA, GEMMA3_4B, GPT_OSS_20B, LLAMA31_8B, LLAMA4_SCOUT,
                                     MISTRAL_7B, PHI3_MINI_128K, QWEN25_7B_1M, QWEN25_7B_YARN, SMOLLM3_3B, close,
                                     mscale, slow_llama3, slow_plain, slow_yarn)

HF = "transformers"


def one(config, engine="sglang"):
    ropes = engine_rule(engine)(config)
    assert len(ropes) == 1, ropes
    return ropes[0]


# --- where SGLang equals vLLM and transformers ------------------------------------------------------

@pytest.mark.parametrize("config", [LLAMA31_8B, QWEN25_7B_YARN, QWEN25_7B_1M, DEEPSEEK_V3, GPT_OSS_20B, MISTRAL_7B,
                                    SMOLLM3_3B, LLAMA4_SCOUT],
                         ids=["llama3.1", "qwen2.5-yarn", "qwen2.5-1m", "deepseek-v3", "gpt-oss", "mistral",
                              "smollm3", "llama4-scout"])
def test_equals_vllm(config):
    s, v = one(config), one(config, "vllm")
    close(s.inv_freq, v.inv_freq.tolist())
    assert (s.attention_factor, s.softmax_scale, s.rotary_dim, s.layout, s.beyond, s.layers) == (
        v.attention_factor, v.softmax_scale, v.rotary_dim, v.layout, v.beyond, v.layers)


def test_llama31_and_qwen_yarn_against_slow_loops():
    close(one(LLAMA31_8B).inv_freq, slow_llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192))
    r = one(QWEN25_7B_YARN)
    close(r.inv_freq, slow_yarn(1e6, 128, 4.0, 32768))
    assert math.isclose(r.attention_factor, 0.1 * math.log(4) + 1, rel_tol=1e-15)
    close(r.inv_freq, one(QWEN25_7B_YARN, HF).inv_freq.tolist())


def test_deepseek_v3():
    r = one(DEEPSEEK_V3)
    close(r.inv_freq, slow_yarn(10000, 64, 40, 4096))
    assert r.attention_factor == 1.0 and math.isclose(r.softmax_scale, mscale(40) ** 2, rel_tol=1e-15)
    assert math.isclose(r.softmax_scale, one(DEEPSEEK_V3, HF).softmax_scale, rel_tol=1e-15)


def test_gpt_oss_keeps_truncate_false():
    r = one(GPT_OSS_20B)
    close(r.inv_freq, slow_yarn(150000, 64, 32.0, 4096, truncate=False))
    assert math.isclose(r.attention_factor, 0.1 * math.log(32) + 1, rel_tol=1e-15)


def test_llama4_reads_every_fourth_layer_as_nope_whatever_the_config_says():
    odd = [1] * 47 + [0]  # a file whose only NoPE layer is the last
    s, v = one(LLAMA4_SCOUT | {"no_rope_layers": odd}), one(LLAMA4_SCOUT | {"no_rope_layers": odd}, "vllm")
    assert s.layers == tuple(i for i in range(48) if (i + 1) % 4)
    assert v.layers == tuple(range(47))


# --- where SGLang differs ---------------------------------------------------------------------------

def test_gemma3_global_layers_lose_the_linear_factor():
    s = {r.layer_type: r for r in engine_rule("sglang")(GEMMA3_4B)}
    t = {r.layer_type: r for r in engine_rule(HF)(GEMMA3_4B)}
    close(s["sliding_attention"].inv_freq, t["sliding_attention"].inv_freq.tolist())
    close(s["full_attention"].inv_freq, slow_plain(1e6, 256))  # not / 8
    close(t["full_attention"].inv_freq, [x / 8 for x in slow_plain(1e6, 256)])
    assert any("'linear' (factor 8.0) is not applied" in n for n in s["full_attention"].notes)


def test_dynamic_is_one_table_at_factor_times_length():
    r = one(DYNAMIC_LLAMA)
    stretched = 10000.0 * (2.0 * 2.0 - 1.0) ** (128 / 126)  # f^2 - f + 1 = 3
    close(r.inv_freq, slow_plain(stretched, 128))
    assert r.beyond == "static"
    t = one(DYNAMIC_LLAMA, HF)
    close(t.frequencies(8192)[0].tolist(), r.inv_freq.tolist())  # transformers at n = f * L
    close(t.frequencies(4096)[0].tolist(), slow_plain(10000.0, 128))  # but plain up to L
    close(one(DYNAMIC_LLAMA, "vllm").inv_freq, slow_plain(10000.0, 128))  # vLLM: plain at every length


def test_phi3_longrope_switches_per_batch_one_token_after_transformers():
    cfg = PHI3_MINI_128K["rope_scaling"]
    plain = slow_plain(10000.0, 96)
    short = [x / f for x, f in zip(plain, cfg["short_factor"])]
    long = [x / f for x, f in zip(plain, cfg["long_factor"])]
    r = one(PHI3_MINI_128K)
    assert (r.beyond, r.switch_at) == ("switch", 4097)
    close(r.inv_freq, short)
    close(r.frequencies(4097)[0].tolist(), short)  # last position 4096 is not > 4096
    close(r.frequencies(4098)[0].tolist(), long)
    a = math.sqrt(1 + math.log(32) / math.log(4096))
    assert math.isclose(r.frequencies(4098)[1], a, rel_tol=1e-15) and math.isclose(r.attention_factor, a, rel_tol=1e-15)
    t = one(PHI3_MINI_128K, HF)
    close(t.frequencies(4097)[0].tolist(), long)  # transformers: long as soon as the length exceeds 4096
    assert any("whole forward batch" in n for n in r.notes)
    v = vllm_ropes(PHI3_MINI_128K)[0]
    assert v.beyond == "static"


def test_yarn_reads_attn_factor_not_attention_factor():
    with_hf_key = QWEN25_7B_YARN | {"rope_scaling": QWEN25_7B_YARN["rope_scaling"] | {"attention_factor": 1.5}}
    r = one(with_hf_key)
    assert math.isclose(r.attention_factor, mscale(4.0), rel_tol=1e-15)
    assert one(with_hf_key, "vllm").attention_factor == 1.5 == one(with_hf_key, HF).attention_factor
    assert any("attention_factor=1.5 is not read" in n for n in r.notes)
    with_sglang_key = QWEN25_7B_YARN | {"rope_scaling": QWEN25_7B_YARN["rope_scaling"] | {"attn_factor": 0.5}}
    assert math.isclose(one(with_sglang_key).attention_factor, 0.5 * mscale(4.0), rel_tol=1e-15)


def test_yarn_extrapolation_factor_scales_the_kept_share():
    cfg = QWEN25_7B_YARN | {"rope_scaling": QWEN25_7B_YARN["rope_scaling"] | {"extrapolation_factor": 0.5}}
    close(one(cfg).inv_freq, slow_yarn(1e6, 128, 4.0, 32768, extrapolation=0.5))


def test_yarn_mscale_zero_counts_as_present():
    # SGLang: both keys not None -> m(f, 0) / m(f, 1); vLLM and transformers: both non-zero, else m(f)
    cfg = QWEN25_7B_YARN | {"rope_scaling": QWEN25_7B_YARN["rope_scaling"] | {"mscale": 0, "mscale_all_dim": 1}}
    assert math.isclose(one(cfg).attention_factor, 1 / mscale(4.0), rel_tol=1e-15)
    assert math.isclose(one(cfg, "vllm").attention_factor, mscale(4.0), rel_tol=1e-15)


def test_deepseek_softmax_correction_kept_with_attention_factor_one():
    cfg = DEEPSEEK_V3 | {"rope_scaling": DEEPSEEK_V3["rope_scaling"] | {"attention_factor": 1.0}}
    assert math.isclose(one(cfg).softmax_scale, mscale(40) ** 2, rel_tol=1e-15)
    assert one(cfg, "vllm").softmax_scale == 1.0
    off = DEEPSEEK_V3 | {"rope_scaling": DEEPSEEK_V3["rope_scaling"] | {"apply_yarn_scaling": False}}
    assert one(off).softmax_scale == 1.0


def test_type_conflict_keeps_rope_type_where_vllm_refuses():
    cfg = MISTRAL_7B | {"rope_scaling": {"rope_type": "linear", "type": "yarn", "factor": 2.0}}
    close(one(cfg).inv_freq, [x / 2 for x in slow_plain(1e6, 128)])
    with pytest.raises(Unsupported, match="conflict"):
        one(cfg, "vllm")


def test_refusals():
    with pytest.raises(Unsupported, match=r"^SGLang refuses rope_type 'foo': get_rope raises 'Unknown RoPE scaling"):
        one(MISTRAL_7B | {"rope_scaling": {"rope_type": "foo", "factor": 2.0}})
    with pytest.raises(Unsupported, match=r"^SGLang does not start: transformers' validate_rope raises KeyError"):
        one(MISTRAL_7B | {"rope_scaling": {"rope_type": "linear"}})
    with pytest.raises(TypeError, match=r"^rope_scaling must be a dict or null, got list"):
        one(MISTRAL_7B | {"rope_scaling": [2.0]})


def test_every_result_cites_sglang_and_its_version():
    ropes = [r for c in (LLAMA31_8B, GEMMA3_4B, PHI3_MINI_128K, SMOLLM3_3B) for r in engine_rule("sglang")(c)]
    assert len(ropes) == 5 and all(r.engine == "sglang" and "SGLang 0.5.23" in r.source for r in ropes)
