"""Interop with Hugging Face configs: a posenc RoPE module from a raw ``config.json``.

:func:`from_hf` reads the dict (or a transformers ``PretrainedConfig``) *by its*
``model_type``, as transformers 5.23 does for that family, and builds the
:class:`~posenc.rotary.RotaryEmbedding` whose ``inv_freq``, ``attention_factor``, rotary
width and layout equal the model's. Each family names its rotary settings differently:

==================  ===========================================  ==================  ===========
model_type          rotated channels r                           base                layout
==================  ===========================================  ==================  ===========
(none: generic)     head_dim * ``partial_rotary_factor`` (1.0)   ``rope_theta``      half
llama, mistral,     head_dim (``partial_rotary_factor`` must     ``rope_theta``      half
qwen2, qwen3,       be absent or 1: transformers rotates the
gemma, gemma2       whole head for these)
gemma3_text         head_dim, per layer type (below)             ``rope_theta`` /    half
                                                                 ``rope_local_base_freq``
phi                 head_dim * ``partial_rotary_factor`` (0.5)   ``rope_theta``      half
stablelm            head_dim * ``partial_rotary_factor`` (0.25)  ``rope_theta``      half
phi3                head_dim * ``partial_rotary_factor`` (1.0)   ``rope_theta``      half
gpt_neox            head_dim * ``rotary_pct`` (0.25)             ``rotary_emb_base`` half
gptj                ``rotary_dim`` (no scalings)                 10000 (fixed)       interleaved
deepseek_v3         ``qk_rope_head_dim`` (the q_pe/k_pe part)    ``rope_theta``      ``rope_interleave``
==================  ===========================================  ==================  ===========

(defaults in parentheses: transformers' values when the key is absent.) In every family
``rope_theta`` and the rotary fraction may also sit inside the rope dict (transformers 5
writes them there); given in both places with different values they are an error.

The rope dict is ``rope_scaling`` (legacy) or ``rope_parameters`` (transformers 5), its type
``rope_type`` or the legacy ``type``. For llama3/yarn/longrope a top-level
``original_max_position_embeddings`` (Phi-3) is the trained length, else the dict's, else
``max_position_embeddings``; for yarn/longrope a missing ``factor`` is
``max_position_embeddings / original_max_position_embeddings``; ``dynamic`` scales from
``max_position_embeddings``. Phi-3's legacy types ``su`` and ``yarn`` mean longrope (as in
transformers' ``Phi3Config``). ``rope_parameters`` keyed by layer type (Gemma 3:
``{"full_attention": {...}, "sliding_attention": {...}}``) needs ``layer_type=``.

Stricter than transformers, which warns or ignores: an unknown ``model_type`` or rope type,
an unknown key in the rope dict, and any top-level key about rope (its name mentions
rope/rotary, or another family reads it) that this family's reading does not use are errors
listing what it understands (unless null, false or {}: "off", as in ``"use_mrope": false``); a bad value (None, a string factor, a scalar ``short_factor``,
a negative theta, a ``truncate`` that is not a bool) is an error naming the HF key. Nothing
is ignored.

Notes: DeepSeek-V3's module rotates the ``qk_rope_head_dim`` channels (``q_pe``, ``k_pe``);
its softmax-scale correction ``mscale(factor, mscale_all_dim)^2`` is part of the attention,
not of RoPE. DeepSeek's interleaved rotation in transformers returns the pairs de-interleaved
(even channels, then odd ones); posenc keeps them interleaved: the same scores.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..config import check_even, check_int, check_positive, check_range
from ..encoding import Dims
from .rope import RotaryConfig, RotaryEmbedding

__all__ = ["from_hf", "HF_ROPE_KEYS", "HF_READINGS", "HFReading"]

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
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor"),
}
_USES_ORIGINAL = ("llama3", "yarn", "longrope")  # types that read the trained length L


@dataclass(frozen=True)
class HFReading:
    """How one ``model_type``'s config.json describes its RoPE (transformers 5.23 semantics).

    Attributes:
        width_key: the top-level key that sets the rotated width: ``"partial_rotary_factor"``
            or ``"rotary_pct"`` (a fraction of head_dim), ``"rotary_dim"`` (channels),
            ``"qk_rope_head_dim"`` (the whole rope head); None: the whole head.
        width_default: the fraction when the key is absent (fraction keys only).
        base_key: the top-level key of the base; None: fixed at 10000 (GPT-J).
        layout: ``"half"``, ``"interleaved"``, or ``"rope_interleave"`` (read that bool key,
            default true: interleaved).
        rope_types: the rope types the family supports; ("default",): no rope dict at all.
        aliases: legacy rope type names -> rope type.
        keys: other top-level rope keys the family reads.
    """

    width_key: str | None = None
    width_default: float = 1.0
    base_key: str | None = "rope_theta"
    layout: str = "half"
    rope_types: tuple[str, ...] = tuple(HF_ROPE_KEYS)
    aliases: Mapping[str, str] = field(default_factory=dict)
    keys: frozenset[str] = frozenset()

    def understood(self) -> set[str]:
        """The top-level rope keys this reading uses."""
        out = {"partial_rotary_factor"} if self.width_key is None else {self.width_key}
        out |= {self.base_key} if self.base_key else set()
        out |= {"rope_interleave"} if self.layout == "rope_interleave" else set()
        if self.rope_types != ("default",):
            out |= {"rope_scaling", "rope_parameters"}
        return out | set(self.keys)


_FULL = HFReading()  # Llama-like: the whole head, rope_theta, half layout, every scaling
#: model_type -> its reading; None is the generic Llama-like reading of a dict without model_type.
HF_READINGS: dict[str | None, HFReading] = {
    None: HFReading(width_key="partial_rotary_factor"),
    "llama": _FULL,
    "mistral": _FULL,
    "qwen2": _FULL,
    "qwen3": _FULL,
    "gemma": _FULL,
    "gemma2": _FULL,
    "gemma3_text": HFReading(keys=frozenset({"rope_local_base_freq"})),
    "phi": HFReading(width_key="partial_rotary_factor", width_default=0.5),
    "stablelm": HFReading(width_key="partial_rotary_factor", width_default=0.25),
    "phi3": HFReading(width_key="partial_rotary_factor", rope_types=("default", "longrope"),
                      aliases={"su": "longrope", "yarn": "longrope"},
                      keys=frozenset({"original_max_position_embeddings"})),
    "gpt_neox": HFReading(width_key="rotary_pct", width_default=0.25, base_key="rotary_emb_base"),
    "gptj": HFReading(width_key="rotary_dim", base_key=None, layout="interleaved", rope_types=("default",)),
    "deepseek_v3": HFReading(width_key="qk_rope_head_dim", layout="rope_interleave"),
}
# Top-level keys some family reads for its RoPE: in a family that does not read them they
# are an error, like any key whose name mentions rope or rotary.
_ROPE_KEYS = {"original_max_position_embeddings"} | set().union(*(r.understood() for r in HF_READINGS.values()))
_GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}  # Gemma3TextConfig.default_theta
_ABSENT = object()


def _is_rope_key(key: str) -> bool:
    low = key.lower()
    return "rope" in low or "rotary" in low or key in _ROPE_KEYS


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))  # never edit the caller's dict
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict) and type(config).__module__.startswith("transformers"):
        return copy.deepcopy(to_dict())
    raise TypeError(
        f"config must be a dict (a parsed config.json) or a transformers PretrainedConfig, got {type(config).__name__}"
    )


def _pick(config: dict, top: str, params: dict, inner: str, where: str, default: Any = _ABSENT) -> tuple[Any, str]:
    """(value, the name it was given under) of a setting given at the top level (``top``)
    and/or in the rope dict (``inner``); both given and different is an error."""
    a, b = config.get(top, _ABSENT), params.get(inner, _ABSENT)
    if a is None and b is not _ABSENT:  # an explicit null beside a value: the value
        a = _ABSENT
    if a is not _ABSENT and b is not _ABSENT and a != b:
        raise ValueError(f"{top}={a!r} and {where}[{inner!r}]={b!r} disagree; give one")
    if b is not _ABSENT:
        return b, f"{where}[{inner!r}]"
    if a is not _ABSENT:
        return a, top
    if default is _ABSENT:
        raise ValueError(f"config needs {top!r} (or {where}[{inner!r}])")
    return default, top


def _rope_dict(config: dict, model_type: str | None, layer_type: str | None) -> tuple[dict, str]:
    """The flat rope dict for this layer type and the name it is reported under."""
    scaling, parameters = config.get("rope_scaling"), config.get("rope_parameters")
    if scaling and parameters and scaling != parameters:
        raise ValueError("rope_scaling and rope_parameters are both given and differ; give one")
    where = "rope_scaling" if scaling else "rope_parameters"
    params = scaling or parameters or {}
    if not isinstance(params, dict):
        raise TypeError(f"{where} must be a dict, got {type(params).__name__} {params!r}")
    if model_type == "gemma3_text":
        params, where = _gemma3_nested(config, params, where)
    if any(isinstance(v, dict) for v in params.values()):  # keyed by layer type (None: a layer without RoPE)
        nested = sorted(params)
        plain = [k for k, v in params.items() if not isinstance(v, dict) and v is not None]
        if plain:
            raise ValueError(f"{where} mixes per-layer-type dicts with plain keys ({', '.join(map(repr, plain))})")
        if layer_type is None:
            raise ValueError(
                f"{where} has rope parameters per layer type: pass layer_type= one of {', '.join(map(repr, nested))}"
            )
        if layer_type not in params:
            raise ValueError(f"layer_type must be one of {', '.join(map(repr, nested))}; got {layer_type!r}")
        if params[layer_type] is None:
            raise ValueError(f"layer type {layer_type!r} has no rotary embedding ({where}[{layer_type!r}] is None)")
        return params[layer_type], f"{where}[{layer_type!r}]"
    if layer_type is not None:
        declared = sorted(set(config.get("layer_types") or []))  # all share the one rope dict
        if not declared:
            raise ValueError(f"layer_type must be None: the config has one rope dict and no layer_types; "
                             f"got {layer_type!r}")
        if layer_type not in declared:
            raise ValueError(f"layer_type must be one of the config's layer_types {declared}; got {layer_type!r}")
    return params, where


def _gemma3_nested(config: dict, params: dict, where: str) -> tuple[dict, str]:
    """Gemma 3's rope dict per layer type. On the Hub: ``rope_theta`` and ``rope_scaling`` for the
    global layers, ``rope_local_base_freq`` for the sliding ones
    (``Gemma3TextConfig.convert_rope_params_to_dict``); transformers 5 writes the nested form."""
    if any(isinstance(v, dict) for v in params.values()):  # already nested
        for key, layer in (("rope_theta", "full_attention"), ("rope_local_base_freq", "sliding_attention")):
            if key in config and isinstance(params.get(layer), dict):
                _pick(config, key, params[layer], "rope_theta", f"{where}[{layer!r}]")  # must agree
                config.pop(key)
        return params, where
    full = dict(params)
    theta, _ = _pick(config, "rope_theta", full, "rope_theta", where, _GEMMA3_THETA["full_attention"])
    full["rope_theta"] = theta
    local = config.pop("rope_local_base_freq", _GEMMA3_THETA["sliding_attention"])
    config.pop("rope_theta", None)  # consumed: now inside the per-layer-type dicts
    return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": local}}, where


def _check_top_level_keys(config: dict, reading: HFReading, model_type: str | None, rope_type: str) -> None:
    understood = reading.understood()
    if rope_type in _USES_ORIGINAL:
        understood = understood | {"original_max_position_embeddings"}
    # null, false and {} are "off", not a setting: Hub configs write "rope_scaling": null, and
    # Qwen2-based ones "use_mrope": false. (Identity checks: 0 == False would hide a 0.)
    unused = sorted(
        k for k in config
        if _is_rope_key(k) and k not in understood and not (config[k] is None or config[k] is False or config[k] == {})
    )
    if unused:
        family = f"model_type {model_type!r}" if model_type else "a config without model_type (generic reading)"
        raise ValueError(
            f"config key(s) {', '.join(map(repr, unused))} not read for {family} with rope type {rope_type!r}; "
            f"it reads: {', '.join(sorted(understood))}. Remove the key(s) or set the model_type that uses them"
        )


def _rope_type(params: dict, where: str, reading: HFReading, model_type: str | None) -> str:
    names = {k: params[k] for k in ("rope_type", "type") if k in params}
    for k, v in names.items():
        if not isinstance(v, str):
            raise TypeError(f"{where}[{k!r}] must be a str, got {type(v).__name__} {v!r}")
    types = {reading.aliases.get(v, v) for v in names.values()}
    if len(types) > 1:
        raise ValueError(
            f"{where}['rope_type']={names['rope_type']!r} and legacy {where}['type']={names['type']!r} disagree"
        )
    rope_type = types.pop() if types else "default"
    if rope_type not in reading.rope_types:
        family = f"model_type {model_type!r}" if model_type else "generic"
        raise ValueError(
            f"{where}['rope_type'] must be one of {', '.join(map(repr, reading.rope_types))} for {family}; "
            f"got {rope_type!r}"
        )
    unknown = sorted(set(params) - HF_ROPE_KEYS[rope_type])
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))} in {where} for rope type {rope_type!r}; "
            f"allowed: {', '.join(sorted(HF_ROPE_KEYS[rope_type]))}"
        )
    missing = [k for k in _REQUIRED.get(rope_type, ()) if k not in params]
    if missing:
        raise ValueError(f"rope type {rope_type!r} needs {', '.join(f'{where}[{k!r}]' for k in missing)}")
    return rope_type


def _dims(config: dict, reading: HFReading) -> tuple[int, int, int]:
    """(d_model, num_heads, head_dim) of the heads the module rotates."""
    # GPT-J spells hidden_size and num_attention_heads n_embd and n_head (its attribute_map).
    hidden_key = "hidden_size" if "hidden_size" in config else "n_embd"
    heads_key = "num_attention_heads" if "num_attention_heads" in config else "n_head"
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
    else:
        head_dim = hidden // heads  # transformers: hidden_size // num_attention_heads
    heads = heads or 1  # the head count does not change RoPE
    return hidden or heads * head_dim, heads, head_dim


def _rotary_dim(config: dict, params: dict, where: str, reading: HFReading, head_dim: int, model_type) -> int:
    key = reading.width_key
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
    frac, name = _pick(config, top, params, "partial_rotary_factor", where, reading.width_default)
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


def _base(config: dict, params: dict, where: str, reading: HFReading) -> float:
    if reading.base_key is None:
        return 10000.0  # GPT-J: create_sinusoidal_positions hard-codes 10000
    base, name = _pick(config, reading.base_key, params, "rope_theta", where, 10000.0)
    check_positive(name, base)
    if base == 1:
        raise ValueError(f"{name} must be > 0 and != 1, got {base!r}")
    return float(base)


def _layout(config: dict, reading: HFReading) -> str:
    if reading.layout != "rope_interleave":
        return reading.layout
    value = config.get("rope_interleave", True)  # DeepseekV3Config's default
    if not isinstance(value, bool):
        raise TypeError(f"rope_interleave must be true or false, got {type(value).__name__} {value!r}")
    return "interleaved" if value else "half"


def _scaling(config: dict, params: dict, where: str, rope_type: str, rotary_dim: int) -> dict[str, Any]:
    """The RotaryConfig scaling parameters, each checked under its HF name."""
    out: dict[str, Any] = {}

    def number(key: str, *, low: float = 0.0, inclusive: bool = False, optional: bool = False) -> None:
        if key not in params or (optional and params[key] is None):
            return
        value = params[key]
        check_range(f"{where}[{key!r}]", value, low, None, low_inclusive=inclusive)
        out[key] = float(value)

    def trained_length() -> int:
        # Phi-3 keeps the trained length at the top level; transformers prefers it there.
        value, name = _pick(config, "original_max_position_embeddings", params, "original_max_position_embeddings",
                            where, None)
        if value is None:
            value, name = config.get("max_position_embeddings"), "max_position_embeddings"
            if value is None:
                raise ValueError(f"rope type {rope_type!r} needs original_max_position_embeddings "
                                 f"(or max_position_embeddings): the trained length")
        check_int(name, value, minimum=1)
        return value

    if rope_type in ("linear", "dynamic", "llama3"):
        number("factor", low=1.0, inclusive=True)
    if rope_type == "llama3":
        number("low_freq_factor")
        number("high_freq_factor")
        if out["high_freq_factor"] <= out["low_freq_factor"]:
            raise ValueError(f"{where}['high_freq_factor'] must be > low_freq_factor ({out['low_freq_factor']}), "
                             f"got {out['high_freq_factor']}")
    if rope_type == "dynamic":
        check_int("max_position_embeddings", config.get("max_position_embeddings"), minimum=1)
        out["original_max_position_embeddings"] = config["max_position_embeddings"]  # transformers' L for dynamic
    if rope_type in _USES_ORIGINAL:
        out["original_max_position_embeddings"] = L = trained_length()
    if rope_type in ("yarn", "longrope"):
        if params.get("factor") is None:  # implied: the extended length over the trained one
            check_int("max_position_embeddings", config.get("max_position_embeddings"), minimum=1)
            implied = config["max_position_embeddings"] / L
            if implied < 1:
                raise ValueError(
                    f"{where}['factor'] is absent, so it is max_position_embeddings / original_max_position_embeddings "
                    f"= {config['max_position_embeddings']} / {L} = {implied:g}, which must be >= 1"
                )
            out["factor"] = implied
        else:
            number("factor", low=1.0, inclusive=True)
        number("attention_factor", optional=True)
    if rope_type == "yarn":
        for key in ("beta_fast", "beta_slow"):
            number(key, optional=True)  # transformers: None -> the default (32, 1)
        for key in ("mscale", "mscale_all_dim"):
            number(key, inclusive=True, optional=True)
        if "truncate" in params:
            # transformers reads a None truncate as false but an absent one as true: refuse None.
            if not isinstance(params["truncate"], bool):
                raise TypeError(f"{where}['truncate'] must be true or false, got {params['truncate']!r}")
            out["truncate"] = params["truncate"]
    if rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            value, name = params[key], f"{where}[{key!r}]"
            if not isinstance(value, (list, tuple)):
                raise TypeError(f"{name} must be a list of rotary_dim/2 = {rotary_dim // 2} numbers, "
                                f"got {type(value).__name__} {value!r}")
            if len(value) != rotary_dim // 2:
                raise ValueError(f"{name} must have rotary_dim/2 = {rotary_dim // 2} entries "
                                 f"(one per rotated pair), got {len(value)}")
            for i, v in enumerate(value):
                check_positive(f"{name}[{i}]", v)
            out[key] = tuple(float(v) for v in value)
    return out


def from_hf(config: Any, *, layer_type: str | None = None) -> RotaryEmbedding:
    """A :class:`RotaryEmbedding` equal to the RoPE of a Hugging Face model config.

    ``config``: a parsed ``config.json`` dict or a transformers ``PretrainedConfig`` (read via
    ``to_dict()``); it is read by its ``model_type`` (see the module docstring for the
    families) and never edited. ``layer_type``: for per-layer-type ``rope_parameters`` (Gemma 3),
    which layer type's RoPE to build.

    ``inv_freq`` and ``attention_factor`` equal transformers' for the same config; the module
    rotates the first ``rotary_dim`` channels of each head, in the family's layout.

    >>> rope = from_hf(json.load(open("config.json")))
    >>> rope = from_hf({"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8,
    ...                 "rotary_pct": 0.25, "rotary_emb_base": 10000})   # rotary_dim 16
    """
    config = _as_dict(config)
    if layer_type is not None and not isinstance(layer_type, str):
        raise TypeError(f"layer_type must be a str or None, got {type(layer_type).__name__} {layer_type!r}")
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise TypeError(f"model_type must be a str, got {type(model_type).__name__} {model_type!r}")
    if model_type not in HF_READINGS:
        known = ", ".join(repr(k) for k in HF_READINGS if k is not None)
        hint = " (a multimodal config: pass its config['text_config'])" if "text_config" in config else ""
        raise ValueError(f"model_type must be one of {known} or absent (generic); got {model_type!r}{hint}")
    reading = HF_READINGS[model_type]
    if reading.rope_types == ("default",):  # GPT-J: no rope dict (one given is refused as unread)
        if layer_type is not None:
            raise ValueError(f"layer_type must be None for model_type {model_type!r} (one RoPE for every layer); "
                             f"got {layer_type!r}")
        params, where = {}, "rope_parameters"
    else:
        params, where = _rope_dict(config, model_type, layer_type)
    rope_type = _rope_type(params, where, reading, model_type)
    _check_top_level_keys(config, reading, model_type, rope_type)

    d_model, heads, head_dim = _dims(config, reading)
    rotary_dim = _rotary_dim(config, params, where, reading, head_dim, model_type)
    cfg = RotaryConfig(
        base=_base(config, params, where, reading),
        rotary_dim=rotary_dim,
        layout=_layout(config, reading),
        scaling=rope_type,
        **_scaling(config, params, where, rope_type, rotary_dim),
    )
    return RotaryEmbedding(cfg, Dims(d_model=d_model, num_heads=heads, head_dim=head_dim))

