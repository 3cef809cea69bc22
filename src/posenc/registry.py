"""The registry: every encoding by name, with its config, summary, paper and literature claims.

Add an encoding with the :func:`register` class decorator in its family module; tests
parametrize over :func:`list_encodings`, so a new entry is tested automatically.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, TypeVar

from .config import EncodingConfig, check_choice, check_int, field_types
from .encoding import Dims, PositionalEncoding
from .literature import Claims, check_claims

__all__ = ["EncodingInfo", "register", "unregister", "build", "list_encodings", "get_info", "FAMILIES"]

FAMILIES = ("none", "absolute", "relative", "rotary")


@dataclass(frozen=True)
class EncodingInfo:
    name: str
    cls: type[PositionalEncoding]
    family: str
    summary: str
    paper: str
    # check -> (expected, source): what the literature claims (see posenc.literature)
    claims: Claims = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def config_cls(self) -> type:
        return self.cls.Config

    @property
    def config_keys(self) -> tuple[str, ...]:
        """The parameters the encoding's config takes, in declaration order: its dataclass
        fields, or what its ``config_keys()`` classmethod lists when it has one (RoPE: its
        fields and every registered scaling's parameters)."""
        own = getattr(self.config_cls, "config_keys", None)
        return tuple(own()) if callable(own) else tuple(field_types(self.config_cls))

    def make_config(self, config: Mapping[str, Any]) -> EncodingConfig:
        """The encoding's typed config from a mapping of parameters.

        An unknown key is a ``TypeError`` naming it, the encoding and the valid keys (the
        dataclass constructor alone would not list them); values are type- and range-checked
        by the config itself.
        """
        if not isinstance(config, Mapping):
            raise TypeError(f"config of encoding {self.name!r} must be a mapping of parameters, "
                            f"got {type(config).__name__} {config!r}")
        keys = self.config_keys
        for k in config:
            if not isinstance(k, str):
                raise TypeError(f"config keys of encoding {self.name!r} must be str, got {type(k).__name__} {k!r}")
        unknown = [k for k in config if k not in keys]
        if unknown:
            valid = ", ".join(keys) if keys else "none (it takes no parameters)"
            raise TypeError(
                f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                f"for encoding {self.name!r}; valid keys: {valid}"
            )
        return self.config_cls(**config)


_REGISTRY: dict[str, EncodingInfo] = {}

E = TypeVar("E", bound=type[PositionalEncoding])


def register(name: str, *, family: str, summary: str, paper: str, claims: Claims | None = None) -> Callable[[E], E]:
    """Class decorator: ``@register("alibi", family="relative", summary=..., paper=..., claims=...)``.

    ``claims`` says what the literature claims per check of ``posenc check`` (see
    :mod:`posenc.literature`); without it every measured cell reads "no claim".
    """
    check_choice("family", family, FAMILIES)
    claims = check_claims(name, {} if claims is None else claims)

    def deco(cls: E) -> E:
        if name in _REGISTRY:
            raise ValueError(f"encoding {name!r} is already registered")
        cls.name, cls.family, cls.summary, cls.paper = name, family, summary, paper
        _REGISTRY[name] = EncodingInfo(name, cls, family, summary, paper, claims)
        return cls

    return deco


def unregister(name: str) -> EncodingInfo:
    """Remove encoding ``name`` from the registry and return its entry (a test's or a plugin's
    temporary encoding; registering the name again is then allowed). An unknown name lists the
    registered ones."""
    info = get_info(name)
    del _REGISTRY[name]
    return info


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
    if not isinstance(name, str):
        raise TypeError(
            f"encoding name must be a str (one of: {', '.join(list_encodings())}), got {type(name).__name__} {name!r}"
        )
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
    encoding's config dataclass, which checks their types and ranges. An unknown keyword is a
    ``TypeError`` that lists the encoding's valid keys.

    >>> enc = build("sinusoidal", d_model=64, num_heads=4, base=10000.0)
    """
    info = get_info(name)
    # Checked here, before any arithmetic: d_model=64.0 or num_heads="4" must not reach
    # `d_model % num_heads` or a tensor shape.
    check_int("d_model", d_model, minimum=1)
    check_int("num_heads", num_heads, minimum=1)
    if head_dim is None:
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        head_dim = d_model // num_heads
    check_int("head_dim", head_dim, minimum=1)
    dims = Dims(d_model=d_model, num_heads=num_heads, head_dim=head_dim)
    return info.cls(info.make_config(config), dims)
