"""from_hf on raw configs of each model family, against transformers' own classes.

Each case builds the config with the family's transformers config class (small sizes) and
feeds posenc.rotary.from_hf three forms of it: the keyword arguments as a Hub config.json
writes them (legacy keys such as ``rotary_pct``, ``rope_scaling``), ``config.to_dict()`` and
``json.loads(config.to_json_string())``. posenc's module must equal the family's own rotary
embedding module: inv_freq, attention scaling, cos/sin, and q/k rotated by that model's own
``apply_rotary_pos_emb`` (GPT-J: its sinusoid table and ``rotate_every_two``; DeepSeek-V3:
``apply_rotary_pos_emb_interleave``), at positions up to 40 000. For four families a tiny
randomly initialised transformers attention layer is compared whole with the same weights
rotated by posenc (a wrong rotary width or layout moves its output by ~0.1; the tolerance is 2e-4).
"""

from __future__ import annotations

import copy
import importlib
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from posenc.rotary import from_hf  # noqa: E402
from posenc.rotary.hf_readings import HF_READINGS  # noqa: E402

g = torch.Generator().manual_seed(0)
SHORT16, LONG16 = (1 + torch.rand(16, generator=g)).tolist(), (1 + 20 * torch.rand(16, generator=g)).tolist()
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 1024}
YARN_DS = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
           "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}
DS = dict(hidden_size=128, num_attention_heads=4, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64,
          q_lora_rank=None, rope_theta=10000.0, max_position_embeddings=163840)

