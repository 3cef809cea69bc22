"""What vLLM and SGLang share when they read a config.json as RoPE: the config as transformers
5 hands it to them, the geometry of each family's rotating layers, and the frequency formulas
their rotary classes compute, re-derived in float64 (the engines build them in float32).

Both engines load config.json through transformers (vLLM 0.33.0 pins transformers >= 5.16.1,
< 5.21; SGLang 0.5.23 pins 5.19.0), whose ``standardize_rope_params`` and ``validate_rope``
(``modeling_rope_utils.py``) run first: ``rope_scaling`` becomes ``rope_parameters``, a legacy
``type`` becomes ``rope_type``, ``rope_theta`` and ``partial_rotary_factor`` move into the dict,
and for llama3/yarn/longrope ``original_max_position_embeddings`` is the top-level one if the
config has it (Phi-3), else the dict's, else ``max_position_embeddings``. A missing required
key (a yarn ``factor``) is a ``KeyError`` there, so neither engine starts.

Notation: d = rotary_dim, i = 0 .. d/2 - 1 the rotated pairs, theta = ``rope_theta``,
L = the length a table or a ramp is built from.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch
from torch import Tensor

from ..rotary.hf_config import layer_ropes
from .base import EngineRope, Unsupported
from .transformers import ropes_of

__all__ = ["FAMILIES", "Family", "Group", "dynamic_base", "linear", "llama3", "longrope", "plain", "read_groups",
           "through_transformers", "yarn", "yarn_mscale"]

ORIGINAL = "original_max_position_embeddings"
#: keys transformers' validate_rope requires per type (KeyError otherwise), as of 5.19-5.24
_REQUIRED = {"linear": ("factor",), "yarn": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
             "longrope": ("short_factor", "long_factor")}


# --- the formulas (vLLM 0.33.0 rotary_embedding/{base,common,llama3_rope,...}.py;
#     SGLang 0.5.23 srt/layers/rotary_embedding/{base,yarn,rope_variant}.py) -------------------

def plain(base: float, d: int) -> Tensor:
    """theta_i = base^(-2i/d): ``RotaryEmbeddingBase._compute_inv_freq``."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def linear(base: float, d: int, factor: float) -> Tensor:
    """Positions divided by ``factor`` (``LinearScalingRotaryEmbedding``): theta_i / factor."""
    return plain(base, d) / factor


def llama3(base: float, d: int, factor: float, low: float, high: float, original: int) -> Tensor:
    """Llama 3.1's rule (``Llama3RotaryEmbedding._compute_inv_freq``): wavelengths shorter than
    original/high kept, longer than original/low divided by ``factor``, a linear blend in
    original/wavelength between; low == high blends nothing (smooth = 0)."""
    inv = plain(base, d)
    wavelen = 2 * math.pi / inv
    smooth = (original / wavelen - low) / (high - low) if low != high else torch.zeros_like(inv)
    blended = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(wavelen < original / high, inv, torch.where(wavelen > original / low, inv / factor, blended))


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """``yarn_get_mscale``: 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1."""
    return 0.1 * mscale * math.log(scale) + 1.0 if scale > 1 else 1.0


def _correction_dim(rotations: float, d: int, base: float, original: int) -> float:
    """The pair index whose wavelength makes ``rotations`` turns over ``original`` positions."""
    return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn(base: float, d: int, factor: float, original: int, beta_fast: float = 32, beta_slow: float = 1,
         truncate: bool = True, extrapolation: float = 1.0) -> Tensor:
    """YaRN's frequencies (``yarn_find_correction_range`` + ``yarn_linear_ramp_mask``): pairs
    below ``low`` keep theta_i, pairs above ``high`` get theta_i / factor, a linear ramp between;
    ``truncate`` floors low and ceils high; both are clamped to [0, d - 1]; low == high moves high
    by 0.001. ``extrapolation`` (SGLang's ``extrapolation_factor``) scales the kept share."""
    low = _correction_dim(beta_fast, d, base, original)
    high = _correction_dim(beta_slow, d, base, original)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = (1 - ramp) * extrapolation
    inv = plain(base, d)
    return inv / factor * (1 - keep) + inv * keep


