"""Interop with Hugging Face configs: a posenc RoPE module from a raw ``config.json``
(:func:`from_hf`), and back (:func:`to_hf`).

Which rope types exist and how transformers spells each (its ``rope_type``, keys, required
keys, top-level keys) is not listed here: it is each scaling's :class:`~posenc.rotary.HFSpec`
in :data:`~posenc.rotary.SCALINGS`, so a newly registered scaling is read and written too.

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
modernbert          head_dim, per layer type (below)             ``global_rope_``    half
                                                                 ``theta`` / local
phi                 head_dim * ``partial_rotary_factor`` (0.5)   ``rope_theta``      half
stablelm            head_dim * ``partial_rotary_factor`` (0.25)  ``rope_theta``      half
phi3                head_dim * ``partial_rotary_factor`` (1.0)   ``rope_theta``      half
gpt_neox            head_dim * ``rotary_pct`` (0.25)             ``rotary_emb_base`` half
gptj                ``rotary_dim`` (no scalings)                 10000 (fixed)       interleaved
deepseek_v3         ``qk_rope_head_dim`` (the q_pe/k_pe part)    ``rope_theta``      ``rope_interleave``
smollm3             head_dim; NoPE layers: ``no_rope_layers``    ``rope_theta``      half
llama4_text         head_dim; NoPE layers: ``no_rope_layers``    ``rope_theta``      interleaved
cohere2             head_dim; NoPE layers: the full-attention    ``rope_theta``      interleaved
                    ones (RoPE on the sliding-window layers)
gemma4_text         head_dim, per layer type (nested              ``rope_theta``      half
                    ``rope_parameters``); the full layers'       per layer type
                    own ``global_head_dim`` (512) or
                    ``per_layer_config``
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
``{"full_attention": {...}, "sliding_attention": {...}}``; ModernBERT) needs ``layer_type=``;
their Hub config.json gives top-level thetas instead, nested here as transformers 5 does.
:func:`layer_ropes` gives one RoPE per decoder layer (shared by the layers that use it), None
on the NoPE layers of the hybrids. ``rope_type="proportional"`` (p-RoPE) reads its rope-dict
``partial_rotary_factor`` as the fraction of pairs that rotate over the whole head, not as the
rotated width.

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
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..config import check_even, check_int, check_positive, check_range, check_value, field_types
from ..encoding import Dims
from .mrope import MROPE_MODEL_TYPES, mrope_from_hf
from .rope import RotaryConfig, RotaryEmbedding
from .scaling import SCALINGS
from .scaling.schema import Scaling

__all__ = ["from_hf", "to_hf", "layer_ropes", "HF_READINGS", "HFReading", "hf_rope_keys"]

_COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
_ORIGINAL = "original_max_position_embeddings"


def _hf_entries() -> dict[str, Scaling]:
    """transformers' rope_type -> the posenc scaling that reads it (every entry with an HFSpec)."""
    return {e.hf.rope_type: e for e in SCALINGS.values() if e.hf is not None}


