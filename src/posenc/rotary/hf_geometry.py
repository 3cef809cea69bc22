"""The rotation a family's config.json sets, read by its :class:`~posenc.rotary.hf_readings.HFReading`:
the heads (d_model, number, head size, per layer type where the family gives one), the rotated
width, the base and the layout. Every value is checked and named by the HF key it was read
under; a setting given both at the top level and in the rope dict must agree
(:func:`~posenc.rotary.hf_readings.pick`).
"""

from __future__ import annotations

from typing import Mapping

from ..config import check_even, check_int, check_positive, check_range
from .hf_readings import HFReading, pick
from .scaling.schema import Scaling

__all__ = ["read_base", "read_dims", "read_layout", "read_rotary_dim"]


def _layer_head_dim(config: dict, reading: HFReading, layer_type: str, head_dim: int) -> int:
    """The head size of ``layer_type``'s layers where the family gives it its own (Gemma 4)."""
    key, default = reading.layer_head_dim[layer_type]
    per_layer = config.get("per_layer_config")
    if per_layer is None:  # transformers builds it from the top-level key (absent: its default)
        value = config.get(key, default)
        check_even(key, value)
        return value
    if not isinstance(per_layer, Mapping):
        raise TypeError(f"per_layer_config must be a dict (layer index -> overrides), got {type(per_layer).__name__}")
    sizes = set()
    for i, t in enumerate(config.get("layer_types") or ()):
        if t == layer_type:
            override = per_layer.get(str(i), per_layer.get(i)) or {}  # JSON keys are strings
            sizes.add(override.get("head_dim", head_dim))
    if len(sizes) != 1:
        raise ValueError(f"per_layer_config gives the {layer_type!r} layers head sizes {sorted(sizes)}: one RoPE per "
                         "layer type needs one head size")
    value = sizes.pop()
    check_even(f"per_layer_config head_dim of the {layer_type!r} layers", value)
    return value


def read_dims(config: dict, reading: HFReading, model_type: str | None,
              layer_type: str | None = None) -> tuple[int, int, int]:
    """(d_model, num_heads, head_dim) of the heads the module rotates."""
    # GPT-J spells hidden_size and num_attention_heads n_embd and n_head (its attribute_map):
    # those names are read, and named in errors, only where the config uses them.
    gptj = model_type == "gptj"
    hidden_key = "n_embd" if "hidden_size" not in config and ("n_embd" in config or gptj) else "hidden_size"
    heads_key = "n_head" if "num_attention_heads" not in config and ("n_head" in config or gptj) else "num_attention_heads"
    hidden, heads = config.get(hidden_key), config.get(heads_key)
    for key, value in ((hidden_key, hidden), (heads_key, heads)):
        if value is not None:
            check_int(key, value, minimum=1)
    if reading.width_key == "qk_rope_head_dim":  # DeepSeek MLA: RoPE acts on q_pe/k_pe only
        head_dim = config.get("qk_rope_head_dim")
        check_even("qk_rope_head_dim", head_dim)
        if config.get("head_dim") is not None and config["head_dim"] != head_dim:
            raise ValueError(
                f"head_dim={config['head_dim']!r} and qk_rope_head_dim={head_dim!r} disagree "
                "(transformers sets head_dim = qk_rope_head_dim for deepseek_v3)"
            )
    elif config.get("head_dim") is not None:
        head_dim = config["head_dim"]
        check_int("head_dim", head_dim, minimum=1)
    elif hidden is None or heads is None:
        raise ValueError(f"config needs 'head_dim', or {hidden_key!r} and {heads_key!r} to derive it")
    elif hidden % heads:
        raise ValueError(f"{hidden_key} ({hidden}) must be divisible by {heads_key} ({heads}) to give the head size; "
                         "or give head_dim")
    else:
        head_dim = hidden // heads  # transformers: hidden_size // num_attention_heads
    if layer_type in reading.layer_head_dim:
        head_dim = _layer_head_dim(config, reading, layer_type, head_dim)
    heads = heads or 1  # the head count does not change RoPE
    return hidden or heads * head_dim, heads, head_dim


def _claims_width(entry: Scaling) -> bool:
    """Whether the scaling reads ``partial_rotary_factor`` as its own parameter (transformers'
    ``proportional``: the fraction of the pairs that rotate, over a whole-head rotation)."""
    return any(entry.hf.key(p) == "partial_rotary_factor" for p in entry.params)


def read_rotary_dim(config: dict, params: dict, where: str, reading: HFReading, head_dim: int, model_type,
                    entry: Scaling) -> int:
    """The number of rotated channels r (even, <= head_dim) of the family's width key."""
    key = reading.width_key
    if _claims_width(entry):
        # transformers' proportional returns head_dim / 2 frequencies whatever the fraction
        if key not in (None, "partial_rotary_factor") or reading.width_default != 1.0:
            raise ValueError(
                f"rope type {entry.hf.rope_type!r} rotates the whole head (its partial_rotary_factor is the "
                f"fraction of pairs that rotate), but model_type {model_type!r} sets a rotated width "
                f"({key}, default {reading.width_default:g}); use it with a whole-head family (e.g. llama)"
            )
        return head_dim
    if key in ("rotary_dim", "qk_rope_head_dim"):
        if key == "rotary_dim":
            value = config.get("rotary_dim")
            check_even("rotary_dim", value)
            if value > head_dim:
                raise ValueError(f"rotary_dim must be <= head_dim = {head_dim}, got {value}")
        else:
            value = head_dim
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"{where}['partial_rotary_factor'] must be 1 for model_type {model_type!r} "
                             f"({key} sets the rotated width); got {params['partial_rotary_factor']!r}")
        return value
    top = key or "partial_rotary_factor"
    frac, name = pick(config, top, params, "partial_rotary_factor", where, reading.width_default)
    check_range(name, frac, 0.0, 1.0, low_inclusive=False)
    if key is None and frac != 1.0:
        raise ValueError(
            f"{name} must be 1 for model_type {model_type!r}: transformers rotates the whole head for it; "
            f"got {frac!r}"
        )
    rotary_dim = int(head_dim * frac)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"{name}={frac!r} gives int(head_dim {head_dim} * {frac!r}) = {rotary_dim} rotated channels; "
            "it must give an even number >= 2"
        )
    return rotary_dim


def read_base(config: dict, params: dict, where: str, reading: HFReading) -> float:
    """The rotary base (theta) of the family's base key, or the rope dict's ``rope_theta``."""
    if reading.base_key is None:
        return 10000.0  # GPT-J: create_sinusoidal_positions hard-codes 10000
    base, name = pick(config, reading.base_key, params, "rope_theta", where, 10000.0)
    check_positive(name, base)
    if base == 1:
        raise ValueError(f"{name} must be > 0 and != 1, got {base!r}")
    return float(base)


def read_layout(config: dict, reading: HFReading) -> str:
    """``"half"`` or ``"interleaved"``, fixed per family or read from ``rope_interleave``."""
    if reading.layout != "rope_interleave":
        return reading.layout
    value = config.get("rope_interleave", True)  # DeepseekV3Config's default
    if not isinstance(value, bool):
        raise TypeError(f"rope_interleave must be true or false, got {type(value).__name__} {value!r}")
    return "interleaved" if value else "half"