# name -> (model_type, config class, Hub-style keyword arguments, layer_type)
CASES = {
    "llama": ("llama", "LlamaConfig", dict(hidden_size=256, num_attention_heads=4, rope_theta=5e5,
                                           max_position_embeddings=8192), None),
    "llama-linear": ("llama", "LlamaConfig", dict(hidden_size=256, num_attention_heads=4, max_position_embeddings=4096,
                                                  rope_scaling={"type": "linear", "factor": 2.0}), None),
    "llama-dynamic": ("llama", "LlamaConfig", dict(hidden_size=256, num_attention_heads=4, max_position_embeddings=2048,
                                                   rope_scaling={"rope_type": "dynamic", "factor": 4.0}), None),
    "llama-llama3": ("llama", "LlamaConfig", dict(hidden_size=256, num_attention_heads=4, rope_theta=5e5,
                                                  max_position_embeddings=8192, rope_scaling=LLAMA3), None),
    "llama-yarn": ("llama", "LlamaConfig", dict(hidden_size=256, num_attention_heads=4, rope_theta=1e6,
                                                max_position_embeddings=16384,
                                                rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                              "original_max_position_embeddings": 4096}), None),
    "llama-longrope": ("llama", "LlamaConfig", dict(hidden_size=128, num_attention_heads=4, max_position_embeddings=16384,
                                                    rope_scaling={"rope_type": "longrope", "short_factor": SHORT16,
                                                                  "long_factor": LONG16, "factor": 4.0,
                                                                  "original_max_position_embeddings": 4096}), None),
    "mistral": ("mistral", "MistralConfig", dict(hidden_size=256, num_attention_heads=4, head_dim=32, rope_theta=1e6,
                                                 max_position_embeddings=32768), None),
    "qwen2-yarn": ("qwen2", "Qwen2Config", dict(hidden_size=256, num_attention_heads=4, rope_theta=1e6,
                                                max_position_embeddings=131072,
                                                rope_scaling={"type": "yarn", "factor": 4.0,
                                                              "original_max_position_embeddings": 32768}), None),
    "qwen3": ("qwen3", "Qwen3Config", dict(hidden_size=128, num_attention_heads=4, head_dim=64, rope_theta=1e6,
                                           max_position_embeddings=40960), None),
    "gemma": ("gemma", "GemmaConfig", dict(hidden_size=128, num_attention_heads=2, head_dim=64, rope_theta=1e4,
                                           max_position_embeddings=8192), None),
    "gemma2": ("gemma2", "Gemma2Config", dict(hidden_size=128, num_attention_heads=2, head_dim=64, rope_theta=1e4,
                                              max_position_embeddings=8192), None),
    "gpt_oss-yarn": ("gpt_oss", "GptOssConfig", dict(hidden_size=128, num_attention_heads=2, head_dim=64,
                                                     rope_theta=150000.0, max_position_embeddings=131072,
                                                     rope_scaling={"rope_type": "yarn", "factor": 32.0,
                                                                   "beta_fast": 32.0, "beta_slow": 1.0,
                                                                   "truncate": False,
                                                                   "original_max_position_embeddings": 4096}), None),
    "gemma3-global": ("gemma3_text", "Gemma3TextConfig",
                      dict(hidden_size=128, num_attention_heads=2, head_dim=64, rope_theta=1e6,
                           rope_local_base_freq=1e4, max_position_embeddings=131072,
                           rope_scaling={"rope_type": "linear", "factor": 8.0}), "full_attention"),
    "gemma3-local": ("gemma3_text", "Gemma3TextConfig",
                     dict(hidden_size=128, num_attention_heads=2, head_dim=64, rope_theta=1e6,
                          rope_local_base_freq=1e4, max_position_embeddings=131072,
                          rope_scaling={"rope_type": "linear", "factor": 8.0}), "sliding_attention"),
    "phi": ("phi", "PhiConfig", dict(hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.5,
                                     rope_theta=1e4, max_position_embeddings=2048), None),
    "phi-dynamic": ("phi", "PhiConfig", dict(hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.375,
                                             max_position_embeddings=2048,
                                             rope_scaling={"type": "dynamic", "factor": 2.0}), None),
    "phi3-longrope": ("phi3", "Phi3Config", dict(hidden_size=128, num_attention_heads=4, rope_theta=1e4,
                                                 max_position_embeddings=131072, original_max_position_embeddings=4096,
                                                 rope_scaling={"type": "longrope", "short_factor": SHORT16,
                                                               "long_factor": LONG16}), None),
    "phi3-partial": ("phi3", "Phi3Config", dict(hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.5,
                                                max_position_embeddings=4096, original_max_position_embeddings=4096),
                     None),
    "gpt_neox": ("gpt_neox", "GPTNeoXConfig", dict(hidden_size=256, num_attention_heads=4, rotary_pct=0.25,
                                                   rotary_emb_base=1e6, max_position_embeddings=2048), None),
    "gpt_neox-linear": ("gpt_neox", "GPTNeoXConfig", dict(hidden_size=256, num_attention_heads=4, rotary_pct=0.5,
                                                          rotary_emb_base=1e4, max_position_embeddings=2048,
                                                          rope_scaling={"type": "linear", "factor": 3.0}), None),
    "gptj": ("gptj", "GPTJConfig", dict(n_embd=256, n_head=4, rotary_dim=16, n_positions=65536), None),
    "stablelm": ("stablelm", "StableLmConfig", dict(hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.25,
                                                    rope_theta=1e4, max_position_embeddings=4096), None),
    "deepseek_v3-yarn": ("deepseek_v3", "DeepseekV3Config", dict(DS, rope_scaling=YARN_DS), None),
    "deepseek_v3-half": ("deepseek_v3", "DeepseekV3Config", dict(DS, rope_interleave=False), None),
}
FORMS = ["hub", "to_dict", "json"]
SHORT = torch.arange(0, 64, 7)[None]
LONG = torch.tensor([[0, 1, 37, 1000, 4095, 4096, 9000, 20000, 40000]])


def hf_config(name):
    model_type, cls, kwargs, _ = CASES[name]
    return getattr(transformers, cls)(**copy.deepcopy(kwargs))


def config_form(name, form):
    model_type, _, kwargs, _ = CASES[name]
    if form == "hub":
        return {"model_type": model_type, **copy.deepcopy(kwargs)}
    cfg = hf_config(name)
    return cfg.to_dict() if form == "to_dict" else json.loads(cfg.to_json_string())


def _module(model_type):
    mod = "gemma3" if model_type == "gemma3_text" else model_type
    return importlib.import_module(f"transformers.models.{mod}.modeling_{mod}")


