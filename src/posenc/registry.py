"""The registry: every encoding by name, with its config, summary and paper.

Add an encoding with the :func:`register` class decorator in its family module; tests
parametrize over :func:`list_encodings`, so a new entry is tested automatically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from .config import check_choice
from .encoding import Dims, PositionalEncoding

__all__ = ["EncodingInfo", "register", "build", "list_encodings", "get_info", "FAMILIES"]

FAMILIES = ("none", "absolute", "relative", "rotary")


@dataclass(frozen=True)
class EncodingInfo:
    name: str
    cls: type[PositionalEncoding]
    family: str
    summary: str
    paper: str

    @property
    def config_cls(self) -> type:
        return self.cls.Config


_REGISTRY: dict[str, EncodingInfo] = {}

E = TypeVar("E", bound=type[PositionalEncoding])


def register(name: str, *, family: str, summary: str, paper: str) -> Callable[[E], E]:
    """Class decorator: ``@register("alibi", family="relative", summary=..., paper=...)``."""
    check_choice("family", family, FAMILIES)

    def deco(cls: E) -> E:
        if name in _REGISTRY:
            raise ValueError(f"encoding {name!r} is already registered")
        cls.name, cls.family, cls.summary, cls.paper = name, family, summary, paper
        _REGISTRY[name] = EncodingInfo(name, cls, family, summary, paper)
        return cls

    return deco


def _load_families() -> None:
    # Importing the family packages runs their @register decorators.
    from . import absolute, relative, rotary  # noqa: F401


def list_encodings(family: str | None = None) -> list[str]:
    """Names of all registered encodings (optionally of one family).

    Ordered by family (none, absolute, relative, rotary), then by registration order within
    the family, so the listing does not depend on which module happened to be imported first.
    """
    _load_families()
    if family is not None:
        check_choice("family", family, FAMILIES)
    names = [n for n, i in _REGISTRY.items() if family is None or i.family == family]
    return sorted(names, key=lambda n: FAMILIES.index(_REGISTRY[n].family))


def get_info(name: str) -> EncodingInfo:
    """The :class:`EncodingInfo` of ``name``; an unknown name lists the valid ones."""
    _load_families()
    if name not in _REGISTRY:
        raise ValueError(f"unknown encoding {name!r}; valid encodings: {', '.join(list_encodings())}")
    return _REGISTRY[name]


def build(
    name: str,
    *,
    d_model: int,
    num_heads: int,
    head_dim: int | None = None,
    **config: Any,
) -> PositionalEncoding:
    """Build encoding ``name`` for a model of width ``d_model`` and ``num_heads`` heads.

    ``head_dim`` defaults to ``d_model // num_heads``; remaining keyword arguments go to the
    encoding's config dataclass, which validates them.

    >>> enc = build("sinusoidal", d_model=64, num_heads=4, base=10000.0)
    """
    info = get_info(name)
    if head_dim is None:
        if num_heads < 1 or d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        head_dim = d_model // num_heads
    dims = Dims(d_model=d_model, num_heads=num_heads, head_dim=head_dim)
    return info.cls(info.cls.Config(**config), dims)
