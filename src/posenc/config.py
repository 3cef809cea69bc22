"""Typed, loud configuration for encodings.

Every encoding has a dataclass config that subclasses :class:`EncodingConfig`. Its
``__post_init__`` rejects NaN/inf in any float field, then calls ``validate()``, where the
subclass checks ranges with the helpers below. A bad value is a ``ValueError`` that names
the parameter, the allowed range and the value received; never a warning.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

__all__ = [
    "EncodingConfig",
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


def _floats_in(value: Any) -> Iterable[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _floats_in(v)


@dataclasses.dataclass
class EncodingConfig:
    """Base of every encoding config: loud validation on construction.

    Subclasses add fields and override :meth:`validate`. Unknown keyword arguments are a
    ``TypeError`` raised by the dataclass constructor itself.
    """

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            for v in _floats_in(getattr(self, f.name)):
                if not math.isfinite(v):
                    raise ValueError(f"{f.name} must be finite, got {getattr(self, f.name)!r}")
        self.validate()

    def validate(self) -> None:  # pragma: no cover - overridden
        """Check ranges; raise ``ValueError`` naming the parameter."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
