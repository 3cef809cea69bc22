"""A posenc RoPE written as Hugging Face config entries: :func:`to_hf`, the inverse of
:func:`~posenc.rotary.from_hf` (``from_hf(to_hf(rope))`` rebuilds the same frequencies and
attention factor). The spelling of each scaling is its :class:`~posenc.rotary.HFSpec`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .rope import RotaryEmbedding
from .scaling import SCALINGS

__all__ = ["to_hf"]


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