def hf_rope_keys(rope_type: str) -> set[str]:
    """The keys a rope dict of transformers' ``rope_type`` may hold, from the scaling's entry:
    the common ones and the HF key of each parameter not read from the config's top level."""
    entry = _hf_entries()[rope_type]
    return set(_COMMON) | {entry.hf.key(p) for p in entry.params if p not in entry.hf.top_level}


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
        rope_types: transformers' rope types the family supports; None: every registered
            scaling with an HF spelling; ("default",): no rope dict at all.
        aliases: legacy rope type names -> rope type.
        keys: other top-level rope keys the family reads.
        per_layer: ``(layer type, top-level theta key, default theta)`` for families whose
            Hub config.json gives one theta per layer type at the top level (Gemma 3, ModernBERT);
            transformers 5 nests them as ``rope_parameters[layer_type]``.
        scaled_layers: the layer types a flat ``rope_scaling`` applies to (per_layer families).
        rope_layers: which decoder layers rotate, for NoPE/RoPE hybrids: None, every layer;
            ``"no_rope_layers"``, the layers whose flag in that list is 1 (transformers' name,
            SmolLM3 and Llama 4: 0 marks a NoPE layer; absent, every
            ``no_rope_layer_interval``-th layer is NoPE); ``"sliding_attention"``, the layers
            of that type only (Cohere2: its full-attention layers are NoPE).
        layer_head_dim: layer type -> (top-level key, default) of that type's own head size
            (Gemma 4's full layers: ``global_head_dim``, 512); a ``per_layer_config`` (layer
            index -> overrides, as transformers 5 writes it) takes precedence.
    """

    width_key: str | None = None
    width_default: float = 1.0
    base_key: str | None = "rope_theta"
    layout: str = "half"
    rope_types: tuple[str, ...] | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    keys: frozenset[str] = frozenset()
    per_layer: tuple[tuple[str, str, float], ...] = ()
    scaled_layers: tuple[str, ...] = ()
    rope_layers: str | None = None
    layer_head_dim: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    def types(self) -> tuple[str, ...]:
        """transformers' rope types this family reads."""
        return tuple(_hf_entries()) if self.rope_types is None else self.rope_types

    def understood(self) -> set[str]:
        """The top-level rope keys this reading uses."""
        out = {"partial_rotary_factor"} if self.width_key is None else {self.width_key}
        out |= {self.base_key} if self.base_key else set()
        out |= {"rope_interleave"} if self.layout == "rope_interleave" else set()
        if self.rope_types != ("default",):
            out |= {"rope_scaling", "rope_parameters"}
        return out | set(self.keys) | {key for _, key, _ in self.per_layer}


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
    # Gemma3TextConfig.default_theta; on the Hub rope_scaling applies to the global layers only.
    "gemma3_text": HFReading(per_layer=(("full_attention", "rope_theta", 1_000_000.0),
                                        ("sliding_attention", "rope_local_base_freq", 10_000.0)),
                             scaled_layers=("full_attention",)),
    # ModernBertConfig.default_theta and convert_rope_params_to_dict: rope_scaling applies to both.
    "modernbert": HFReading(per_layer=(("full_attention", "global_rope_theta", 160_000.0),
                                       ("sliding_attention", "local_rope_theta", 10_000.0)),
                            scaled_layers=("full_attention", "sliding_attention")),
    "phi": HFReading(width_key="partial_rotary_factor", width_default=0.5),
    "stablelm": HFReading(width_key="partial_rotary_factor", width_default=0.25),
    "phi3": HFReading(width_key="partial_rotary_factor", rope_types=("default", "longrope"),
                      aliases={"su": "longrope", "yarn": "longrope"},
                      keys=frozenset({"original_max_position_embeddings"})),
    "gpt_neox": HFReading(width_key="rotary_pct", width_default=0.25, base_key="rotary_emb_base"),
    "gptj": HFReading(width_key="rotary_dim", base_key=None, layout="interleaved", rope_types=("default",)),
    "deepseek_v3": HFReading(width_key="qk_rope_head_dim", layout="rope_interleave"),
    # NoPE/RoPE hybrids. SmolLM3 (Hugging Face 2025): every 4th layer NoPE. Llama 4 (Meta 2025,
    # iRoPE): every 4th layer NoPE, the others in chunked attention; its rotation multiplies
    # complex pairs (2i, 2i+1). Cohere2 (Command R7B): RoPE on the sliding-window layers only,
    # rotate_half over pairs (2i, 2i+1).
    "smollm3": HFReading(keys=frozenset({"no_rope_layers", "no_rope_layer_interval"}), rope_layers="no_rope_layers"),
    "llama4_text": HFReading(layout="interleaved", keys=frozenset({"no_rope_layers", "no_rope_layer_interval"}),
                             rope_layers="no_rope_layers"),
    "cohere2": HFReading(layout="interleaved", rope_layers="sliding_attention"),
    # Gemma 4: rope_parameters keyed by layer type (sliding: default 10000; full: proportional,
    # p = 0.25, base 1e6), and the full layers' own head size (Gemma4TextConfig.global_head_dim).
    "gemma4_text": HFReading(layer_head_dim={"full_attention": ("global_head_dim", 512)}),
}
# Top-level keys some family reads for its RoPE: in a family that does not read them they
# are an error, like any key whose name mentions rope or rotary.
_ROPE_KEYS = {_ORIGINAL} | set().union(*(r.understood() for r in HF_READINGS.values()))
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
    reading = HF_READINGS[model_type]
    if reading.per_layer:
        params, where = _nest_per_layer(config, params, where, reading)
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