def hf_rotate(name, q, k, pos):
    """transformers' (inv_freq, attention scaling, cos (B,T,r/2), sin, rotated q, rotated k) for the
    family, q/k (B, H, T, D); rotated channels in posenc's order (the family's layout)."""
    model_type, _, _, layer_type = CASES[name]
    cfg, mod = hf_config(name), _module(model_type)
    if model_type == "gptj":
        r = cfg.rotary_dim
        table = mod.create_sinusoidal_positions(cfg.n_positions, r)  # (P, r): sin | cos
        sin, cos = table[pos].split(r // 2, dim=-1)  # (B, T, r/2)
        rot = lambda x: mod.apply_rotary_pos_emb(x[..., :r].transpose(1, 2), sin, cos).transpose(1, 2)  # noqa: E731
        inv = 1.0 / (10000 ** (torch.arange(0, r, 2, dtype=torch.int64) / r))  # as create_sinusoidal_positions
        return inv, 1.0, cos, sin, rot(q), rot(k)
    cls = next(getattr(mod, n) for n in dir(mod) if n.endswith("RotaryEmbedding") and "Config" not in n)
    rotary = cls(cfg)
    if model_type == "gemma3_text":
        cos, sin = rotary(q, pos, layer_type)
        inv, scaling = getattr(rotary, f"{layer_type}_inv_freq"), getattr(rotary, f"{layer_type}_attention_scaling")
    else:
        cos, sin = rotary(q, pos)
        inv, scaling = rotary.inv_freq, rotary.attention_scaling
    r = cos.shape[-1]
    if model_type == "gpt_oss":  # its cos/sin hold one column per pair (the halves are rotated apart)
        hq, hk = mod.apply_rotary_pos_emb(q[..., :2 * r], k[..., :2 * r], cos, sin)
        return inv, scaling, cos, sin, hq, hk
    if model_type == "deepseek_v3" and cfg.rope_interleave:
        hq, hk = mod.apply_rotary_pos_emb_interleave(q[..., :r], k[..., :r], cos, sin)
        # transformers returns the pairs de-interleaved (even channels, then odd): back to pairs.
        inter = lambda x: torch.stack(x.chunk(2, dim=-1), dim=-1).flatten(-2)  # noqa: E731
        hq, hk = inter(hq), inter(hk)
    else:
        hq, hk = mod.apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin)
    return inv, scaling, cos[..., : r // 2], sin[..., : r // 2], hq, hk


def test_every_family_and_scaling_is_covered():
    families = {c[0] for c in CASES.values()}
    assert families == {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3",
                        "gpt_neox", "gptj", "stablelm", "deepseek_v3", "gpt_oss"}
    types = {(c[2].get("rope_scaling") or {}).get("rope_type", (c[2].get("rope_scaling") or {}).get("type", "default"))
             for c in CASES.values()}
    assert types == {"default", "linear", "dynamic", "yarn", "llama3", "longrope"}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_family_in_transformers(name, form):
    model_type, _, _, layer_type = CASES[name]
    rope = from_hf(config_form(name, form), layer_type=layer_type)
    D, r = rope.dims.head_dim, rope.rotary_dim
    for pos in (SHORT, LONG):
        q, k = torch.randn(1, 4, pos.shape[1], D, generator=g), torch.randn(1, 2, pos.shape[1], D, generator=g)
        inv, scaling, cos, sin, hq, hk = hf_rotate(name, q, k, pos)
        assert r == 2 * inv.numel()
        seq_len = int(pos.max()) + 1
        ours_inv, ours_af = rope.frequencies(seq_len if rope.config.scaling_config.length_dependent else None)
        # transformers rounds base ** (2i/d) to float32: <= ~1e-6 relative (base 1e6); ours is float64.
        torch.testing.assert_close(ours_inv.float(), inv.float(), rtol=2e-6, atol=0)
        assert ours_af == pytest.approx(scaling, rel=1e-12)
        # transformers' angles are float32 products pos * inv_freq: error ~ pos * 2^-24 rad.
        tol = 8 * seq_len * 2**-24 + 1e-6
        oc, os_ = rope.cos_sin(pos)
        torch.testing.assert_close(oc, cos, atol=tol, rtol=0)
        torch.testing.assert_close(os_, sin, atol=tol, rtol=0)
        rq, rk = rope.rotate(q, k, pos, pos)
        torch.testing.assert_close(rq[..., :r], hq, atol=5 * tol, rtol=0)
        torch.testing.assert_close(rk[..., :r], hk, atol=5 * tol, rtol=0)
        assert torch.equal(rq[..., r:], q[..., r:]) and torch.equal(rk[..., r:], k[..., r:])


@pytest.mark.parametrize(
    "name, rotary_dim, base, layout",
    [("gpt_neox", 16, 1e6, "half"), ("gptj", 16, 1e4, "interleaved"), ("deepseek_v3-yarn", 32, 1e4, "interleaved"),
     ("deepseek_v3-half", 32, 1e4, "half"), ("phi", 32, 1e4, "half"), ("stablelm", 16, 1e4, "half"),
     ("gemma3-local", 64, 1e4, "half"), ("gemma3-global", 64, 1e6, "half")],
)
def test_the_issue_families_read_their_own_keys(name, rotary_dim, base, layout):
    # Issue 10: Pythia's rotary_pct/rotary_emb_base, GPT-J's rotary_dim, DeepSeek's
    # qk_rope_head_dim/rope_interleave were ignored or refused. Values worked out from the kwargs.
    _, _, _, layer_type = CASES[name]
    rope = from_hf(config_form(name, "hub"), layer_type=layer_type)
    assert (rope.rotary_dim, rope.config.base, rope.config.layout) == (rotary_dim, base, layout)


def test_pretrained_config_object_is_read_by_to_dict():
    cfg = hf_config("gpt_neox")
    rope = from_hf(cfg)
    assert rope.rotary_dim == 16 and rope.config.base == 1e6
    torch.testing.assert_close(rope.inv_freq, from_hf(cfg.to_dict()).inv_freq, rtol=0, atol=0)


def test_the_callers_dict_is_not_edited():
    raw = config_form("gemma3-global", "hub")
    before = copy.deepcopy(raw)
    from_hf(raw, layer_type="full_attention")
    assert raw == before


def test_defaults_of_each_family_when_keys_are_absent():
    # transformers' defaults: GPT-NeoX rotary_pct 0.25, StableLM 0.25, Phi 0.5 (config classes),
    # Gemma 3 theta 1e6 global / 1e4 local, DeepSeek rope_interleave true.
    assert from_hf({"model_type": "gpt_neox", "hidden_size": 256, "num_attention_heads": 4}).rotary_dim == 16
    assert from_hf({"model_type": "stablelm", "hidden_size": 256, "num_attention_heads": 4}).rotary_dim == 16
    assert from_hf({"model_type": "phi", "hidden_size": 256, "num_attention_heads": 4}).rotary_dim == 32
    g3 = {"model_type": "gemma3_text", "head_dim": 64, "num_attention_heads": 2}
    assert from_hf(g3, layer_type="full_attention").config.base == 1e6
    assert from_hf(g3, layer_type="sliding_attention").config.base == 1e4
    ds = {"model_type": "deepseek_v3", "qk_rope_head_dim": 64, "num_attention_heads": 2, "hidden_size": 128}
    assert from_hf(ds).config.layout == "interleaved"
    for name in ("gpt_neox", "stablelm", "phi"):  # the same defaults as transformers' config classes
        hf = getattr(transformers, CASES[name][1])(hidden_size=256, num_attention_heads=4)
        assert from_hf({"model_type": name, "hidden_size": 256, "num_attention_heads": 4}).rotary_dim == int(
            64 * hf.rope_parameters["partial_rotary_factor"])


BASE = {"hidden_size": 128, "num_attention_heads": 2, "max_position_embeddings": 4096}


@pytest.mark.parametrize(
    "config, error, match",
    [
        ({"model_type": "llama", "rotary_pct": 0.25}, ValueError, r"'rotary_pct' not read for model_type 'llama'"),
        ({"model_type": "llama", "rope_interleave": True}, ValueError, r"'rope_interleave' not read"),
        ({"model_type": "gpt_neox", "rope_theta": 1e6}, ValueError, r"'rope_theta' not read for model_type 'gpt_neox'.*rotary_emb_base"),
        ({"model_type": "gpt_neox", "partial_rotary_factor": 0.5}, ValueError, r"'partial_rotary_factor' not read"),
        ({"model_type": "gptj", "rotary_dim": 16, "rope_theta": 1e6}, ValueError, r"'rope_theta' not read for model_type 'gptj'"),
        ({"model_type": "gptj", "rotary_dim": 16, "rope_scaling": {"type": "linear", "factor": 2.0}}, ValueError,
         r"'rope_scaling' not read for model_type 'gptj'"),
        ({"model_type": "qwen2", "rotary_emb_base": 1e6}, ValueError, r"'rotary_emb_base' not read"),
        ({"model_type": "mistral", "original_max_position_embeddings": 1024}, ValueError,
         r"'original_max_position_embeddings' not read for model_type 'mistral' with rope type 'default'"),
        ({"model_type": "llama", "partial_rotary_factor": 0.5}, ValueError, r"partial_rotary_factor must be 1 for model_type 'llama'"),
        ({"model_type": "llama", "rope_theta": None}, TypeError, r"rope_theta must be a number, got NoneType"),
        ({"model_type": "llama", "rope_theta": -5.0}, ValueError, r"rope_theta must be > 0, got -5.0"),
        ({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": "two"}}, TypeError,
         r"rope_scaling\['factor'\] must be a float or None, got str 'two'"),
        ({"model_type": "llama", "rope_parameters": {"rope_type": "linear", "factor": 0.5}}, ValueError,
         r"rope_parameters\['factor'\] must be in \[1.0, inf\)|rope_parameters\['factor'\] must be >= 1"),
        ({"model_type": "phi3", "original_max_position_embeddings": 1024,
          "rope_scaling": {"type": "longrope", "short_factor": 1.0, "long_factor": [1.0] * 32}}, TypeError,
         r"rope_scaling\['short_factor'\] must be a tuple \(or list\) of floats, got float 1.0"),
        ({"model_type": "phi3", "original_max_position_embeddings": 1024,
          "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 5, "long_factor": [1.0] * 32}}, ValueError,
         r"rope_scaling\['short_factor'\] must have rotary_dim/2 = 32 entries.*got 5"),
        ({"model_type": "phi3", "rope_scaling": {"type": "linear", "factor": 2.0}}, ValueError,
         r"rope_scaling\['rope_type'\] must be one of 'default', 'longrope' for model_type 'phi3'; got 'linear'"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": None}}, TypeError,
         r"rope_scaling\['truncate'\] must be a bool, got NoneType None"),
        ({"model_type": "llama", "rope_theta": 1e4, "rope_parameters": {"rope_theta": 5e5}}, ValueError,
         r"rope_theta=10000.0 and rope_parameters\['rope_theta'\]=500000.0 disagree"),
        ({"model_type": "gpt_neox", "rotary_pct": 0.3}, ValueError, r"rotary_pct=0.3 gives int\(head_dim 64 \* 0.3\) = 19"),
        ({"model_type": "gptj", "rotary_dim": None}, TypeError, r"rotary_dim must be an int, got NoneType"),
        ({"model_type": "gptj", "rotary_dim": 128}, ValueError, r"rotary_dim must be <= head_dim = 64, got 128"),
        ({"model_type": "deepseek_v3", "qk_rope_head_dim": 64, "rope_interleave": "yes"}, TypeError,
         r"rope_interleave must be true or false, got str 'yes'"),
        ({"model_type": "deepseek_v3", "qk_rope_head_dim": 64, "head_dim": 128}, ValueError,
         r"head_dim=128 and qk_rope_head_dim=64 disagree"),
        ({"model_type": "falcon"}, ValueError, r"model_type must be one of 'llama', .*; got 'falcon'"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "ntk"}}, ValueError,
         r"rope_scaling\['rope_type'\] must be one of .*got 'ntk'"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 4}}, ValueError,
         r"unknown key\(s\) 'beta_fast' in rope_scaling for rope type 'linear'"),
        ({"model_type": "llama", "rope_scaling": {"type": "dynamic"}}, ValueError, r"needs rope_scaling\['factor'\]"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 8192}},
         ValueError, r"factor'\] is absent, so it is max_position_embeddings / original_max_position_embeddings = 4096 / 8192 = 0.5"),
    ],
)
def test_bad_or_unread_keys_are_errors_naming_the_key(config, error, match):
    with pytest.raises(error, match=match):
        from_hf(BASE | config)


