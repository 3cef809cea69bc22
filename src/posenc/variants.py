"""Encoding variants: a registered encoding with some config values fixed, written as one string.

The command line names encodings by spec, so two RoPE bases or two T5 bucket counts can be
compared in one run::

    posenc bench --encodings rope rope:base=500000 t5:num_buckets=64,max_distance=256 alibi

Spec grammar: ``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE...``. Each value is typed from the
annotation of the encoding's config field (for RoPE also its scalings' parameters):

========================  =====================================================
annotation                accepted text
========================  =====================================================
``int``                   ``64``, ``-3``
``float``                 ``500000``, ``1e-5``, ``0.25`` (finite)
``bool``                  ``true`` / ``false`` (any case)
``str`` / ``Literal``     letters, digits, ``_ . -`` (``layout=half``)
``X | None``              ``none`` for None, else X
``tuple[X, ...]``         items separated by ``;`` (``short_factor=1;1.5;2``)
========================  =====================================================

An unknown key, a bad value or a bad range is a ``ValueError`` that names the key, lists the
valid keys (or the allowed values) and shows the value received; the encoding's own config
checks ranges, so ``rope:base=1`` fails here, before any model is built.

Every variant has one **canonical label**: keys in the config's declaration order, values
in canonical form (floats as Python writes them, ``500000`` and ``5e5`` both
``500000.0``), keys whose value equals the field default dropped, and ``:`` replaced by
``@`` so the label is a safe file or folder name on every OS::

    parse_variant("rope:base=5e5").label == "rope@base=500000.0"
    parse_variant("rope:base=10000").label == "rope"          # the default: plain rope

The label is itself a valid spec, so ``bench.json`` stores labels and ``--resume`` reads
them back. :attr:`EncodingVariant.dirname` is the label, or for a label too long for a
folder name (a long tuple) the name plus a hash of the label.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from .config import check_value, field_types
from .registry import get_info

__all__ = ["EncodingVariant", "parse_variant", "parse_typed", "format_value", "dirname_for", "SPEC_HELP"]

SPEC_HELP = "NAME or NAME:KEY=VALUE,KEY=VALUE (e.g. rope:base=500000); see `posenc list`"

# A str value (and so a label) may hold only these: safe in paths, shells and CSV.
_SAFE_TEXT = re.compile(r"[A-Za-z0-9_.\-]+")
_MAX_DIRNAME = 100  # well under every filesystem's 255-byte name limit


@dataclass(frozen=True)
class EncodingVariant:
    """A registered encoding ``name`` with ``config`` values fixed (typed, canonical order).

    Build it with :func:`parse_variant`; :meth:`config_dict` is what ``posenc.build`` and
    ``ModelConfig.encoding_config`` take.
    """

    name: str
    config: tuple[tuple[str, Any], ...] = ()

    def config_dict(self) -> dict[str, Any]:
        """The fixed config values as keyword arguments."""
        return dict(self.config)

    def build(self, *, d_model: int, num_heads: int, head_dim: int | None = None, **config: Any) -> Any:
        """``posenc.build`` of this variant; ``config`` adds values (a key fixed by the variant
        given again is a ``ValueError``: the spec and the caller would disagree)."""
        from .registry import build

        clash = sorted(set(config) & {k for k, _ in self.config})
        if clash:
            raise ValueError(f"encoding {self.label!r} already fixes {', '.join(clash)}; not given again")
        return build(self.name, d_model=d_model, num_heads=num_heads, head_dim=head_dim, **self.config_dict(), **config)

    @property
    def label(self) -> str:
        """The canonical label, e.g. ``rope@base=500000.0`` (``rope`` when nothing is fixed)."""
        if not self.config:
            return self.name
        return f"{self.name}@" + ",".join(f"{k}={format_value(v)}" for k, v in self.config)

    @property
    def dirname(self) -> str:
        """A folder name for this variant: the label, or ``NAME@<hash>`` when it is too long."""
        return dirname_for(self.name, self.label)


def dirname_for(name: str, label: str) -> str:
    """A folder name for an entry labelled ``label``: the label, or ``NAME@<hash>`` (the first
    16 hex digits of its sha256) when it is longer than a folder name should be."""
    if len(label) <= _MAX_DIRNAME:
        return label
    return f"{name}@{hashlib.sha256(label.encode()).hexdigest()[:16]}"


def format_value(value: Any) -> str:
    """A typed config value in the text :func:`parse_variant` reads back to the same value."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # shortest text that round-trips: 500000.0, 1e-05
    if isinstance(value, tuple):
        return ";".join(format_value(v) for v in value)
    return str(value)


