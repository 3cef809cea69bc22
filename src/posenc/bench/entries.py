"""A benchmark entry: an encoding variant and how its runs choose positions, written as one spec.

``posenc bench --encodings`` takes the specs of :mod:`posenc.variants` (``rope:base=500000``)
plus the bench's own training options, written as further ``KEY=VALUE`` items of the same spec:

* ``randomized_positions=K`` (int >= 1): randomized positions (Ruoss et al. 2023,
  "Randomized Positional Encodings Boost Length Generalization of Transformers", ACL): every
  training and every evaluation sequence of ``n`` tokens is given a sorted uniform sample of
  ``n`` distinct positions from ``[0, K * M)``, M the longest sequence the task's evaluation
  feeds the model (:meth:`~posenc.bench.settings.BenchSettings.max_positions`), instead of
  ``0 .. n - 1`` (:func:`posenc.absolute.randomized.randomized_positions`). Ruoss et al. sample
  from L = 2048 for test lengths up to 500 in training and at test alike; K = 4 is that ratio.

``rope:randomized_positions=4`` and ``none:randomized_positions=4`` are RoPE and NoPE trained
and tested that way. A training option is not an encoding config field: the encoding is built
from the other items, and a key that is both (an encoding with a field of that name) is refused.

An int config value may also be written ``L``: **the run's training length** in tokens
(:meth:`~posenc.bench.tasks.Task.train_tokens`, the ``original_max_position_embeddings`` the
bench gives the training-free RoPE scalings), filled in per task when the model is built. HoPE
(Chen et al. 2025) cuts RoPE's frequencies at the trained length, which differs per task, so
``rope:scaling=hope,original_max_position_embeddings=L`` is HoPE trained at each task's own L.

The canonical label is the variant's label, then the keys set to ``L``, then the options, in
the order of :data:`TRAINING_OPTIONS`; ``:`` is written ``@``: ``rope@randomized_positions=4``,
``rope@scaling=hope,original_max_position_embeddings=L``. A label is itself a valid spec, so
``bench.json`` stores labels and ``--resume`` reads them back.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any

from ..config import check_int, field_types
from ..registry import get_info
from ..variants import EncodingVariant, dirname_for, format_value, parse_typed, parse_variant

__all__ = ["BenchEntry", "TRAINING_OPTIONS", "parse_entry"]

# The bench's training options: key -> its type (values parsed as posenc.variants parses them).
TRAINING_OPTIONS: dict[str, type] = {"randomized_positions": int}
TRAIN_LENGTH = "L"  # a config value that stands for the run's training length in tokens
# What an L-valued key is checked with when the spec is read (the real value is checked when the
# bench builds each task's model, before any training: posenc.bench.preflight)
_L_PROBE = 1024


@dataclass(frozen=True)
class BenchEntry:
    """An encoding variant (:class:`~posenc.variants.EncodingVariant`) and its training options.

    ``train_length_keys``: config keys set to the run's training length in tokens (``L`` in the
    spec). ``randomized_positions``: K of Ruoss et al.'s range ``[0, K * M)`` (module
    docstring), or None: positions ``0 .. n - 1``.
    """

    variant: EncodingVariant
    train_length_keys: tuple[str, ...] = ()
    randomized_positions: int | None = None

    def __post_init__(self) -> None:
        if self.randomized_positions is not None:
            check_int("randomized_positions", self.randomized_positions, minimum=1)

    @property
    def name(self) -> str:
        """The registered encoding's name."""
        return self.variant.name

    def options(self) -> tuple[tuple[str, Any], ...]:
        """The training options that are set, in :data:`TRAINING_OPTIONS` order."""
        return tuple((k, getattr(self, k)) for k in TRAINING_OPTIONS if getattr(self, k) is not None)

    def config(self, train_tokens: int) -> dict[str, Any]:
        """The encoding's config values for a run whose training length is ``train_tokens``."""
        return {**self.variant.config_dict(), **dict.fromkeys(self.train_length_keys, train_tokens)}

    @property
    def label(self) -> str:
        """``rope``, ``rope@base=500000.0``, ``rope@randomized_positions=4``."""
        items = [f"{k}={TRAIN_LENGTH}" for k in self.train_length_keys]
        items += [f"{k}={format_value(v)}" for k, v in self.options()]
        if not items:
            return self.variant.label
        return f"{self.variant.label}{',' if self.variant.config else '@'}{','.join(items)}"

    @property
    def dirname(self) -> str:
        """A folder name: the label, or ``NAME@<hash>`` when it is too long."""
        return dirname_for(self.name, self.label)

    def position_range(self, max_positions: int) -> int | None:
        """The range ``K * M`` randomized positions are drawn from, for a task whose evaluation
        feeds at most ``max_positions`` tokens; None without randomized positions."""
        return None if self.randomized_positions is None else self.randomized_positions * max_positions