def test_per_layer_type_rope_parameters_need_layer_type():
    cfg = config_form("gemma3-global", "to_dict")
    with pytest.raises(ValueError, match=r"per layer type: pass layer_type= one of 'full_attention', 'sliding_attention'"):
        from_hf(cfg)
    with pytest.raises(ValueError, match=r"layer_type must be one of 'full_attention', 'sliding_attention'; got 'global'"):
        from_hf(cfg, layer_type="global")
    cfg["rope_parameters"]["sliding_attention"] = None
    with pytest.raises(ValueError, match=r"'sliding_attention' has no rotary embedding"):
        from_hf(cfg, layer_type="sliding_attention")
    # A flat rope dict is shared by every declared layer type (Gemma 2); an undeclared one is an error.
    g2 = config_form("gemma2", "to_dict")
    assert from_hf(g2, layer_type="full_attention").config.base == 1e4
    with pytest.raises(ValueError, match=r"layer_type must be one of the config's layer_types"):
        from_hf(g2, layer_type="chunked_attention")


def test_not_a_config():
    with pytest.raises(TypeError, match="config must be a dict .* or a transformers PretrainedConfig, got str"):
        from_hf("config.json")
    with pytest.raises(TypeError, match=r"model_type must be a str, got list"):
        from_hf(BASE | {"model_type": ["llama"]})
    with pytest.raises(TypeError, match=r"layer_type must be a str or None, got int 0"):
        from_hf(BASE, layer_type=0)
    with pytest.raises(ValueError, match=r"layer_type must be None for model_type 'gptj'"):
        from_hf(config_form("gptj", "hub"), layer_type="full_attention")
    with pytest.raises(ValueError, match=r"layer_type must be None: the config has one rope dict and no layer_types"):
        from_hf(BASE, layer_type="full_attention")


