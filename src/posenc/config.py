"""Typed, loud configuration for encodings.

Every encoding has a dataclass config that subclasses :class:`EncodingConfig`. Its
``__post_init__`` first checks every field against its annotation (:func:`check_fields`),
then calls ``validate()``, where the subclass checks ranges with the helpers below.

Types, read from the annotations (one place, so a new field is checked without new code):

* ``bool``: only ``True``/``False`` (``"no"`` and ``1`` are refused: ``bool("no")`` is True);
* ``int``: an int, not a bool, not a float;
* ``float``: an int or a float (stored as float), not a bool or a str; NaN and inf refused;
* ``str``; ``None``; ``X | None`` and other unions; ``Literal[...]``;
* ``tuple[X, ...]`` / ``tuple[X, Y]``: a tuple or a list (JSON), stored as a tuple so that
  configs built from JSON stay hashable.

A wrong type is a ``TypeError`` and a bad value a ``ValueError``; both name the parameter,
what is allowed and the value received; never a warning. Any other annotation is refused
loudly (:func:`field_types`), so an encoding with an exotic field type is noticed by the
tests over the registry rather than accepted unchecked.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Iterable, Literal, Union

__all__ = [
    "EncodingConfig",
    "check_fields",
    "check_value",
    "field_types",
    "check_positive",
    "check_nonnegative",
    "check_range",
    "check_choice",
    "check_even",
    "check_int",
]


def check_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``value`` is an int (not bool) in
    ``[minimum, maximum]`` (either bound may be omitted).

    >>> check_int("max_len", 10**9, minimum=1, maximum=2**20)
    Traceback (most recent call last):
    ...
    ValueError: max_len must be in [1, 1048576], got 1000000000
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    too_low = minimum is not None and value < minimum
    too_high = maximum is not None and value > maximum
    if too_low or too_high:
        if maximum is None:
            allowed = f">= {minimum}"
        elif minimum is None:
            allowed = f"<= {maximum}"
        else:
            allowed = f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {allowed}, got {value}")


def _check_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def check_positive(name: str, value: Any) -> None:
    """``value`` must be a finite number > 0."""
    if _check_number(name, value) <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def check_nonnegative(name: str, value: Any) -> None:
    """``value`` must be a finite number >= 0."""
    if _check_number(name, value) < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def check_range(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """``value`` must be a finite number in the given interval."""
    v = _check_number(name, value)
    lo_ok = low is None or (v >= low if low_inclusive else v > low)
    hi_ok = high is None or (v <= high if high_inclusive else v < high)
    if not (lo_ok and hi_ok):
        lo = "(-inf" if low is None else ("[" if low_inclusive else "(") + f"{low}"
        hi = "inf)" if high is None else f"{high}" + ("]" if high_inclusive else ")")
        raise ValueError(f"{name} must be in {lo}, {hi}, got {value}")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """``value`` must be one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def check_even(name: str, value: Any, *, minimum: int = 2) -> None:
    """``value`` must be an even int >= ``minimum`` (dimensions that are split into pairs)."""
    check_int(name, value, minimum=minimum)
    if value % 2:
        raise ValueError(f"{name} must be even (it is split into pairs), got {value}")


# ---- type checking from annotations -------------------------------------------------------
_SCALARS = (bool, int, float, str, type(None))