def _nest_per_layer(config: dict, params: dict, where: str, reading: HFReading) -> tuple[dict, str]:
    """The rope dict per layer type of a family with one theta per layer type (Gemma 3, ModernBERT).

    On the Hub their config.json has top-level thetas (``rope_theta`` / ``rope_local_base_freq``,
    ``global_rope_theta`` / ``local_rope_theta``) and a flat ``rope_scaling``; transformers 5
    writes the nested form (``convert_rope_params_to_dict`` of each config class). Top-level
    thetas are consumed here; beside a nested dict they must agree with it."""
    if any(isinstance(v, dict) for v in params.values()):  # already nested
        for layer, key, _ in reading.per_layer:
            if key in config and isinstance(params.get(layer), dict):
                _pick(config, key, params[layer], "rope_theta", f"{where}[{layer!r}]")  # must agree
                config.pop(key)
        return params, where
    nested = {}
    for layer, key, default in reading.per_layer:
        layer_params = dict(params) if layer in reading.scaled_layers else {"rope_type": "default"}
        theta, _ = _pick(config, key, layer_params, "rope_theta", where, default)
        nested[layer] = layer_params | {"rope_theta": theta}
    for _, key, _ in reading.per_layer:
        config.pop(key, None)  # consumed: now inside the per-layer-type dicts
    return nested, where


def _check_top_level_keys(config: dict, reading: HFReading, model_type: str | None, entry: Scaling) -> None:
    understood = reading.understood() | set(entry.hf.top_level.values())
    if any(entry.hf.key(p) == _ORIGINAL for p in entry.params if p not in entry.hf.top_level):
        understood = understood | {_ORIGINAL}  # the trained length may sit at the top level (Phi-3)
    rope_type = entry.hf.rope_type
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


def _rope_type(params: dict, where: str, reading: HFReading, model_type: str | None) -> Scaling:
    """The scaling entry of the rope dict's type (checked against the family and its keys)."""
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
    supported = [t for t in reading.types() if t in _hf_entries()]
    if rope_type not in supported:
        family = f"model_type {model_type!r}" if model_type else "generic"
        raise ValueError(
            f"{where}['rope_type'] must be one of {', '.join(map(repr, supported))} for {family}; got {rope_type!r}"
        )
    entry = _hf_entries()[rope_type]
    allowed = hf_rope_keys(rope_type)
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))} in {where} for rope type {rope_type!r}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    missing = [entry.hf.key(p) for p in entry.hf.required if entry.hf.key(p) not in params]
    if missing:
        raise ValueError(f"rope type {rope_type!r} needs {', '.join(f'{where}[{k!r}]' for k in missing)}")
    return entry


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


