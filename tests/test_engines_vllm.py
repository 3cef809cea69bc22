"""vLLM 0.33.0's reading of real families' config.json (posenc.engines.vllm) against slow loops
written from vLLM's formulas, and against transformers' reading where the two agree or differ.

The configs are the published config.json values of each family (the keys about RoPE and the
geometry); Phi-3's 48 short/long factors are a synthetic list of the right length, labelled.
"""

from __future__ import annotations

import math

import pytest
import torch

from posenc.engines import Unsupported, engine_rule
from posenc.engines.vllm import vllm_ropes

LLAMA31_8B = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "max_position_embeddings": 131072, "rope_theta": 500000.0,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
# Qwen2.5-7B-Instruct with the YaRN block its model card asks to add for 128K
QWEN25_7B_YARN = {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
                  "num_hidden_layers": 28, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
                  "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}
QWEN25_7B_1M = {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
                "num_hidden_layers": 28, "max_position_embeddings": 1010000, "rope_theta": 10000000.0,
                "dual_chunk_attention_config": {"chunk_size": 262144, "local_size": 8192,
                                                "original_max_position_embeddings": 262144}}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "num_hidden_layers": 61,
               "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "kv_lora_rank": 512,
               "q_lora_rank": 1536, "max_position_embeddings": 163840, "rope_theta": 10000,
               "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                "original_max_position_embeddings": 4096, "type": "yarn"}}
# Phi-3-mini-128k-instruct's geometry; SYNTHETIC short/long factors (48 each: rotary_dim 96 / 2)
PHI3_MINI_128K = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "num_hidden_layers": 32,
                  "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
                  "rope_scaling": {"short_factor": [1.0 + 0.02 * i for i in range(48)],
                                   "long_factor": [1.0 + 1.5 * i for i in range(48)], "type": "longrope"}}
