"""The model's configuration: :class:`ModelConfig`, :class:`EncodingSpec` and named presets.

Everything here is checked on construction, before any module is built: field types from the
annotations, ranges, and every layer's encoding spec (its name, keys and values), so a bad
configuration fails at ``ModelConfig(...)`` naming the field, never later in
:class:`~posenc.model.Transformer`.

Positional setup:
* ``encoding`` (an :class:`EncodingSpec` or a name) is used by every layer, unless
  ``layer_encodings`` gives a spec (or None for no encoding) per layer, or ``layer_pattern``
  gives a cycle of :class:`LayerSpec` (an encoding and a mask kind: global, sliding window or
  chunked attention) repeated over the layers: the NoPE/RoPE hybrids (:mod:`posenc.hybrids`);
* specs with ``shared=True`` that are equal resolve to one module for all their layers, so a
  relative bias table (T5) is one set of parameters computed once per forward;
* ``embed`` hooks (the absolute family) run once: at the input, or, with
  ``absolute_before_last=N``, on the hidden states before the last N layers (DeBERTa's
  enhanced mask decoder); ``embed_scale=s`` runs them in coordinates scaled by ``1 / s``.

``mla`` (an :class:`~posenc.mla.MLAConfig` or a dict of its fields) makes every layer multi-head
latent attention (DeepSeek-V2): the encodings then act on its ``qk_rope_head_dim`` slice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .backends import IMPLS
from .config import check_choice, check_fields, check_int, check_positive, check_range
from .mla import MLAConfig
from .registry import get_info

__all__ = ["ATTENTION_KINDS", "EncodingSpec", "LayerSpec", "ModelConfig", "PRESETS", "naming", "preset"]

# Which keys a layer's queries see (posenc.masks.AttentionMask): every key the causal / document
# / padding rules allow, a sliding window of ``size`` keys, or the ``size``-position chunk.
ATTENTION_KINDS = ("global", "sliding", "chunked")


def _config_items(config: Any, param: str) -> dict[str, Any]:
    """Encoding parameters given as a mapping or as (key, value) pairs (``to_dict``/JSON form)."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in config):
        keys = [k for k, _ in config]
        dup = sorted({k for k in keys if keys.count(k) > 1}, key=repr)
        if dup:
            raise ValueError(f"{param} gives {', '.join(map(repr, dup))} more than once: {config!r}")
        return dict(config)
    raise TypeError(f"{param} must be a dict of encoding parameters (or (key, value) pairs), "
                    f"got {type(config).__name__} {config!r}")


def naming(param: str, e: Exception) -> Exception:
    """``e`` with ``param: `` in front of its message (same type), to say which input failed."""
    if type(e) in (TypeError, ValueError) and not str(e).startswith(f"{param}:"):
        return type(e)(f"{param}: {e}")
    return e