def _posenc_attention(rope, x, pos, wq, wk, wv, wo, H, Hkv, scale, bq=None, bk=None, bv=None, bo=None):
    """Bidirectional attention with posenc's rotation and the HF layer's projection weights."""
    B, T, _ = x.shape
    D = rope.dims.head_dim
    lin = torch.nn.functional.linear
    q = lin(x, wq, bq).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = lin(x, wk, bk).view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
    v = lin(x, wv, bv).view(B, T, Hkv, D).transpose(1, 2)
    q, k = rope.rotate(q, k, pos, pos)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    probs = ((q @ k.transpose(-1, -2)) * scale).softmax(-1)  # (B, H, T, T)
    return lin((probs @ v).transpose(1, 2).reshape(B, T, H * D), wo, bo)


@pytest.mark.parametrize("name", ["llama-yarn", "gpt_neox", "phi", "gptj"])
def test_attention_layer_output_matches_a_tiny_random_transformers_layer(name):
    # A randomly initialised attention layer of the family (eager attention, no mask) against
    # the same weights with posenc's RoPE from the raw config: the whole layer, not just q/k.
    model_type, _, _, _ = CASES[name]
    cfg, mod = hf_config(name), _module(model_type)
    cfg._attn_implementation = "eager"
    rope = from_hf(config_form(name, "hub"))
    torch.manual_seed(1)
    B, T = 2, 7
    x = torch.randn(B, T, rope.dims.d_model)
    pos = torch.tensor([[0, 3, 900, 901, 2047, 5, 1], [10, 11, 12, 1500, 1501, 1502, 2000]])
    D = rope.dims.head_dim
    H = rope.dims.num_heads
    if model_type == "gptj":
        layer = mod.GPTJAttention(cfg, layer_idx=0).eval()
        with torch.no_grad():
            if hasattr(mod, "GPTJRotaryEmbedding"):  # transformers >= 5.24: one shared (sin, cos) module
                want = layer(x, position_embeddings=mod.GPTJRotaryEmbedding(cfg)(x, pos))[0]
            else:
                want = layer(x, position_ids=pos)[0]
            got = _posenc_attention(rope, x, pos, layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight,
                                    layer.out_proj.weight, H, H, D**-0.5)
    else:
        cls = {"llama": "LlamaAttention", "gpt_neox": "GPTNeoXAttention", "phi": "PhiAttention"}[model_type]
        layer = getattr(mod, cls)(cfg, layer_idx=0).eval()
        rotary = next(getattr(mod, n) for n in dir(mod) if n.endswith("RotaryEmbedding"))(cfg)
        with torch.no_grad():
            cos_sin = rotary(x, pos)
            want = layer(x, attention_mask=None, position_embeddings=cos_sin)[0]
            if model_type == "gpt_neox":  # fused qkv, laid out per head as [q | k | v]
                w = layer.query_key_value.weight.view(H, 3, D, -1)
                b = layer.query_key_value.bias.view(H, 3, D)
                wq, wk, wv = (w[:, i].reshape(H * D, -1) for i in range(3))
                bq, bk, bv = (b[:, i].reshape(H * D) for i in range(3))
                got = _posenc_attention(rope, x, pos, wq, wk, wv, layer.dense.weight, H, H, D**-0.5,
                                        bq, bk, bv, layer.dense.bias)
            else:
                out = layer.o_proj if model_type == "llama" else layer.dense
                Hkv = cfg.num_key_value_heads
                got = _posenc_attention(rope, x, pos, layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight,
                                        out.weight, H, Hkv, D**-0.5, layer.q_proj.bias, layer.k_proj.bias,
                                        layer.v_proj.bias, out.bias)
    assert want.shape == got.shape == x.shape
    # float32 angles in transformers at positions <= 2047: ~2047 * 2^-24 rad.
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_off_values_of_unread_keys_are_accepted_and_on_values_refused():
    # Hub configs write "rope_scaling": null and (Qwen2-based distills) "use_mrope": false.
    base = {"model_type": "qwen2", "hidden_size": 128, "num_attention_heads": 2, "rope_theta": 1e6}
    assert from_hf(base | {"use_mrope": False, "rope_scaling": None}).config.base == 1e6
    with pytest.raises(ValueError, match=r"'use_mrope' not read for model_type 'qwen2'"):
        from_hf(base | {"use_mrope": True})
    with pytest.raises(ValueError, match=r"'rope_theta' not read for model_type 'gpt_neox'"):
        from_hf({"model_type": "gpt_neox", "hidden_size": 128, "num_attention_heads": 2, "rope_theta": 0})