# Gemma 3 4B's text config: 5 sliding layers (local base 1e4) then 1 global (1e6, linear x8)
GEMMA3_4B = {"model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
             "num_hidden_layers": 34, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
             "rope_local_base_freq": 10000.0, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
             "sliding_window": 1024,
             "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)]}
GPT_OSS_20B = {"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64, "head_dim": 64,
               "num_hidden_layers": 24, "max_position_embeddings": 131072, "rope_theta": 150000,
               "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False}}
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
              "max_position_embeddings": 32768, "rope_theta": 1000000.0}
SMOLLM3_3B = {"model_type": "smollm3", "hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 36,
              "max_position_embeddings": 65536, "rope_theta": 5000000.0, "no_rope_layer_interval": 4,
              "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(36)]}
LLAMA4_SCOUT = {"model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40, "head_dim": 128,
                "num_hidden_layers": 48, "max_position_embeddings": 10485760, "rope_theta": 500000.0,
                "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(48)], "attention_chunk_size": 8192}
DYNAMIC_LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
                 "max_position_embeddings": 4096, "rope_theta": 10000.0,
                 "rope_scaling": {"type": "dynamic", "factor": 2.0}}


# --- slow references: one pair at a time, as the engines' source writes the formula -------------

def slow_plain(base: float, d: int) -> list[float]:
    return [1.0 / base ** (2 * i / d) for i in range(d // 2)]


def slow_llama3(base, d, factor, low, high, original) -> list[float]:
    out = []
    for theta in slow_plain(base, d):
        wavelen = 2 * math.pi / theta
        if wavelen < original / high:
            out.append(theta)
        elif wavelen > original / low:
            out.append(theta / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * theta / factor + smooth * theta)
    return out


def slow_yarn(base, d, factor, original, beta_fast=32.0, beta_slow=1.0, truncate=True, extrapolation=1.0):
    def pair_of(rotations):  # the pair index making `rotations` turns over `original` positions
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_of(beta_fast), pair_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    out = []
    for i, theta in enumerate(slow_plain(base, d)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        keep = (1 - ramp) * extrapolation
        out.append(theta / factor * (1 - keep) + theta * keep)
    return out


def mscale(scale, m=1.0):
    return 0.1 * m * math.log(scale) + 1.0 if scale > 1 else 1.0


def close(inv, ref, rtol=1e-12):
    torch.testing.assert_close(torch.as_tensor(inv, dtype=torch.float64),
                               torch.tensor(ref, dtype=torch.float64), rtol=rtol, atol=0)


def one(config, engine="vllm"):
    ropes = engine_rule(engine)(config)
    assert len(ropes) == 1, ropes
    return ropes[0]


HF = "transformers"


# --- agreement with transformers -------------------------------------------------------------------

def test_llama31_llama3_scaling_equals_slow_loop_and_transformers():
    r = one(LLAMA31_8B)
    close(r.inv_freq, slow_llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192))
    assert (r.rotary_dim, r.layout, r.beyond, r.attention_factor, r.softmax_scale) == (128, "half", "static", 1.0, 1.0)
    close(r.inv_freq, one(LLAMA31_8B, HF).inv_freq.tolist())
    assert float(r.inv_freq[0]) == 1.0 and math.isclose(float(r.inv_freq[-1]), 500000.0 ** (-126 / 128) / 8)


def test_qwen25_yarn_equals_slow_loop_and_transformers():
    r = one(QWEN25_7B_YARN)
    close(r.inv_freq, slow_yarn(1e6, 128, 4.0, 32768))
    assert math.isclose(r.attention_factor, 0.1 * math.log(4) + 1, rel_tol=1e-15)  # 1.13863
    t = one(QWEN25_7B_YARN, HF)
    close(r.inv_freq, t.inv_freq.tolist())
    assert math.isclose(r.attention_factor, t.attention_factor, rel_tol=1e-15) and r.beyond == t.beyond == "static"


def test_qwen25_1m_dual_chunk_rotates_the_plain_frequencies():
    r = one(QWEN25_7B_1M)
    close(r.inv_freq, slow_plain(1e7, 128))
    assert r.attention_factor == 1.0 and any("dual-chunk" in n and "262144" in n for n in r.notes)
    close(r.inv_freq, one(QWEN25_7B_1M, HF).inv_freq.tolist())  # transformers ignores DCA: the same RoPE


def test_dual_chunk_ignores_the_rope_type():
    r = one(QWEN25_7B_1M | {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})
    close(r.inv_freq, slow_plain(1e7, 128))
    assert r.attention_factor == 1.0 and any("'yarn' is ignored" in n for n in r.notes)


def test_deepseek_v3_yarn_and_softmax_scale():
    r = one(DEEPSEEK_V3)
    close(r.inv_freq, slow_yarn(10000, 64, 40, 4096))
    assert (r.rotary_dim, r.layout) == (64, "interleaved")
    assert r.attention_factor == 1.0  # m(40, 1) / m(40, 1)
    assert math.isclose(r.softmax_scale, mscale(40, 1.0) ** 2, rel_tol=1e-15)  # 1.8738...
    assert math.isclose(r.softmax_scale, 1.8738542, rel_tol=1e-7)  # (1 + 0.1 ln 40)^2
    t = one(DEEPSEEK_V3, HF)
    close(r.inv_freq, t.inv_freq.tolist())
    assert math.isclose(r.softmax_scale, t.softmax_scale, rel_tol=1e-15) and r.attention_factor == t.attention_factor


def test_gemma3_per_layer_type_equals_transformers():
    ropes = {r.layer_type: r for r in engine_rule("vllm")(GEMMA3_4B)}
    assert set(ropes) == {"sliding_attention", "full_attention"}
    close(ropes["sliding_attention"].inv_freq, slow_plain(10000.0, 256))
    close(ropes["full_attention"].inv_freq, [t / 8 for t in slow_plain(1e6, 256)])
    assert ropes["full_attention"].layers == tuple(range(5, 34, 6))
    hf = {r.layer_type: r for r in engine_rule(HF)(GEMMA3_4B)}
    for kind in ropes:
        close(ropes[kind].inv_freq, hf[kind].inv_freq.tolist())
        assert ropes[kind].layers == hf[kind].layers


def test_gpt_oss_yarn_without_truncation():
    r = one(GPT_OSS_20B)
    close(r.inv_freq, slow_yarn(150000, 64, 32.0, 4096, 32.0, 1.0, truncate=False))
    with pytest.raises(AssertionError):  # truncation would move the ramp's ends to pairs 8 and 18
        close(r.inv_freq, slow_yarn(150000, 64, 32.0, 4096, 32.0, 1.0, truncate=True))
    assert math.isclose(r.attention_factor, 0.1 * math.log(32) + 1, rel_tol=1e-15)  # 1.34657
    generic = {k: v for k, v in GPT_OSS_20B.items() if k != "model_type"}  # posenc reads gpt_oss generically
    t = one(generic, HF)
    close(r.inv_freq, t.inv_freq.tolist())
    assert math.isclose(r.attention_factor, t.attention_factor, rel_tol=1e-15)


def test_mistral_plain():
    r = one(MISTRAL_7B)
    close(r.inv_freq, slow_plain(1e6, 128))
    assert r.notes == () and r.attention_factor == 1.0
    close(r.inv_freq, one(MISTRAL_7B, HF).inv_freq.tolist())


def test_smollm3_runs_through_the_transformers_backend():
    r = one(SMOLLM3_3B)
    assert r.layers == tuple(i for i in range(36) if (i + 1) % 4)
    close(r.inv_freq, slow_plain(5e6, 128))
    close(r.inv_freq, one(SMOLLM3_3B, HF).inv_freq.tolist())
    assert "Transformers backend" in r.notes[0]


def test_llama4_scout_llama3_on_the_rope_layers():
    r = one(LLAMA4_SCOUT)
    close(r.inv_freq, slow_llama3(500000.0, 128, 16.0, 1.0, 1.0, 8192))  # low == high: no blended band
    assert r.layout == "interleaved" and r.layers == tuple(i for i in range(48) if (i + 1) % 4)
    # transformers itself (posenc's reading refuses low_freq_factor == high_freq_factor)
    from transformers import Llama4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    keys = ("hidden_size", "num_attention_heads", "head_dim", "num_hidden_layers", "max_position_embeddings")
    hf = Llama4TextConfig(**{k: LLAMA4_SCOUT[k] for k in keys},
                          rope_parameters=LLAMA4_SCOUT["rope_scaling"] | {"rope_theta": 500000.0})
    inv, factor = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    close(r.inv_freq, inv.double().tolist(), rtol=1e-6)  # transformers computes in float32
    assert factor == r.attention_factor == 1.0
    assert r.layers == tuple(i for i, flag in enumerate(hf.no_rope_layers) if flag)
    # the Hub file's "no_rope_layers": [] is transformers' default: a NoPE layer every 4th
    assert one(LLAMA4_SCOUT | {"no_rope_layers": []}).layers == r.layers


# --- where vLLM differs from transformers ---------------------------------------------------------

def test_dynamic_is_static_plain_in_vllm():
    r = one(DYNAMIC_LLAMA)
    assert r.beyond == "static" and r.at_length is None
    close(r.inv_freq, slow_plain(10000.0, 128))  # stretch f*L/L - (f-1) = 1
    t = one(DYNAMIC_LLAMA, HF)
    assert t.beyond == "dynamic"
    close(r.inv_freq, t.frequencies(4096)[0].tolist())  # agree up to L
    stretched = 10000.0 * (2.0 * 8192 / 4096 - 1) ** (128 / 126)  # transformers at n = 2L
    close(t.frequencies(8192)[0].tolist(), slow_plain(stretched, 128))
    assert not torch.allclose(r.frequencies(8192)[0], t.frequencies(8192)[0])
    assert any("8192" in n and "outside" in n for n in r.notes)  # the table's 4096 rows vs max_model_len


def test_dynamic_with_max_trained_positions_stretches_once():
    r = one(DYNAMIC_LLAMA | {"rope_scaling": {"type": "dynamic", "factor": 2.0, "max_trained_positions": 2048}})
    close(r.inv_freq, slow_plain(10000.0 * (2.0 * 4096 / 2048 - 1) ** (128 / 126), 128))


def test_phi3_longrope_factors_chosen_by_max_model_len():
    cfg = PHI3_MINI_128K["rope_scaling"]
    plain = slow_plain(10000.0, 96)
    a = math.sqrt(1 + math.log(131072 / 4096) / math.log(4096))  # 1.19024
    r = one(PHI3_MINI_128K)
    close(r.inv_freq, [t / f for t, f in zip(plain, cfg["short_factor"])])
    assert r.beyond == "static" and math.isclose(r.attention_factor, a, rel_tol=1e-15)
    long = vllm_ropes(PHI3_MINI_128K, max_model_len=131072)[0]
    close(long.inv_freq, [t / f for t, f in zip(plain, cfg["long_factor"])])
    assert long.beyond == "static" and math.isclose(long.attention_factor, a, rel_tol=1e-15)
    t = one(PHI3_MINI_128K, HF)  # transformers: short up to 4096 tokens, long past them
    assert (t.beyond, t.switch_at) == ("switch", 4096)
    close(t.frequencies(4096)[0].tolist(), r.inv_freq.tolist())
    close(t.frequencies(4097)[0].tolist(), long.inv_freq.tolist())
    assert vllm_ropes(PHI3_MINI_128K, max_model_len=4096)[0].inv_freq.equal(r.inv_freq)


def test_deepseek_attention_factor_one_is_llama_scaling_without_softmax_correction():
    cfg = DEEPSEEK_V3 | {"rope_scaling": DEEPSEEK_V3["rope_scaling"] | {"attention_factor": 1.0}}
    r = one(cfg)
    close(r.inv_freq, slow_yarn(10000, 64, 40, 4096))
    assert r.softmax_scale == 1.0 and r.attention_factor == 1.0
    assert math.isclose(one(cfg, HF).softmax_scale, mscale(40) ** 2, rel_tol=1e-15)  # transformers keeps it


def test_deepseek_mscale_without_mscale_all_dim():
    cfg = DEEPSEEK_V3 | {"rope_scaling": {k: v for k, v in DEEPSEEK_V3["rope_scaling"].items() if k != "mscale_all_dim"}
                         | {"mscale": 0.707}}
    r = one(cfg)
    assert math.isclose(r.attention_factor, mscale(40, 0.707), rel_tol=1e-15) and r.softmax_scale == 1.0
    assert math.isclose(one(cfg, HF).attention_factor, mscale(40), rel_tol=1e-15)  # transformers: m(f) alone


def test_yarn_attention_factor_key_is_read():
    cfg = QWEN25_7B_YARN | {"rope_scaling": QWEN25_7B_YARN["rope_scaling"] | {"attention_factor": 1.5}}
    assert one(cfg).attention_factor == 1.5


# --- refusals ----------------------------------------------------------------------------------------

def test_unknown_rope_type_is_refused_as_vllm_refuses_it():
    with pytest.raises(Unsupported, match=r"^vLLM refuses rope_type 'foo': get_rope raises 'Unknown RoPE scaling"):
        one(MISTRAL_7B | {"rope_scaling": {"rope_type": "foo", "factor": 2.0}})


def test_missing_factor_and_bad_dicts():
    with pytest.raises(Unsupported, match=r"validate_rope raises KeyError .* 'yarn' without 'factor'"):
        one(QWEN25_7B_YARN | {"rope_scaling": {"type": "yarn"}})
    with pytest.raises(TypeError, match=r"^rope_scaling must be a dict or null, got str 'yarn'$"):
        one(MISTRAL_7B | {"rope_scaling": "yarn"})
    with pytest.raises(Unsupported, match=r"rope_type='yarn' and type='linear' conflict"):
        one(MISTRAL_7B | {"rope_scaling": {"rope_type": "yarn", "type": "linear", "factor": 2.0}})
    with pytest.raises(ValueError, match=r"\['long_factor'\] must have rotary_dim / 2 = 48 entries, got 3"):
        vllm_ropes(PHI3_MINI_128K | {"rope_scaling": PHI3_MINI_128K["rope_scaling"] | {"long_factor": [1.0] * 3}},
                   max_model_len=131072)
    with pytest.raises(ValueError, match=r"^model_type must be one of .* got 'bert'$"):
        one({"model_type": "bert", "num_hidden_layers": 2})
    with pytest.raises(ValueError, match=r"^max_model_len must be an int >= 1 or None, got 0$"):
        vllm_ropes(MISTRAL_7B, max_model_len=0)


def test_every_result_cites_vllm_and_its_version():
    configs = [LLAMA31_8B, QWEN25_7B_YARN, QWEN25_7B_1M, DEEPSEEK_V3, PHI3_MINI_128K, GEMMA3_4B, GPT_OSS_20B,
               MISTRAL_7B, SMOLLM3_3B, LLAMA4_SCOUT, DYNAMIC_LLAMA]
    ropes = [r for c in configs for r in engine_rule("vllm")(c)]
    assert len(ropes) == 12
    assert all(r.engine == "vllm" and "vLLM 0.33.0" in r.source for r in ropes)
    assert all(r.inv_freq.dtype == torch.float64 for r in ropes)