def longrope(base: float, d: int, factors: Any, where: str) -> Tensor:
    """Phi-3's LongRoPE (``Phi3LongRoPEScaledRotaryEmbedding._compute_inv_freq``): theta_i / f_i."""
    if not isinstance(factors, (list, tuple)) or not all(isinstance(f, (int, float)) for f in factors):
        raise TypeError(f"{where} must be a list of numbers, got {type(factors).__name__}")
    if len(factors) != d // 2:
        raise ValueError(f"{where} must have rotary_dim / 2 = {d // 2} entries, got {len(factors)}")
    return plain(base, d) / torch.tensor(factors, dtype=torch.float64)


def dynamic_base(base: float, d: int, stretch: float) -> float:
    """NTK's stretched base: base * stretch^(d / (d - 2))."""
    return base * stretch ** (d / (d - 2))


# --- the config as the engines receive it -------------------------------------------------------

@dataclass(frozen=True)
class Family:
    """How one model file of the engine builds its rotary module."""

    layout: str = "half"  # is_neox_style True -> "half"
    head_dim: str = "head_dim"  # "head_dim" (or hidden/heads), "hidden" (hidden/heads), or a config key
    theta: float = 10000.0  # the engine's default rope_theta
    nope: str | None = None  # which layers skip RoPE: "llama4" (no_rope_layers / every 4th)
    per_type: bool = False  # Gemma 3: one rope dict per layer type


FAMILIES: dict[str, Family] = {
    "llama": Family(), "mistral": Family(), "phi3": Family(), "qwen3": Family(theta=1_000_000.0),
    "qwen2": Family(theta=1_000_000.0),  # qwen2.py: set_default_rope_theta(config, 1e6)
    "gemma3_text": Family(per_type=True),
    "gpt_oss": Family(),
    "deepseek_v2": Family(layout="interleaved", head_dim="qk_rope_head_dim"),
    "deepseek_v3": Family(layout="interleaved", head_dim="qk_rope_head_dim"),
    # llama4.py: is_neox_style=True on q/k weights permuted at load (permute_qk_weight_for_rotary):
    # the checkpoint's pairs (2i, 2i+1) rotate, as in transformers' complex product
    "llama4_text": Family(layout="interleaved", nope="llama4"),
}


@dataclass(frozen=True)
class Group:
    """The layers sharing one rope dict, as the engine's model file sees them."""

    params: dict[str, Any]  # the normalised rope dict: rope_type, rope_theta, original_max_position_embeddings, ...
    head_dim: int
    rotary_dim: int
    layout: str
    max_position: int
    layer_type: str | None = None
    layers: tuple[int, ...] | None = None
    where: str = "rope_parameters"  # the dict's name in the file, for messages


def _int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an int >= 1, got {value!r}")
    return value


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's config (a multimodal file's ``text_config``), deep-copied."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict (a parsed config.json), got {type(config).__name__}")
    inner = config.get("text_config")
    return copy.deepcopy(dict(inner if isinstance(inner, Mapping) else config))