def _key_types(info: Any) -> dict[str, Any]:
    """Every config key of the encoding and its annotation (RoPE: also its scalings' parameters)."""
    types_ = dict(field_types(info.config_cls))
    extra = [k for k in info.config_keys if k not in types_]
    if extra:  # parameters held outside the dataclass fields (RoPE's scalings)
        from .rotary.scaling import SCALINGS

        for entry in SCALINGS.values():
            for k, tp in field_types(entry.config).items():
                types_.setdefault(k, tp)
    return {k: types_[k] for k in info.config_keys if k in types_}


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def parse_typed(key: str, text: str, tp: Any) -> Any:
    """``text`` converted to the annotation ``tp`` (the grammar in the module docstring); a
    ``ValueError`` names ``key``, what it allows and the text received."""
    if _is_union(tp):
        arms = typing.get_args(tp)
        if text.lower() == "none" and type(None) in arms:
            return None
        for arm in arms:
            if arm is type(None):
                continue
            try:
                return parse_typed(key, text, arm)
            except ValueError:
                continue
        raise ValueError(f"{key} must be {_allowed(tp)}, got {text!r}")
    origin = typing.get_origin(tp)
    if tp is bool:
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ValueError(f"{key} must be true or false, got {text!r}")
    if tp is int:
        try:
            return int(text, 10)
        except ValueError:
            raise ValueError(f"{key} must be an int, got {text!r}") from None
    if tp is float:
        try:
            x = float(text)
        except ValueError:
            raise ValueError(f"{key} must be a float, got {text!r}") from None
        if not math.isfinite(x):
            raise ValueError(f"{key} must be a finite float, got {text!r}")
        return x
    if tp is str or origin is Literal:
        if not _SAFE_TEXT.fullmatch(text):
            raise ValueError(f"{key} must be text of letters, digits, '_', '.' or '-', got {text!r}")
        return text
    if origin is tuple:
        args = typing.get_args(tp)
        items = [] if text == "" else text.split(";")
        item_types = [args[0]] * len(items) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(item_types) != len(items):
            raise ValueError(f"{key} must have {len(item_types)} items separated by ';', got {text!r}")
        return tuple(parse_typed(f"{key}[{i}]", t, it) for i, (t, it) in enumerate(zip(items, item_types)))
    if tp is type(None):
        if text.lower() == "none":
            return None
        raise ValueError(f"{key} must be none, got {text!r}")
    raise ValueError(f"{key} cannot be set from the command line (type {tp!r})")


def _allowed(tp: Any) -> str:
    if _is_union(tp):
        return " or ".join(_allowed(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "none"
    if typing.get_origin(tp) is tuple:
        return "items separated by ';'"
    return {bool: "true or false", int: "an int", float: "a float"}.get(tp, "text")


def parse_variant(spec: str) -> EncodingVariant:
    """The :class:`EncodingVariant` a spec (``rope:base=500000``) or a label names.

    Raises ``TypeError`` for a non-str and ``ValueError`` for an unknown encoding (listing the
    registered ones), a malformed item, an unknown key (listing the valid keys), a repeated
    key, or a value of the wrong type or out of range (naming the key and the value).
    """
    if not isinstance(spec, str):
        raise TypeError(f"encoding spec must be a str ({SPEC_HELP}), got {type(spec).__name__} {spec!r}")
    sep = min((i for i in (spec.find(":"), spec.find("@")) if i >= 0), default=-1)
    name, rest = (spec, None) if sep < 0 else (spec[:sep], spec[sep + 1:])
    info = get_info(name)  # an unknown name lists the registered encodings
    if rest is None:
        return EncodingVariant(name)
    key_types = _key_types(info)
    valid = ", ".join(key_types) if key_types else "none (it takes no parameters)"
    given: dict[str, Any] = {}
    for item in rest.split(","):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"encoding spec {spec!r}: each item after ':' must be KEY=VALUE, got {item!r}; "
                             f"valid keys for {name!r}: {valid}")
        if key not in key_types:
            raise ValueError(f"encoding spec {spec!r}: unknown key {key!r} for encoding {name!r}; valid keys: {valid}")
        if key in given:
            raise ValueError(f"encoding spec {spec!r}: key {key!r} is given twice")
        try:
            given[key] = check_value(key, parse_typed(key, text.strip(), key_types[key]), key_types[key])
        except (TypeError, ValueError) as e:
            raise ValueError(f"encoding spec {spec!r}: {e}") from None
    try:
        info.make_config(given)  # the encoding's own range checks (base > 0, even rotary_dim, ...)
    except (TypeError, ValueError) as e:
        raise ValueError(f"encoding spec {spec!r}: {e}") from None
    defaults = {f.name: f.default for f in dataclasses.fields(info.config_cls)
                if f.init and f.default is not dataclasses.MISSING}
    order = list(key_types)
    config = tuple(
        (k, given[k]) for k in sorted(given, key=order.index)
        if not (k in defaults and _same(given[k], check_value(k, defaults[k], key_types[k])))
    )
    return EncodingVariant(name, config)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types (``True`` is not ``1``), both in stored form."""
    return type(a) is type(b) and a == b
