"""Interop with Hugging Face configs: a posenc RoPE module from a ``config.json`` dict.

The semantics mirror transformers 5.x (``modeling_rope_utils``): the rope parameters come from
``rope_scaling`` (legacy) or ``rope_parameters``, the type from ``rope_type`` or the legacy
``type``; ``rope_theta`` and ``partial_rotary_factor`` may sit in that dict or at the top
level; for llama3/yarn/longrope a top-level ``original_max_position_embeddings`` (Phi-3)
wins over the dict's, and ``max_position_embeddings`` is the fallback; for yarn/longrope a
missing ``factor`` is ``max_position_embeddings / original_max_position_embeddings``; the
dynamic type scales from ``max_position_embeddings``. Unlike transformers, an unknown rope
type or an unknown key in the rope dict is an error, and bad values fail loudly.

Partial rotary follows the config (r = int(head_dim * partial_rotary_factor)) for every type.
(transformers' Llama ignores ``partial_rotary_factor`` for the default type; GPT-NeoX, Phi
and most partial-rotary models honour it.)
"""

from __future__ import annotations

from typing import Any

from ..encoding import Dims
from .rope import RotaryConfig, RotaryEmbedding

__all__ = ["from_hf", "HF_ROPE_KEYS"]

_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
#: the keys each supported rope type may have in ``rope_scaling`` / ``rope_parameters``.
HF_ROPE_KEYS: dict[str, set[str]] = {
    "default": _COMMON,
    "linear": _COMMON | {"factor"},
    "dynamic": _COMMON | {"factor"},
    "yarn": _COMMON
    | {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
       "mscale_all_dim", "truncate"},
    "longrope": _COMMON | {"short_factor", "long_factor", "original_max_position_embeddings", "factor", "attention_factor"},
    "llama3": _COMMON | {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}
_REQUIRED = {
    "linear": {"factor"},
    "dynamic": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor"},
    "longrope": {"short_factor", "long_factor"},
}


def _need(config: dict, key: str, why: str) -> Any:
    if config.get(key) is None:
        raise ValueError(f"config needs {key!r} ({why})")
    return config[key]


def from_hf(config: dict[str, Any]) -> RotaryEmbedding:
    """A :class:`RotaryEmbedding` whose ``inv_freq`` and ``attention_factor`` equal what
    transformers computes for the same model config (given as a plain dict).

    >>> rope = from_hf({"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 500000.0,
    ...                 "max_position_embeddings": 131072,
    ...                 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    ...                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
    """
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (a parsed config.json), got {type(config).__name__}")
    params = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise TypeError(f"rope_scaling/rope_parameters must be a dict, got {type(params).__name__}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if "rope_type" in params and "type" in params and params["type"] != params["rope_type"]:
        raise ValueError(f"rope_type {params['rope_type']!r} and legacy type {params['type']!r} disagree")
    if rope_type not in HF_ROPE_KEYS:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {', '.join(HF_ROPE_KEYS)}")
    unknown = sorted(set(params) - HF_ROPE_KEYS[rope_type])
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))} for rope type {rope_type!r}; "
            f"allowed: {', '.join(sorted(HF_ROPE_KEYS[rope_type]))}"
        )
    missing = sorted(k for k in _REQUIRED.get(rope_type, ()) if params.get(k) is None)
    if missing:
        raise ValueError(f"rope type {rope_type!r} needs {', '.join(map(repr, missing))}")

    base = params.get("rope_theta", config.get("rope_theta", 10000.0))
    prf = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (
        _need(config, "hidden_size", "to derive head_dim") // _need(config, "num_attention_heads", "to derive head_dim")
    )
    heads = heads or 1
    d_model = config.get("hidden_size") or heads * head_dim
    if not isinstance(prf, (int, float)) or not 0 < prf <= 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {prf!r}")
    rotary_dim = int(head_dim * prf)

    scaling: dict[str, Any] = {}
    if rope_type in ("linear", "dynamic", "llama3"):
        scaling["factor"] = float(params["factor"])
    if rope_type == "llama3":
        scaling["low_freq_factor"] = float(params["low_freq_factor"])
        scaling["high_freq_factor"] = float(params["high_freq_factor"])
    if rope_type == "dynamic":
        scaling["original_max_position_embeddings"] = _need(
            config, "max_position_embeddings", "dynamic NTK scales from the trained length"
        )
    if rope_type in ("llama3", "yarn", "longrope"):
        original = config.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
        if original is None:
            original = _need(config, "max_position_embeddings", f"{rope_type} needs the trained length")
        scaling["original_max_position_embeddings"] = original
        if rope_type in ("yarn", "longrope"):
            factor = params.get("factor")
            if factor is None:
                factor = _need(config, "max_position_embeddings", "to infer factor") / original
            scaling["factor"] = float(factor)
    for key in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"):
        if key in HF_ROPE_KEYS[rope_type] and params.get(key) is not None:
            scaling[key] = params[key]
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
        if key in scaling:
            scaling[key] = float(scaling[key])
    if rope_type == "longrope":
        scaling["short_factor"] = tuple(params["short_factor"])
        scaling["long_factor"] = tuple(params["long_factor"])

    cfg = RotaryConfig(base=float(base), rotary_dim=rotary_dim, layout="half", scaling=rope_type, **scaling)
    return RotaryEmbedding(cfg, Dims(d_model=d_model, num_heads=heads, head_dim=head_dim))