def rope_dict(config: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """``rope_parameters`` or legacy ``rope_scaling`` (transformers 5 moves one into the other)."""
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise TypeError(f"{key} must be a dict or null, got {type(value).__name__} {value!r}")
        return dict(value), key
    return {}, "rope_parameters"


def normalise(params: dict[str, Any], where: str, config: Mapping[str, Any], theta: float, strict_type: bool,
              engine: str) -> dict[str, Any]:
    """One rope dict as transformers' standardize_rope_params leaves it, plus vLLM's
    ``patch_legacy_rope_type`` (``strict_type``: a ``type`` that contradicts ``rope_type`` is
    refused; SGLang keeps ``rope_type``)."""
    p = dict(params)
    if "rope_type" in p and "type" in p and p["rope_type"] != p["type"] and strict_type:
        legacy_ok = (p["type"], p["rope_type"]) in {("su", "longrope"), ("mrope", "default")}
        if not legacy_ok:
            raise Unsupported(f"{engine} refuses {where}: rope_type={p['rope_type']!r} and type={p['type']!r} conflict "
                              "(transformers_utils/config.py patch_legacy_rope_type)")
    kind = p.get("rope_type", p.get("type", "default"))
    if not isinstance(kind, str):
        raise TypeError(f"{where}['rope_type'] must be a str, got {type(kind).__name__} {kind!r}")
    kind = {"su": "longrope", "mrope": "default"}.get(kind, kind)
    if config.get("model_type") == "phi3" and kind == "yarn":
        kind = "longrope"  # transformers' Phi3Config reads a legacy "yarn" as longrope
    p["rope_type"] = kind
    p.pop("type", None)
    p.setdefault("rope_theta", config.get("rope_theta", theta))
    base = p["rope_theta"]
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not 1 < base < math.inf:
        raise ValueError(f"rope_theta ({where} or the top level) must be a finite number > 1, got {base!r}")
    for key in ("partial_rotary_factor", "rotary_pct", "rotary_emb_fraction"):
        if key in config and config[key] is not None:
            p.setdefault("partial_rotary_factor", config[key])
            break
    if kind in ("llama3", "yarn", "longrope"):
        if config.get(ORIGINAL) is not None:  # transformers gives a top-level one priority (Phi-3)
            p[ORIGINAL] = config[ORIGINAL]
        elif p.get(ORIGINAL) is None:
            p[ORIGINAL] = _int(config, "max_position_embeddings")
    missing = [k for k in _REQUIRED.get(kind, ()) if k not in p]
    if kind == "dynamic" and "factor" not in p and "alpha" not in p:
        missing = ["factor"]
    if missing:
        raise Unsupported(f"{engine} does not start: transformers' validate_rope raises KeyError for {where} of "
                          f"rope_type {kind!r} without {', '.join(map(repr, missing))}")
    return p


def _layers_rotating(config: Mapping[str, Any], family: Family, n: int, engine: str) -> list[bool]:
    if family.nope != "llama4":
        return [True] * n
    if engine.lower() == "sglang":  # llama4.py: use_rope = (layer_id + 1) % 4 != 0, whatever the config says
        return [(i + 1) % 4 != 0 for i in range(n)]
    flags = config.get("no_rope_layers")  # vLLM: via transformers' Llama4TextConfig (empty: every 4th)
    if not flags:
        interval = config.get("no_rope_layer_interval", 4)
        return [(i + 1) % interval != 0 for i in range(n)]
    if not isinstance(flags, (list, tuple)) or len(flags) != n:
        raise ValueError(f"no_rope_layers must list one 0/1 flag per layer ({n}), got {flags!r}")
    return [bool(f) for f in flags]


def read_groups(config: Mapping[str, Any], engine: str, strict_type: bool,
                overrides: Mapping[str, Family] | None = None) -> tuple[str, list[Group]]:
    """``(model_type, groups)``: the distinct rope dicts of a config and the layers using each
    (``overrides``: the engine's own :class:`Family` where its model file differs)."""
    cfg = text_config(config)
    model_type = cfg.get("model_type")
    model_type = {"gemma3": "gemma3_text", "llama4": "llama4_text"}.get(model_type, model_type)
    family = {**FAMILIES, **(overrides or {})}.get(model_type)
    if family is None:
        known = ", ".join(sorted(FAMILIES) + ["smollm3"])
        raise ValueError(f"model_type must be one of {known} for posenc's {engine} rule, got {model_type!r}")
    n = _int(cfg, "num_hidden_layers")
    if family.head_dim == "head_dim":
        head = cfg.get("head_dim") or _int(cfg, "hidden_size") // _int(cfg, "num_attention_heads")
    elif family.head_dim == "hidden":
        head = _int(cfg, "hidden_size") // _int(cfg, "num_attention_heads")
    else:
        head = _int(cfg, family.head_dim)
    max_position = cfg.get("max_position_embeddings", 8192)
    params, where = rope_dict(cfg)
    nested = bool(params) and all(isinstance(v, Mapping) or v is None for v in params.values())
    if family.per_type or nested:
        types = cfg.get("layer_types")
        if not isinstance(types, (list, tuple)) or len(types) != n:
            raise ValueError(f"layer_types must list one layer type per layer ({n}) for per-layer-type rope "
                             f"parameters, got {types!r}")
        if nested:
            per_type = {t: dict(v) for t, v in params.items() if v is not None}
        else:  # Gemma 3 on the Hub: the flat dict is the full layers'; sliding ones take the local base
            per_type = {"full_attention": dict(params),
                        "sliding_attention": {"rope_type": "default",
                                              "rope_theta": cfg.get("rope_local_base_freq", 10000.0)}}
        names = sorted(set(types), key=types.index)
    else:
        per_type, names, types = {None: params}, [None], [None] * n
    rotating = _layers_rotating(cfg, family, n, engine)
    groups = []
    for name in names:
        if name not in per_type:
            raise ValueError(f"{where} has no entry for layer type {name!r}")
        layers = tuple(i for i in range(n) if types[i] == name and rotating[i])
        if not layers:
            continue
        label = f"{where}[{name!r}]" if name else where
        p = normalise(per_type[name], label, cfg, family.theta, strict_type, engine)
        fraction = p.get("partial_rotary_factor", 1.0)
        if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {fraction!r}")
        rotary = int(p.get("rope_dim") or int(head * fraction))
        groups.append(Group(p, head, rotary, family.layout, max_position, name if len(names) > 1 else None,
                            None if len(layers) == n else layers, label))
    return model_type, groups


def through_transformers(config: dict[str, Any], engine: str, source: str, note: str) -> list[EngineRope]:
    """The engine's Transformers backend (a family without its own model file): transformers'
    RoPE, labelled as the engine's, each entry naming the layers that rotate."""
    ropes = ropes_of(config, engine, source, notes=(note,))
    rotating = [i for i, rope in enumerate(layer_ropes(config)) if rope is not None]
    n = len(layer_ropes(config))
    return [r if r.layers is not None or len(rotating) == n else replace(r, layers=tuple(rotating)) for r in ropes]


def number(p: Mapping[str, Any], key: str, where: str, default: Any = None) -> Any:
    """``p[key]`` as a float (``default`` when absent), refused by name when not a number."""
    value = p.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}[{key!r}] must be a finite number, got {value!r}")
    return float(value)


def dual_chunk_notes(cfg: Mapping[str, Any], kind: str, model_type: str | None) -> list[str] | None:
    """The notes of a Qwen2 config with ``dual_chunk_attention_config`` (vLLM's and SGLang's
    get_rope take it first: the rope is the plain one, attention is dual-chunk); None without it."""
    dca = cfg.get("dual_chunk_attention_config")
    if dca is None or model_type != "qwen2":
        return None
    if not isinstance(dca, Mapping):
        raise TypeError(f"dual_chunk_attention_config must be a dict, got {type(dca).__name__}")
    notes = [f"rope_type {kind!r} is ignored: dual_chunk_attention_config takes precedence in get_rope"] \
        if kind != "default" else []
    return notes + [f"attention is dual-chunk (chunk_size {dca.get('chunk_size')}, local_size "
                    f"{dca.get('local_size')}): keys' positions are taken modulo chunk_size - local_size"]
