"""A posenc RoPE module from a Hugging Face ``config.json``: :func:`from_hf` (one layer
type) and :func:`layer_ropes` (every decoder layer).

:func:`from_hf` reads the dict (or a transformers ``PretrainedConfig``) *by its*
``model_type``, as transformers 5.23 does for that family (:data:`~posenc.rotary.hf_readings.HF_READINGS`
lists the families and the keys each reads), and builds the
:class:`~posenc.rotary.RotaryEmbedding` whose ``inv_freq``, ``attention_factor``, rotary
width and layout equal the model's. :func:`~posenc.rotary.to_hf` (:mod:`.hf_write`) writes one back.

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
from typing import Any, Mapping

from ..config import check_int, check_value, field_types
from ..encoding import Dims
from .hf_geometry import read_base, read_dims, read_layout, read_rotary_dim
from .hf_readings import HF_READINGS, ORIGINAL, HFReading, hf_entries, hf_rope_keys, is_rope_key, pick, rotating_layers
from .mrope import MROPE_MODEL_TYPES, mrope_from_hf
from .xdrope import XDROPE_MODEL_TYPES, xdrope_from_hf
from .rope import RotaryConfig, RotaryEmbedding
from .scaling.schema import Scaling

__all__ = ["from_hf", "layer_ropes"]


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))  # never edit the caller's dict
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict) and type(config).__module__.startswith("transformers"):
        return copy.deepcopy(to_dict())
    raise TypeError(
        f"config must be a dict (a parsed config.json) or a transformers PretrainedConfig, got {type(config).__name__}"
    )


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
                pick(config, key, params[layer], "rope_theta", f"{where}[{layer!r}]")  # must agree
                config.pop(key)
        return params, where
    nested = {}
    for layer, key, default in reading.per_layer:
        layer_params = dict(params) if layer in reading.scaled_layers else {"rope_type": "default"}
        theta, _ = pick(config, key, layer_params, "rope_theta", where, default)
        nested[layer] = layer_params | {"rope_theta": theta}
    for _, key, _ in reading.per_layer:
        config.pop(key, None)  # consumed: now inside the per-layer-type dicts
    return nested, where


def _check_top_level_keys(config: dict, reading: HFReading, model_type: str | None, entry: Scaling) -> None:
    understood = reading.understood() | set(entry.hf.top_level.values())
    if any(entry.hf.key(p) == ORIGINAL for p in entry.params if p not in entry.hf.top_level):
        understood = understood | {ORIGINAL}  # the trained length may sit at the top level (Phi-3)
    rope_type = entry.hf.rope_type
    # null, false and {} are "off", not a setting: Hub configs write "rope_scaling": null, and
    # Qwen2-based ones "use_mrope": false. (Identity checks: 0 == False would hide a 0.)
    unused = sorted(
        k for k in config
        if is_rope_key(k) and k not in understood and not (config[k] is None or config[k] is False or config[k] == {})
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
    supported = [t for t in reading.types() if t in hf_entries()]
    if rope_type not in supported:
        family = f"model_type {model_type!r}" if model_type else "generic"
        raise ValueError(
            f"{where}['rope_type'] must be one of {', '.join(map(repr, supported))} for {family}; got {rope_type!r}"
        )
    entry = hf_entries()[rope_type]
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
        elif key == ORIGINAL:
            # The trained length L: transformers prefers the top level (Phi-3), then the rope
            # dict, then max_position_embeddings (standardize_rope_params).
            value, names[name] = pick(config, ORIGINAL, params, ORIGINAL, where, None)
            if value is None:
                value, names[name] = config.get("max_position_embeddings"), "max_position_embeddings"
            out[name] = value
        elif key == "partial_rotary_factor":  # proportional's p: transformers moves a top-level one in too
            value, where_read = pick(config, key, params, key, where, None)
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
        check_int(names.get("original_max_position_embeddings", ORIGINAL), L, minimum=1)
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
    multi_axis = {**dict.fromkeys(MROPE_MODEL_TYPES, mrope_from_hf), **dict.fromkeys(XDROPE_MODEL_TYPES, xdrope_from_hf)}
    if model_type in multi_axis:  # several position axes: an MRopeEmbedding / XDRopeEmbedding (a RotaryEmbedding)
        if layer_type is not None:
            raise ValueError(f"layer_type must be None for model_type {model_type!r} (one RoPE for every layer); "
                             f"got {layer_type!r}")
        return multi_axis[model_type](config)
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

    d_model, heads, head_dim = read_dims(config, reading, model_type, layer_type)
    rotary_dim = read_rotary_dim(config, params, where, reading, head_dim, model_type, entry)
    base, layout = read_base(config, params, where, reading), read_layout(config, reading)
    scaling, names = _scaling(config, params, where, entry)
    try:
        cfg = RotaryConfig(base=base, rotary_dim=rotary_dim, layout=layout, scaling=entry.name, **scaling)
        return RotaryEmbedding(cfg, Dims(d_model=d_model, num_heads=heads, head_dim=head_dim))
    except (TypeError, ValueError) as e:
        raise _renamed(e, names) from None


def _refuse_nope_layer_type(config: dict, reading: HFReading, model_type: str | None, layer_type: str) -> None:
    """A hybrid's layer type whose layers all skip RoPE (Cohere2's full layers; Llama 4's full
    layers, which are its NoPE ones) has no RoPE to build: an error, not a RoPE no layer uses."""
    types, n = config.get("layer_types"), config.get("num_hidden_layers")
    if not isinstance(types, (list, tuple)) or len(types) != n:
        return  # the layer type itself is checked against the rope dict and layer_types later
    rotating = rotating_layers(config, reading, model_type, n)
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
    rotating = rotating_layers(config, reading, model_type, n)
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