class _Mismatch(Exception):
    """The value is not of the annotated type (turned into a TypeError at the top)."""


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _check_annotation(tp: Any, where: str, plain: bool) -> None:
    """Raise ``TypeError`` unless ``tp`` is an annotation :func:`check_value` understands."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _SCALARS or tp is None:
        return
    if _is_union(tp):
        for a in args:
            _check_annotation(a, where, plain)
        return
    if origin is Literal and all(type(a) in _SCALARS for a in args):
        return
    if origin is tuple and args:
        for a in args:
            if a is not Ellipsis:
                _check_annotation(a, where, plain)
        return
    if not plain:
        # Model-level configs may also hold dicts and objects of a named class.
        if tp is Any or tp is dict:
            return
        if origin is dict and len(args) == 2:
            _check_annotation(args[0], where, plain)
            _check_annotation(args[1], where, plain)
            return
        if isinstance(tp, type) and origin is None:
            return
    allowed = "bool, int, float, str, None, X | Y, Literal[...], tuple[X, ...]"
    if not plain:
        allowed += ", Any, dict, dict[K, V], a class"
    raise TypeError(f"{where} has an unsupported annotation {tp!r}; supported: {allowed}")


def _describe(tp: Any) -> str:
    if tp is bool:
        return "a bool"
    if tp is int:
        return "an int"
    if tp is float:
        return "a float"
    if tp is str:
        return "a str"
    if tp is None or tp is type(None):
        return "None"
    if tp is dict:
        return "a dict"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_union(tp):
        return " or ".join(_describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = args[0]
            if item in (bool, int, float, str):
                return f"a tuple (or list) of {item.__name__}s"
            return f"a tuple (or list) whose items are each {_describe(item)}"
        return f"a tuple (or list) of {len(args)} items ({', '.join(_describe(a) for a in args)})"
    if origin is dict:
        if args[1] is Any:
            return f"a dict with {args[0].__name__ if isinstance(args[0], type) else args[0]} keys"
        return f"a dict ({_describe(args[0])} -> {_describe(args[1])})"
    if tp is Any:
        return "any value"
    name = getattr(tp, "__name__", repr(tp))
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def _short_repr(value: Any, limit: int = 80) -> str:
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _convert(name: str, value: Any, tp: Any) -> Any:
    """``value`` checked against ``tp`` (lists become tuples, ints in float fields floats).

    Raises ``_Mismatch`` when ``value`` is not of the type at this level, ``TypeError`` /
    ``ValueError`` (naming ``name``) for a bad item or a bad value of the right type.
    """
    if tp is Any:
        return value
    if tp is None or tp is type(None):
        if value is None:
            return None
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Mismatch
        try:
            f = float(value)  # a huge int overflows here rather than deep in the encoding
        except OverflowError:
            f = math.inf
        if not math.isfinite(f):
            raise ValueError(f"{name} must be finite, got {_short_repr(value)}")
        return f
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_union(tp):
        for arm in args:
            try:
                return _convert(name, value, arm)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        # Compare types too: True == 1 and 1 == 1.0, but neither is the literal.
        if any(type(value) is type(a) and value == a for a in args):
            return value
        if any(type(value) is type(a) for a in args):
            raise ValueError(f"{name} must be one of {', '.join(map(repr, args))}; got {_short_repr(value)}")
        raise _Mismatch
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if len(args) == 2 and args[1] is Ellipsis:
            item_types = [args[0]] * len(value)
        else:
            if len(value) != len(args):
                raise ValueError(f"{name} must have {len(args)} items, got {len(value)}: {_short_repr(value)}")
            item_types = list(args)
        return tuple(check_value(f"{name}[{i}]", v, t) for i, (v, t) in enumerate(zip(value, item_types)))
    if tp is dict:
        if isinstance(value, dict):
            return value
        raise _Mismatch
    if origin is dict:
        if not isinstance(value, dict):
            raise _Mismatch
        kt, vt = args
        for k, v in value.items():
            check_value(f"{name} key {k!r}", k, kt)
            check_value(f"{name}[{k!r}]", v, vt)
        return value
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Mismatch
    raise TypeError(f"{name} has an unsupported annotation {tp!r}")


def check_value(name: str, value: Any, annotation: Any) -> Any:
    """``value`` checked against the type ``annotation``; returns it in stored form.

    A list given for a tuple field comes back as a tuple, an int for a float field as a
    float. A wrong type is a ``TypeError`` naming ``name``, what is allowed and what was
    received; a non-finite float a ``ValueError``.

    >>> check_value("learnable_scale", "no", bool)
    Traceback (most recent call last):
    ...
    TypeError: learnable_scale must be a bool, got str 'no'
    >>> check_value("short_factor", [1, 2.5], tuple[float, ...])
    (1.0, 2.5)
    """
    try:
        return _convert(name, value, annotation)
    except _Mismatch:
        raise TypeError(
            f"{name} must be {_describe(annotation)}, got {type(value).__name__} {_short_repr(value)}"
        ) from None


def field_types(cls: type, *, plain: bool = True) -> dict[str, Any]:
    """The resolved annotation of every constructor field of the dataclass ``cls``.

    ``plain=True`` (encoding configs) allows only JSON-like, hashable types: bool, int, float,
    str, None, unions, ``Literal`` and tuples of them; ``plain=False`` (model and benchmark
    settings) also allows ``Any``, dicts and instances of a class. Any other annotation is a
    ``TypeError`` naming the field, so an unsupported field type fails loudly, not unchecked.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"field_types needs a dataclass class, got {cls!r}")
    # Modules use `from __future__ import annotations`: the annotations are strings, and
    # resolving them (typing.get_type_hints) costs ~0.5 ms for RotaryConfig. The result is
    # stored on the class itself, like dataclasses' own __dataclass_fields__ (read from the
    # class's own __dict__, so a subclass with more fields resolves its own).
    stored = cls.__dict__.get("_posenc_field_types", {})
    if plain in stored:
        return dict(stored[plain])
    try:
        hints = typing.get_type_hints(cls)
    except Exception as e:  # NameError for a name the module does not define, ...
        raise TypeError(f"cannot resolve the annotations of {cls.__qualname__}: {e}") from None
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        _check_annotation(tp, f"field {f.name!r} of {cls.__qualname__}", plain)
        out[f.name] = tp
    type.__setattr__(cls, "_posenc_field_types", {**stored, plain: out})
    return dict(out)


def check_fields(obj: Any, *, plain: bool = False) -> None:
    """Check every constructor field of the dataclass instance ``obj`` against its annotation.

    Call it first in ``__post_init__``. Values are replaced by their stored form (lists by
    tuples, ints in float fields by floats), also on frozen dataclasses. See
    :func:`field_types` for ``plain`` and :func:`check_value` for the rules.

    >>> @dataclasses.dataclass(frozen=True)
    ... class Settings:
    ...     steps: int = 10
    ...     def __post_init__(self) -> None:
    ...         check_fields(self)
    >>> Settings(steps=2.5)
    Traceback (most recent call last):
    ...
    TypeError: steps must be an int, got float 2.5
    """
    for name, tp in field_types(type(obj), plain=plain).items():
        value = getattr(obj, name)
        stored = check_value(name, value, tp)
        if stored is not value:
            object.__setattr__(obj, name, stored)  # works on frozen dataclasses too


@dataclasses.dataclass
class EncodingConfig:
    """Base of every encoding config: loud validation on construction.

    Subclasses add fields (annotated with the types listed in the module docstring) and
    override :meth:`validate`. ``__post_init__`` checks every field's type
    (:func:`check_fields`), then calls :meth:`validate`. Unknown keyword arguments are a
    ``TypeError`` raised by the dataclass constructor itself; :func:`posenc.build` names the
    valid keys.
    """

    def __post_init__(self) -> None:
        check_fields(self, plain=True)
        self.validate()

    def validate(self) -> None:  # pragma: no cover - overridden
        """Check ranges; raise ``ValueError`` naming the parameter."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