@dataclass(frozen=True)
class EncodingSpec:
    """Which encoding a layer uses: its registry name, config, and whether equal specs share.

    Checked on construction: ``name`` must be registered, ``config`` may only hold the
    encoding's parameters (an unknown key lists the valid ones) and is type- and range-checked
    by building the encoding's config. ``config`` is stored as sorted ``(key, value)`` pairs of
    the checked values (a JSON list for a tuple field becomes a tuple), so specs are hashable
    and equal specs compare equal; a mapping is accepted too.
    """

    name: str
    config: tuple[tuple[str, Any], ...] = ()
    shared: bool = True

    def __post_init__(self) -> None:
        info = get_info(self.name)  # a non-str or unknown name lists the valid ones
        if not isinstance(self.shared, bool):
            raise TypeError(f"shared must be a bool, got {type(self.shared).__name__} {self.shared!r}")
        given = _config_items(self.config, "config")
        checked = info.make_config(given)  # unknown keys, wrong types, bad values
        object.__setattr__(self, "config", tuple(sorted((k, getattr(checked, k)) for k in given)))

    @classmethod
    def of(cls, name: str, shared: bool = True, **config: Any) -> "EncodingSpec":
        """``EncodingSpec.of("rope", base=500000.0)``: the parameters as keywords."""
        return cls(name, tuple(config.items()), shared)

    @classmethod
    def coerce(cls, spec: "EncodingSpec | str | dict | None", param: str = "encoding") -> "EncodingSpec | None":
        """A spec from an :class:`EncodingSpec`, a registry name, a dict or None (no encoding).

        A dict has the key ``name`` and optionally ``shared``, ``config`` (a dict of
        parameters) and parameters at the top level: ``{"name": "rope", "base": 5e5}``.
        Errors start with ``param`` (the argument that held the spec).
        """
        if spec is None or isinstance(spec, EncodingSpec):
            return spec
        try:
            if isinstance(spec, str):
                return cls(spec)
            if isinstance(spec, Mapping):
                return cls._from_dict(dict(spec))
        except (TypeError, ValueError) as e:
            raise naming(param, e) from None
        raise TypeError(f"{param} must be an EncodingSpec, an encoding name, a dict with 'name', or None; "
                        f"got {type(spec).__name__} {spec!r}")

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> "EncodingSpec":
        if "name" not in d:
            raise ValueError(f"a dict needs the key 'name' (the encoding's registry name); got keys: "
                             f"{', '.join(map(repr, d)) or 'none'}")
        name, shared = d.pop("name"), d.pop("shared", True)
        info = get_info(name)
        config = _config_items(d.pop("config", None), "config")
        unknown = [k for k in d if k not in info.config_keys]
        if unknown:
            raise TypeError(
                f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for encoding {name!r}; "
                f"an encoding dict takes name, shared, config and the encoding's parameters: "
                f"{', '.join(info.config_keys) or 'none'}"
            )
        both = sorted(set(config) & set(d))
        if both:
            raise ValueError(f"{', '.join(map(repr, both))} given both in config and at the top level")
        return cls(name, tuple((config | d).items()), shared)


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a hybrid: its encoding and which keys its queries see.

    ``encoding``: an :class:`EncodingSpec`, a registry name, a dict (as ``layer_encodings``
    takes) or None for no encoding (NoPE). ``attention``: one of :data:`ATTENTION_KINDS`;
    ``size`` is the window (``sliding``: query i sees keys i - size < j <= i, transformers'
    ``sliding_window``) or the chunk (``chunked``: positions p // size equal, Llama 4's
    ``attention_chunk_size``), and must be None for ``global``. Checked on construction.
    """

    encoding: EncodingSpec | str | dict | None
    attention: str = "global"
    size: int | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "encoding", EncodingSpec.coerce(self.encoding, "encoding"))
        check_choice("attention", self.attention, ATTENTION_KINDS)
        if self.attention == "global":
            if self.size is not None:
                raise ValueError(f"size must be None for attention='global' (every key is seen), got {self.size}")
        elif self.size is None:
            raise ValueError(f"size must be given for attention={self.attention!r} "
                             f"({'the window in keys' if self.attention == 'sliding' else 'the chunk in positions'})")
        else:
            check_int("size", self.size, minimum=1)

    @classmethod
    def coerce(cls, spec: "LayerSpec | dict", param: str) -> "LayerSpec":
        """A LayerSpec, or a dict of its fields (``to_dict``'s form); errors start with ``param``."""
        if isinstance(spec, LayerSpec):
            return spec
        if not isinstance(spec, Mapping):
            raise TypeError(f"{param} must be a LayerSpec or a dict with 'encoding' (and 'attention', 'size'), "
                            f"got {type(spec).__name__} {spec!r}")
        unknown = sorted(set(spec) - {"encoding", "attention", "size"}, key=repr)
        if unknown or "encoding" not in spec:
            raise ValueError(f"{param} takes the keys 'encoding' (required), 'attention' and 'size', got "
                             f"{', '.join(map(repr, spec)) or 'none'}")
        try:
            return cls(**spec)
        except (TypeError, ValueError) as e:
            raise naming(param, e) from None

    @property
    def mask(self) -> dict[str, int]:
        """The :meth:`AttentionMask.build <posenc.masks.AttentionMask.build>` keywords of this
        layer's kind: ``{}``, ``{"window": size}`` or ``{"chunk": size}``."""
        return {"global": {}, "sliding": {"window": self.size}, "chunked": {"chunk": self.size}}[self.attention]


@dataclass
class ModelConfig:
    """Configuration of :class:`Transformer` (all sizes in tokens or channels).

    Checked on construction: every field's type from its annotation (``causal="no"`` is a
    ``TypeError``), then ranges, then every layer's encoding spec and config are built, so an
    unknown encoding key or a bad encoding value fails here, naming ``encoding``,
    ``encoding_config`` or ``layer_encodings[i]``. ``encoding_config=None`` means no overrides.
    """

    vocab_size: int = 256
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    d_ff: int | None = None  # default 4 * d_model
    causal: bool = True  # decoder LM; False: bidirectional encoder
    dropout: float = 0.0
    encoding: EncodingSpec | str | dict = "rope"
    # Merged into `encoding`'s parameters; None = no overrides (stored as {}).
    encoding_config: dict[str, Any] | None = field(default_factory=dict)
    share_encoding: bool = True
    layer_encodings: tuple[EncodingSpec | str | dict | None, ...] | None = None
    # A cycle of LayerSpec (encoding + mask kind), repeated over the layers and cut at n_layer
    # (Llama 4: three chunked RoPE layers, then a global NoPE one). Replaces encoding.
    layer_pattern: tuple[LayerSpec | dict, ...] | None = None
    absolute_before_last: int | None = None
    # The embed hooks run on x / embed_scale and their output is scaled back by embed_scale
    # (None: as is). A code of fixed, order-one amplitude designed beside unit-scale tokens
    # (sinusoidal; Vaswani et al. 2017, sec. 3.4) meets N(0, 0.02) tokens at its paper's
    # ratio with embed_scale=0.02; an encoding that reads the tokens reads them at unit scale.
    embed_scale: float | None = None
    attn_impl: str = "sdpa"  # attention backend: eager | sdpa | flex | auto (posenc.backends)
    tie_weights: bool = True
    # Multi-head latent attention in every layer (posenc.mla): an MLAConfig or a dict of its
    # fields, whose d_model and num_heads default to the model's; None: posenc.Attention.
    mla: MLAConfig | dict | None = None

    def __post_init__(self) -> None:
        if self.encoding_config is None:
            self.encoding_config = {}
        # Types from the annotations first (causal="no" is a TypeError, not a truthy str; a
        # list for layer_encodings is stored as a tuple), then the ranges below.
        check_fields(self)
        check_int("vocab_size", self.vocab_size, minimum=1)
        check_int("d_model", self.d_model, minimum=1)
        check_int("n_layer", self.n_layer, minimum=1)
        check_int("n_head", self.n_head, minimum=1)
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head is not None:
            check_int("n_kv_head", self.n_kv_head, minimum=1)
            if self.n_head % self.n_kv_head:
                raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.d_ff is not None:
            check_int("d_ff", self.d_ff, minimum=1)
        check_range("dropout", self.dropout, 0.0, 1.0, high_inclusive=False)
        check_choice("attn_impl", self.attn_impl, IMPLS)
        if self.embed_scale is not None:
            check_positive("embed_scale", self.embed_scale)
        if self.absolute_before_last is not None:
            check_int("absolute_before_last", self.absolute_before_last, minimum=0)
            if self.absolute_before_last > self.n_layer:
                raise ValueError(
                    f"absolute_before_last must be <= n_layer ({self.n_layer}), got {self.absolute_before_last}"
                )
        if self.layer_encodings is not None:
            if len(self.layer_encodings) != self.n_layer:
                raise ValueError(
                    f"layer_encodings must have n_layer ({self.n_layer}) entries, got {len(self.layer_encodings)}"
                )
            if self.encoding_config:
                raise ValueError(
                    "encoding_config applies to `encoding`, which layer_encodings replaces; put the "
                    f"parameters in each layer's spec, got encoding_config={self.encoding_config!r}"
                )
        if self.layer_pattern is not None:
            if not 1 <= len(self.layer_pattern) <= self.n_layer:
                raise ValueError(f"layer_pattern must have 1 to n_layer ({self.n_layer}) entries (it repeats over "
                                 f"the layers), got {len(self.layer_pattern)}")
            for other in ("layer_encodings", "encoding_config"):
                if getattr(self, other):
                    raise ValueError(f"layer_pattern gives every layer's encoding; {other} must be unset with it, "
                                     f"got {other}={getattr(self, other)!r}")
            self.layer_pattern = tuple(LayerSpec.coerce(s, f"layer_pattern[{i}]") for i, s in enumerate(self.layer_pattern))
        if self.mla is not None:
            self.mla = self._mla_config()
        # Eager: every spec's encoding config is built here, so a bad name, key, type or value
        # fails at ModelConfig(...), not later at Transformer(...).
        self.layer_specs()

    def _mla_config(self) -> MLAConfig:
        """``mla`` checked against the model: its width and heads, and no grouped KV heads."""
        if self.n_kv_head is not None:
            raise ValueError(f"n_kv_head must be None with mla (its keys and values come from one latent per token), "
                             f"got {self.n_kv_head}")
        given = dataclasses.asdict(self.mla) if isinstance(self.mla, MLAConfig) else dict(self.mla)
        for key, mine, name in (("d_model", self.d_model, "d_model"), ("num_heads", self.n_head, "n_head")):
            if given.setdefault(key, mine) != mine:
                raise ValueError(f"mla: {key} must be the model's {name} ({mine}), got {given[key]!r}")
        fields = [f.name for f in dataclasses.fields(MLAConfig)]
        unknown = [k for k in given if k not in fields]
        if unknown:
            raise TypeError(f"mla: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                            f"valid: {', '.join(fields)}")
        try:
            return MLAConfig(**given)
        except (TypeError, ValueError) as e:
            raise naming("mla", e) from None

    def layer_specs(self) -> list[EncodingSpec | None]:
        """The checked :class:`EncodingSpec` (or None) of every layer."""
        if self.layer_pattern is not None:
            return [spec.encoding for spec in self.layer_kinds()]
        if self.layer_encodings is not None:
            return [EncodingSpec.coerce(s, f"layer_encodings[{i}]") for i, s in enumerate(self.layer_encodings)]
        base = EncodingSpec.coerce(self.encoding, "encoding")
        if base is None:  # pragma: no cover - check_fields refuses encoding=None
            raise TypeError("encoding must not be None; use 'none' for no positional encoding")
        try:
            spec = EncodingSpec(base.name, dict(base.config) | self.encoding_config, base.shared and self.share_encoding)
        except (TypeError, ValueError) as e:
            raise naming("encoding_config", e) from None
        return [spec] * self.n_layer

    def layer_kinds(self) -> list[LayerSpec]:
        """Every layer's :class:`LayerSpec`: ``layer_pattern`` repeated, else each layer's encoding
        with global attention."""
        if self.layer_pattern is None:
            return [LayerSpec(spec) for spec in self.layer_specs()]
        return [self.layer_pattern[i % len(self.layer_pattern)] for i in range(self.n_layer)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=32, n_layer=2, n_head=4),
    "small": dict(d_model=128, n_layer=4, n_head=4),
    "base": dict(d_model=512, n_layer=6, n_head=8),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named model size (exact names only: ``tiny``, ``small``, ``base``) with overrides."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = [k for k in overrides if k not in fields]
    if unknown:
        raise TypeError(f"unknown ModelConfig field {', '.join(map(repr, unknown))}; valid fields: {', '.join(fields)}")
    return ModelConfig(**(PRESETS[name] | overrides))