def parse_entry(spec: str) -> BenchEntry:
    """The :class:`BenchEntry` of a spec or label: the training options and the ``L`` values taken
    out, the rest read by :func:`posenc.variants.parse_variant` (its errors name the spec and list
    the valid keys; an ``L`` key is checked with a stand-in training length)."""
    if not isinstance(spec, str):
        raise TypeError(f"encoding spec must be a str, got {type(spec).__name__} {spec!r}")
    sep = min((i for i in (spec.find(":"), spec.find("@")) if i >= 0), default=-1)
    if sep < 0:
        return BenchEntry(parse_variant(spec))
    name, items = spec[:sep], spec[sep + 1:].split(",")
    options: dict[str, Any] = {}
    at_length: list[str] = []
    rest = []
    for item in items:
        key, eq, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if key in options or key in at_length:
            raise ValueError(f"encoding spec {spec!r}: key {key!r} is given twice")
        if key in TRAINING_OPTIONS:
            if not eq:
                raise ValueError(f"encoding spec {spec!r}: {key} needs a value ({key}=VALUE)")
            try:
                options[key] = parse_typed(key, text, TRAINING_OPTIONS[key])
            except ValueError as e:
                raise ValueError(f"encoding spec {spec!r}: {e}") from None
        elif eq and text == TRAIN_LENGTH:
            at_length.append(key)
        else:
            rest.append(item)
    info = get_info(name)  # an unknown name lists the registered encodings
    for key in at_length:  # an L value is a length: the key must take an int
        if key in info.config_keys and not _takes_int(_key_type(info, key)):
            tp = _key_type(info, key)
            raise ValueError(f"encoding spec {spec!r}: {key}={TRAIN_LENGTH} needs an int config key (L is the "
                             f"training length in tokens); {key} takes {getattr(tp, '__name__', tp)}")
    probe = rest + [f"{k}={_L_PROBE}" for k in at_length]
    probe_spec = f"{name}:{','.join(probe)}" if probe else name
    try:
        variant = parse_variant(probe_spec)
    except ValueError as e:  # name the spec as written
        note = f" (checked with L = {_L_PROBE} tokens)" if at_length else ""
        raise ValueError(str(e).replace(repr(probe_spec), repr(spec)) + note) from None
    clash = sorted(set(options) & set(info.config_keys))
    if clash:
        raise ValueError(f"encoding spec {spec!r}: {', '.join(clash)} is both a bench training option and a config "
                         f"key of encoding {variant.name!r}; the spec cannot say which is meant")
    if at_length:  # the variant without them: its label, and the values the entry fills per task
        variant = EncodingVariant(variant.name, tuple((k, v) for k, v in variant.config if k not in at_length))
    order = list(info.config_keys)
    try:
        return BenchEntry(variant, tuple(sorted(at_length, key=order.index)), **options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"encoding spec {spec!r}: {e}") from None


def _takes_int(tp: Any) -> bool:
    """``int`` or a union with an ``int`` arm (``int | None``)."""
    return tp is int or (typing.get_origin(tp) in (typing.Union, types.UnionType) and int in typing.get_args(tp))


def _key_type(info: Any, key: str) -> Any:
    """The annotation of config key ``key`` (RoPE: also its scalings' parameters)."""
    from ..rotary.scaling import SCALINGS

    types_ = dict(field_types(info.config_cls))
    for entry in SCALINGS.values():
        for k, tp in field_types(entry.config).items():
            types_.setdefault(k, tp)
    return types_[key]
