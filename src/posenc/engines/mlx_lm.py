"""mlx-lm's reading of a config.json as RoPE: the registered rule ``"mlx-lm"``.

Re-derived from mlx-lm 0.32.2, ``mlx_lm/models/rope_utils.py`` ``initialize_rope``: the type is
``rope_scaling["type"]`` or ``["rope_type"]`` (default "default"), then

* default / linear: ``nn.RoPE`` with ``scale = 1 / factor`` (positions times scale);
* dynamic: ``DynamicNTKScalingRoPE``, supported: each call recomputes
  ``base * (factor * n / L - (factor - 1)) ** (d / (d - 2))`` with ``n = max(tokens so far, L)``;
* llama3: ``Llama3RoPE`` (wavelength > L/low: theta / factor; between L/high and L/low,
  strictly: the smooth blend; else theta);
* yarn, deepseek_yarn, telechat3-yarn: ``YarnRoPE`` given only ``original_max_position_embeddings``
  (default 4096), ``beta_fast`` (32), ``beta_slow`` (1), ``mscale`` (1), ``mscale_all_dim`` (0):
  an explicit ``attention_factor``, ``truncate`` or ``extrapolation_factor`` is not read. The ramp
  ends are always floor/ceil; q and k are multiplied by ``mscale(f, mscale) / mscale(f, mscale_all_dim)``
  (``mscale(f, 0) = 1``), i.e. cos/sin carry it;
* longrope: ``SuScaledRoPE``, which always uses ``long_factor`` (``short_factor`` is taken and
  never used) and multiplies q and k by ``sqrt(1 + ln(L / L0) / ln L0)``;
* mrope (three sections): plain ``nn.RoPE`` for text; anything else raises
  ``ValueError("Unsupported RoPE type ...")``.

The model files choose what they pass (``mlx_lm/models/``): ``llama.py`` (also "mistral",
remapped in ``utils.py``; ``head_dim`` or hidden/heads, ``rope_theta`` default 10000,
``rope_traditional``), ``smollm3.py`` (llama with ``no_rope_layers``, else every
``no_rope_layer_interval``-th layer without RoPE), ``qwen2.py`` (hidden/heads; theta default 1e6),
``deepseek_v3.py`` (``qk_rope_head_dim``, traditional = interleaved; the softmax scale times
``mscale(f, mscale_all_dim)^2``), ``gemma3_text.py`` (layer i slides unless
``(i + 1) % sliding_window_pattern == 0``; sliding layers: ``rope_local_base_freq``, no scaling),
``phi3.py`` (its own check: ``rope_scaling`` needs ``type`` and ``long_factor``; su/longrope ->
``SuScaledRoPE`` with the top-level ``original_max_position_embeddings``; linear; other types
dropped with a printed warning) and ``gpt_oss.py``. Every one reads ``rope_scaling`` and a
top-level ``rope_theta``: a transformers-5 ``rope_parameters`` is not read.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping

import torch

from .base import EngineRope, Unsupported, register_engine

__all__ = ["MODEL_TYPES", "mlx_lm_rope"]

VERSION = "0.32.2"
SOURCE = "mlx-lm 0.32.2: mlx_lm/models/rope_utils.py initialize_rope, models/<model_type>.py"
# model_type -> the file that reads it (utils.MODEL_REMAPPING included)
MODEL_TYPES = {"llama": "llama", "mistral": "llama", "smollm3": "smollm3", "qwen2": "qwen2",
               "deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3", "gemma3_text": "gemma3_text",
               "gemma3": "gemma3_text", "phi3": "phi3", "gpt_oss": "gpt_oss"}
_THETA = {"llama": 10000.0, "smollm3": 10000.0, "qwen2": 1_000_000.0, "deepseek_v3": 10000.0,
          "gemma3_text": 1_000_000.0, "phi3": 10000.0, "gpt_oss": 150000.0}
_MAX_POS = {"qwen2": 32768, "deepseek_v3": 2048, "gemma3_text": 32768, "phi3": 131072}


def _mscale(scale: float, m: float) -> float:
    """``yarn_get_mscale``: 1 for scale <= 1, else 1 + 0.1 m ln(scale)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _base(d: int, theta: float) -> torch.Tensor:
    return theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _need(cfg: Mapping[str, Any], key: str, kind: str) -> Any:
    if key not in cfg:
        raise Unsupported(f"mlx-lm 0.32.2 fails on rope type {kind!r} without rope_scaling[{key!r}] (KeyError)")
    return cfg[key]