def _dims(config: dict, reading: HFReading, model_type: str | None,
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


def _rotary_dim(config: dict, params: dict, where: str, reading: HFReading, head_dim: int, model_type,
                entry: Scaling) -> int:
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


def _scaling(config: dict, params: dict, where: str, entry: Scaling) -> tuple[dict[str, Any], dict[str, str]]:
    """(the scaling's parameters, the HF name each was read under), generically from its entry:
    a parameter is read from the rope dict under its HF key, or from the top level
    (``HFSpec.top_level``); the values are checked by the scaling's own typed config later."""
    spec = entry.hf
    out: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name in entry.params:
        key = spec.key(name)
        if name in spec.top_level:
            out[name], names[name] = config.get(key), key
        elif key == _ORIGINAL:
            # The trained length L: transformers prefers the top level (Phi-3), then the rope
            # dict, then max_position_embeddings (standardize_rope_params).
            value, names[name] = _pick(config, _ORIGINAL, params, _ORIGINAL, where, None)
            if value is None:
                value, names[name] = config.get("max_position_embeddings"), "max_position_embeddings"
            out[name] = value
        elif key == "partial_rotary_factor":  # proportional's p: transformers moves a top-level one in too
            value, where_read = _pick(config, key, params, key, where, None)
            if value is not None:
                out[name], names[name] = value, where_read
        elif key in params:
            out[name], names[name] = params[key], f"{where}[{key!r}]"
    # Types first, under the HF names: RotaryConfig reads a None parameter as "the default",
    # but transformers reads e.g. a null truncate as false, so a None must be one the type takes.
    types = field_types(entry.config)
    for name, value in out.items():
        check_value(names[name], value, types[name])
    if spec.implied_factor and out.get("factor") is None:  # the extended length over the trained one
        mpe, L = config.get("max_position_embeddings"), out.get("original_max_position_embeddings")
        check_int("max_position_embeddings", mpe, minimum=1)
        check_int(names.get("original_max_position_embeddings", _ORIGINAL), L, minimum=1)
        if mpe / L < 1:
            raise ValueError(
                f"{where}['factor'] is absent, so it is max_position_embeddings / original_max_position_embeddings "
                f"= {mpe} / {L} = {mpe / L:g}, which must be >= 1"
            )
        out["factor"] = mpe / L
    return out, names


def _renamed(e: Exception, names: Mapping[str, str]) -> Exception:
    """``e`` with a leading parameter name replaced by the HF key it was read under, so that
    ``factor must be in [1.0, inf), got 0.5`` reads ``rope_scaling['factor'] must be ...``.
    The checks themselves are the scaling config's own (one set of bounds for posenc and HF)."""
    msg = str(e)
    for name in sorted(names, key=len, reverse=True):
        if msg.startswith(name) and msg[len(name):len(name) + 1] in (" ", "["):
            return type(e)(names[name] + msg[len(name):])
    return e


def from_hf(config: Any, *, layer_type: str | None = None) -> RotaryEmbedding:
    """A :class:`RotaryEmbedding` equal to the RoPE of a Hugging Face model config.

    ``config``: a parsed ``config.json`` dict or a transformers ``PretrainedConfig`` (read via
    ``to_dict()``); it is read by its ``model_type`` (see the module docstring for the
    families) and never edited. ``layer_type``: for per-layer-type ``rope_parameters`` (Gemma 3,
    ModernBERT), the name of the layer type whose RoPE to build (a str such as
    ``"sliding_attention"``, as in the config's ``layer_types``; not a layer index).

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
    if model_type in MROPE_MODEL_TYPES:  # three position axes: an MRopeEmbedding (a RotaryEmbedding)
        if layer_type is not None:
            raise ValueError(f"layer_type must be None for model_type {model_type!r} (one RoPE for every layer); "
                             f"got {layer_type!r}")
        return mrope_from_hf(config)
    if model_type not in HF_READINGS:
        known = ", ".join(repr(k) for k in HF_READINGS if k is not None)
        hint = " (a multimodal config: pass its config['text_config'])" if "text_config" in config else ""
        raise ValueError(f"model_type must be one of {known} or absent (generic); got {model_type!r}{hint}")
    reading = HF_READINGS[model_type]
    if reading.types() == ("default",):  # GPT-J: no rope dict (one given is refused as unread)
        if layer_type is not None:
            raise ValueError(f"layer_type must be None for model_type {model_type!r} (one RoPE for every layer); "
                             f"got {layer_type!r}")
        params, where = {}, "rope_parameters"
    else:
        params, where = _rope_dict(config, model_type, layer_type)
    if reading.rope_layers and layer_type is not None:
        _refuse_nope_layer_type(config, reading, model_type, layer_type)
    entry = _rope_type(params, where, reading, model_type)
    _check_top_level_keys(config, reading, model_type, entry)

    d_model, heads, head_dim = _dims(config, reading, model_type, layer_type)
    rotary_dim = _rotary_dim(config, params, where, reading, head_dim, model_type, entry)
    base, layout = _base(config, params, where, reading), _layout(config, reading)
    scaling, names = _scaling(config, params, where, entry)
    try:
        cfg = RotaryConfig(base=base, rotary_dim=rotary_dim, layout=layout, scaling=entry.name, **scaling)
        return RotaryEmbedding(cfg, Dims(d_model=d_model, num_heads=heads, head_dim=head_dim))
    except (TypeError, ValueError) as e:
        raise _renamed(e, names) from None


def _rotating_layers(config: dict, reading: HFReading, model_type: str | None, n: int) -> list[bool]:
    """Whether each of the n decoder layers applies RoPE, as the family's attention decides."""
    if reading.rope_layers == "no_rope_layers":
        flags = config.get("no_rope_layers")
        if flags is None:  # SmolLM3Config / Llama4TextConfig: every interval-th layer is NoPE
            interval = config.get("no_rope_layer_interval", 4)
            check_int("no_rope_layer_interval", interval, minimum=1)
            return [(i + 1) % interval != 0 for i in range(n)]
        if not isinstance(flags, (list, tuple)) or len(flags) != n or any(f not in (0, 1) for f in flags):
            raise ValueError(f"no_rope_layers must list one flag per layer (1: RoPE, 0: NoPE; num_hidden_layers "
                             f"= {n}), got {flags!r}")
        return [bool(f) for f in flags]
    if reading.rope_layers is not None:  # Cohere2: RoPE iff the layer has a sliding window
        types = config.get("layer_types")
        if not isinstance(types, (list, tuple)) or len(types) != n:
            raise ValueError(f"layer_types must list one layer type per layer for model_type {model_type!r} "
                             f"(num_hidden_layers = {n}), got {types!r}")
        windowed = config.get("sliding_window") is not None
        return [windowed and t == reading.rope_layers for t in types]
    return [True] * n


def _refuse_nope_layer_type(config: dict, reading: HFReading, model_type: str | None, layer_type: str) -> None:
    """A hybrid's layer type whose layers all skip RoPE (Cohere2's full layers; Llama 4's full
    layers, which are its NoPE ones) has no RoPE to build: an error, not a RoPE no layer uses."""
    types, n = config.get("layer_types"), config.get("num_hidden_layers")
    if not isinstance(types, (list, tuple)) or len(types) != n:
        return  # the layer type itself is checked against the rope dict and layer_types later
    rotating = _rotating_layers(config, reading, model_type, n)
    layers = [i for i, t in enumerate(types) if t == layer_type]
    if layers and not any(rotating[i] for i in layers):
        why = (f"only its {reading.rope_layers!r} layers rotate" if reading.rope_layers != "no_rope_layers"
               else f"no_rope_layers is 0 for each of its layers {layers}")
        raise ValueError(f"layer type {layer_type!r} of model_type {model_type!r} has no rotary embedding (NoPE): "
                         f"{why}")


def layer_ropes(config: Any) -> list[RotaryEmbedding | None]:
    """The RoPE of each decoder layer of a Hugging Face model config; None for a layer that
    does not rotate (NoPE).

    One :func:`from_hf` per distinct RoPE, shared by the layers that use it: one for most
    families; one per layer type for per-layer-type rope parameters (Gemma 3's sliding and full
    layers); None on the NoPE layers of the hybrids (SmolLM3's and Llama 4's ``no_rope_layers``
    flags, 0 = NoPE, or every ``no_rope_layer_interval``-th layer; Cohere2's full-attention
    layers). What else those layers do (sliding or chunked windows, Llama 4's query temperature
    on its NoPE layers) is attention, not RoPE: it is not read here.

    >>> ropes = layer_ropes(json.load(open("config.json")))   # SmolLM3-3B: every 4th is None
    """
    config = _as_dict(config)
    model_type = config.get("model_type")
    reading = HF_READINGS.get(model_type) if isinstance(model_type, str) or model_type is None else None
    if reading is None:
        return [from_hf(config)]  # from_hf's own error for an unknown model_type
    count_key = "n_layer" if model_type == "gptj" else "num_hidden_layers"
    n = config.get(count_key)
    check_int(count_key, n, minimum=1)
    rotating = _rotating_layers(config, reading, model_type, n)
    rope_dict = config.get("rope_parameters") or config.get("rope_scaling") or {}
    per_type = bool(reading.per_layer) or (isinstance(rope_dict, dict)
                                            and any(isinstance(v, dict) for v in rope_dict.values()))
    types = config.get("layer_types") if per_type else None
    if per_type and (not isinstance(types, (list, tuple)) or len(types) != n):
        raise ValueError(f"layer_types must list one layer type per layer (num_hidden_layers = {n}) to read "
                         f"per-layer-type rope parameters, got {types!r}")
    built: dict[str | None, RotaryEmbedding] = {}
    out: list[RotaryEmbedding | None] = []
    for i in range(n):
        layer_type = types[i] if types else None
        if rotating[i] and layer_type not in built:
            built[layer_type] = from_hf(config, layer_type=layer_type)
        out.append(built[layer_type] if rotating[i] else None)
    return out


def _json_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value  # config.json has lists


def to_hf(rope: RotaryEmbedding | Mapping[str, RotaryEmbedding]) -> dict[str, Any]:
    """The Hugging Face config entries of a posenc RoPE: ``{"rope_parameters": {...}, ...}``.

    A mapping layer type -> RoPE (Gemma 3's, e.g. ``{t: patched_rope(model, t) for t in
    ("sliding_attention", "full_attention")}``) gives ``rope_parameters`` keyed by layer type,
    as transformers 5 writes it for those families; their top-level entries (``head_dim``, ...)
    are merged, and must agree where two types write the same key.

    ``rope_parameters`` is spelled as transformers 5 writes it: ``rope_type``, ``rope_theta``,
    ``partial_rotary_factor`` (only when r < head_dim) and the scaling's parameters under their
    HF keys (``factor``, ``original_max_position_embeddings``, ``beta_fast``/``beta_slow``,
    ``low_freq_factor``/``high_freq_factor``, ``short_factor``/``long_factor`` as lists,
    ``attention_factor``, ...; every parameter that is set, defaults included, since transformers
    requires some that posenc defaults). Beside it, the top-level keys the reading needs:
    ``head_dim`` and, for ``dynamic``, ``max_position_embeddings`` (transformers' trained length
    for that type). Merge it into a config dict, or pass it to a config class::

        LlamaConfig(hidden_size=..., num_attention_heads=..., **to_hf(rope))

    ``from_hf(to_hf(rope))`` rebuilds the same frequencies and attention factor. Static ``ntk``
    has no transformers type: it is written as ``"default"`` with base * s^(d/(d-2)), the same
    frequencies to float64 rounding (read back as ``default``). Refused with a ``ValueError``:
    ``layout="interleaved"`` (Llama-style configs have no key for it: convert the q/k weights
    with :func:`~posenc.rotary.convert_qk_layout` and use ``"half"``), xPos, and a scaling
    registered without an HF spelling.
    """
    if isinstance(rope, Mapping):
        return _to_hf_per_layer_type(rope)
    if type(rope) is not RotaryEmbedding:
        raise TypeError(f"rope must be a RotaryEmbedding ('rope'; transformers has no xPos), got {type(rope).__name__}")
    cfg = rope.config
    if cfg.layout != "half":
        raise ValueError(
            f"layout must be 'half' to write transformers rope_parameters (its Llama-style configs rotate halves); "
            f"got {cfg.layout!r}. Permute the q/k weights with convert_qk_layout(..., to='half') and use layout='half'"
        )
    entry = SCALINGS[cfg.scaling]
    scfg = cfg.scaling_config
    head_dim, r = rope.dims.head_dim, rope.rotary_dim
    top: dict[str, Any] = {"head_dim": head_dim}
    if entry.hf is None and entry.hf_default_base is not None:
        params = {"rope_type": "default", "rope_theta": float(entry.hf_default_base(scfg, cfg.base, r))}
    elif entry.hf is None:
        raise ValueError(f"rope type {cfg.scaling!r} has no transformers spelling (its Scaling entry has hf=None)")
    else:
        params = {"rope_type": entry.hf.rope_type, "rope_theta": float(cfg.base)}
        for name in entry.params:
            value = getattr(scfg, name)
            if value is None:
                continue
            if name in entry.hf.top_level:
                top[entry.hf.top_level[name]] = _json_value(value)
            else:
                params[entry.hf.key(name)] = _json_value(value)
    if r != head_dim and "partial_rotary_factor" in params:
        raise ValueError(
            f"rotary_dim must be head_dim ({head_dim}) to write rope type {entry.hf.rope_type!r}: transformers "
            f"reads its partial_rotary_factor as the scaling's own parameter, not the rotated width; got {r}"
        )
    if r != head_dim:
        # transformers takes int(head_dim * fraction) channels: the fraction must give r back.
        frac = r / head_dim
        if int(head_dim * frac) != r:
            frac = math.nextafter(frac, 1.0)
        params["partial_rotary_factor"] = frac
    return {"rope_parameters": params} | top


def _to_hf_per_layer_type(ropes: Mapping[str, RotaryEmbedding]) -> dict[str, Any]:
    if not ropes or not all(isinstance(t, str) for t in ropes):
        raise ValueError(f"rope must map at least one layer type (a str) to its RoPE, got {dict(ropes)!r}")
    parts = {t: to_hf(r) for t, r in ropes.items()}
    # One config holds every layer type's top-level entries: a key one type needs and another
    # does not read (dynamic NTK's max_position_embeddings) is written once; two values for one
    # key (two head sizes) cannot be.
    top: dict[str, Any] = {}
    needs: dict[str, str] = {}
    for t, p in parts.items():
        for k, v in p.items():
            if k == "rope_parameters":
                continue
            if k in top and top[k] != v:
                raise ValueError(f"the layer types' RoPEs must agree on their top-level entries to share one config: "
                                 f"{needs[k]!r} needs {k} = {top[k]!r}, {t!r} needs {k} = {v!r}")
            top.setdefault(k, v)
            needs.setdefault(k, t)
    return {"rope_parameters": {t: p["rope_parameters"] for t, p in parts.items()}} | top