def test_phi3_legacy_su_type_is_longrope():
    raw = config_form("phi3-longrope", "hub")
    su = copy.deepcopy(raw)
    su["rope_scaling"]["type"] = "su"
    a, b = from_hf(raw), from_hf(su)
    assert b.config.scaling == "longrope"
    for n in (100, 5000):
        assert torch.equal(a.frequencies(n)[0], b.frequencies(n)[0]) and a.frequencies(n)[1] == b.frequencies(n)[1]


def _dims_keys(model_type):
    """The keys a family's config.json gives its width and heads under (GPT-J: its attribute_map's)."""
    return ("n_embd", "n_head") if model_type == "gptj" else ("hidden_size", "num_attention_heads")


_READ = list(HF_READINGS)


def _layer(model_type):
    """layer_type= for families with one RoPE per layer type (Gemma 3, ModernBERT)."""
    per_layer = HF_READINGS[model_type].per_layer
    return {"layer_type": per_layer[0][0]} if per_layer else {}


@pytest.mark.parametrize("model_type", _READ, ids=[str(t) for t in _READ])
def test_missing_dims_name_the_keys_this_family_uses(model_type):
    """Every reading names its own keys: a config without model_type (or any family but GPT-J)
    never hears about GPT-J's n_embd / n_head."""
    config = {} if model_type is None else {"model_type": model_type}
    if HF_READINGS[model_type].width_key == "qk_rope_head_dim":  # DeepSeek: the rope head is its own key
        with pytest.raises(TypeError, match=r"^qk_rope_head_dim must be an int, got NoneType None"):
            from_hf(config)
        return
    hidden, heads = _dims_keys(model_type)
    with pytest.raises(ValueError, match=rf"^config needs 'head_dim', or '{hidden}' and '{heads}' to derive it$"):
        from_hf(config, **_layer(model_type))


@pytest.mark.parametrize("model_type", [t for t in _READ if HF_READINGS[t].width_key != "qk_rope_head_dim"],
                         ids=str)
def test_width_not_divisible_by_heads_is_named_as_that(model_type):
    """hidden_size 100 over 3 heads is reported as that, not as a rotary-fraction problem."""
    hidden, heads = _dims_keys(model_type)
    config = {hidden: 100, heads: 3} | ({} if model_type is None else {"model_type": model_type})
    if model_type == "gptj":
        config["rotary_dim"] = 8
    with pytest.raises(ValueError, match=rf"^{hidden} \(100\) must be divisible by {heads} \(3\) to give the head size"):
        from_hf(config, **_layer(model_type))
    assert from_hf(config | {"head_dim": 32}, **_layer(model_type)).dims.head_dim == 32  # an explicit head_dim is read as given