def _llama3(d: int, theta: float, cfg: Mapping[str, Any]) -> torch.Tensor:
    factor = float(_need(cfg, "factor", "llama3"))
    low, high = cfg.get("low_freq_factor", 1.0), cfg.get("high_freq_factor", 4.0)
    old = cfg.get("original_max_position_embeddings", 8192)
    periods = 1 / _base(d, theta)  # theta ** (2i/d), mlx's "freqs"
    wavelen = 2 * math.pi * periods
    scaled = torch.where(wavelen > old / low, periods * factor, periods)
    smooth = (old / wavelen - low) / (high - low)
    medium = (wavelen > old / high) & (wavelen < old / low)
    return 1 / torch.where(medium, scaled / ((1 - smooth) / factor + smooth), scaled)


def _yarn(d: int, theta: float, cfg: Mapping[str, Any]) -> tuple[torch.Tensor, float]:
    factor = float(_need(cfg, "factor", "yarn"))
    orig = cfg.get("original_max_position_embeddings", 4096)
    beta_fast, beta_slow = cfg.get("beta_fast", 32), cfg.get("beta_slow", 1)

    def corr(rot: float) -> float:
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), d - 1)
    if lo == hi:
        hi += 0.001
    extrap_mask = 1 - ((torch.arange(d // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    inv = _base(d, theta)
    inv = inv * extrap_mask + inv / factor * (1 - extrap_mask)
    return inv, _mscale(factor, cfg.get("mscale", 1)) / _mscale(factor, cfg.get("mscale_all_dim", 0))


def _longrope(d: int, theta: float, long: Any, max_pos: Any, orig: Any) -> tuple[torch.Tensor, float]:
    if not isinstance(long, (list, tuple)) or len(long) != d // 2:
        raise ValueError(f"rope_scaling long_factor must be a list of {d // 2} numbers (rotary_dim / 2), got {long!r:.60}")
    if max_pos is None:
        raise Unsupported("mlx-lm 0.32.2 fails on longrope without max_position_embeddings (TypeError)")
    factor = max_pos / orig
    scale = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    return _base(d, theta) / torch.tensor([float(v) for v in long], dtype=torch.float64), scale


def _initialize_rope(d: int, theta: float, traditional: bool, cfg: Mapping[str, Any] | None,
                     max_pos: Any, **kw: Any) -> EngineRope:
    """``initialize_rope(dims, base, traditional, scaling_config, max_position_embeddings)``."""
    kind = (cfg.get("type") or cfg.get("rope_type", "default")) if cfg else "default"
    layout = "interleaved" if traditional else "half"
    make = lambda inv, a=1.0, **more: EngineRope(engine="mlx-lm", inv_freq=inv, attention_factor=a,  # noqa: E731
                                                 rotary_dim=d, layout=layout, source=SOURCE, **kw, **more)
    if kind in ("default", "linear"):
        scale = 1 / float(_need(cfg, "factor", "linear")) if kind == "linear" else 1.0
        return make(_base(d, theta) * scale)
    if kind == "dynamic":
        factor = float(_need(cfg, "factor", "dynamic"))
        if max_pos is None:
            raise Unsupported("mlx-lm 0.32.2 fails on dynamic without max_position_embeddings (TypeError)")

        def at(n: int) -> tuple[torch.Tensor, float]:
            n = max(int(n), int(max_pos))
            return _base(d, theta * (factor * n / max_pos - (factor - 1)) ** (d / (d - 2))), 1.0

        return make(_base(d, theta), beyond="dynamic", at_length=at)
    if kind == "llama3":
        return make(_llama3(d, theta, cfg))
    if kind in ("yarn", "deepseek_yarn", "telechat3-yarn"):
        return make(*_yarn(d, theta, cfg))
    if kind == "longrope":
        orig = _need(cfg, "original_max_position_embeddings", "longrope")
        return make(*_longrope(d, theta, _need(cfg, "long_factor", "longrope"), max_pos, orig))
    if kind == "mrope":
        if len(cfg.get("mrope_section", [])) != 3:
            raise Unsupported("mlx-lm 0.32.2 asserts: MRoPE currently only supports 3 sections")
        return make(_base(d, theta))
    if kind == "proportional":
        raise ValueError("mlx-lm's 'proportional' RoPE (ProportionalRoPE) is not modelled here")
    raise Unsupported(f"mlx-lm 0.32.2 raises ValueError: Unsupported RoPE type {kind} "
                      "(initialize_rope knows default, linear, dynamic, llama3, yarn, longrope, proportional, mrope)")


def _int(config: Mapping[str, Any], key: str) -> int:
    v = config.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"config {key} must be an integer > 0, got {v!r}")
    return v


@register_engine("mlx-lm", version=VERSION,
                 summary="rope_utils.initialize_rope: YaRN without attention_factor/truncate, longrope always long")
def mlx_lm_rope(config: Mapping[str, Any]) -> list[EngineRope]:
    """mlx-lm 0.32.2's RoPE for each rotating layer group of ``config`` (a parsed config.json)."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict (a parsed config.json), got {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {', '.join(MODEL_TYPES)} (the mlx-lm model files modelled "
                         f"here), got {model_type!r}")
    family = MODEL_TYPES[model_type]
    if model_type == "gemma3" and isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]
    notes: list[str] = []
    cfg = config.get("rope_scaling")
    if cfg is not None and not isinstance(cfg, Mapping):
        raise TypeError(f"rope_scaling must be a dict, got {type(cfg).__name__}")
    if config.get("rope_parameters") and not cfg:
        notes.append(f"rope_parameters is not read (mlx-lm's {family}.py reads rope_scaling and rope_theta)")
    if cfg and "factor" in cfg and (cfg.get("type") or cfg.get("rope_type")) in ("yarn", "deepseek_yarn"):
        for key in ("attention_factor", "truncate", "extrapolation_factor"):
            if key in cfg:
                notes.append(f"rope_scaling {key} is not read by YarnRoPE")
    if cfg and (cfg.get("type") or cfg.get("rope_type")) in ("longrope", "su"):
        notes.append("longrope: the long factors at every length (short_factor is never used)")
    theta = float(config.get("rope_theta", _THETA[family]))
    max_pos = config.get("max_position_embeddings", _MAX_POS.get(family))
    n_layer = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    traditional = bool(config.get("rope_traditional", False))
    kw = {"notes": tuple(notes)}

    if family in ("llama", "smollm3"):
        d = config.get("head_dim") or _int(config, "hidden_size") // heads
        if family == "smollm3":
            use = config.get("no_rope_layers")
            if use is None:
                every = config.get("no_rope_layer_interval", 4)
                use = [int((i + 1) % every != 0) for i in range(n_layer)]
            elif len(use) != n_layer:
                raise Unsupported("mlx-lm 0.32.2 refuses the file: `no_rope_layers` length mismatch")
            layers = tuple(i for i in range(n_layer) if use[i])
            kw["layers"] = None if len(layers) == n_layer else layers
        return [_initialize_rope(d, theta, traditional, cfg, max_pos, **kw)]
    if family == "qwen2":
        d = _int(config, "hidden_size") // heads
        return [_initialize_rope(d, theta, traditional, cfg, max_pos, **kw)]
    if family == "gpt_oss":
        return [_initialize_rope(config.get("head_dim", 64), theta, False, cfg, None, **kw)]
    if family == "deepseek_v3":
        rope = _initialize_rope(config.get("qk_rope_head_dim", 64), theta, True, cfg, max_pos, **kw)
        m_all = (cfg or {}).get("mscale_all_dim", 0)
        if m_all and float(cfg["factor"]) > 1:
            s = 0.1 * m_all * math.log(float(cfg["factor"])) + 1.0
            rope = replace(rope, softmax_scale=s * s)
        return [rope]
    if family == "gemma3_text":
        d = config.get("head_dim", 256)
        pattern = config.get("sliding_window_pattern", 6)
        sliding = tuple(i for i in range(n_layer) if (i + 1) % pattern != 0)
        full = tuple(i for i in range(n_layer) if (i + 1) % pattern == 0)
        out = []
        if sliding:
            out.append(_initialize_rope(d, float(config.get("rope_local_base_freq", 10000.0)), False, None, None,
                                        layer_type="sliding_attention", layers=sliding, **kw))
        if full:
            out.append(_initialize_rope(d, theta, False, cfg, max_pos, layer_type="full_attention",
                                        layers=full, **kw))
        if len(out) == 1:
            out = [replace(out[0], layer_type=None, layers=None)]
        return out
    # phi3.py: its own ModelArgs check, then SuScaledRoPE or nn.RoPE
    d = int(config["hidden_size"] // heads * config.get("partial_rotary_factor", 1.0))
    if cfg:
        if "type" not in cfg or "long_factor" not in cfg:
            raise Unsupported("mlx-lm 0.32.2 refuses the file: rope_scaling must contain keys {'long_factor', 'type'}")
        if cfg["type"] not in ("longrope", "su", "linear"):
            kw["notes"] += (f"rope_scaling type {cfg['type']!r} dropped with a printed warning: plain RoPE",)
            cfg = None
    if cfg and cfg["type"] in ("longrope", "su"):
        orig = config.get("original_max_position_embeddings", 4096)
        inv, a = _longrope(d, theta, cfg["long_factor"], max_pos, orig)
        return [EngineRope(engine="mlx-lm", inv_freq=inv, attention_factor=a, rotary_dim=d, source=SOURCE, **kw)]
    scale = 1 / float(cfg["factor"]) if cfg else 1.0
    return [EngineRope(engine="mlx-lm", inv_freq=_base(d, theta) * scale, rotary_dim=d,
                       layout="interleaved" if traditional else "half", source=SOURCE, **kw)]
