"""RoPE frequency scalings: the registry, :data:`SCALINGS`, complete once this package is imported.

Notation: d = rotary_dim (even), i = 0 .. d/2 - 1 indexes the rotated pairs,
theta_i = base^(-2i/d) the base inverse frequencies (radians per position), L the trained
context length (``original_max_position_embeddings``), s = ``factor``.

Each scaling is one :class:`~.schema.Scaling` entry (:mod:`.schema`: its typed config, its pure
function ``fn(inv_freq_base, cfg, *, base, seq_len=None) -> (inv_freq, attention_factor)``,
its display label, its transformers spelling and its rule for "this scaling at factor f for a
model trained at L"). The built-in entries live one module each beside this one (:mod:`.plain`,
:mod:`.ntk`, :mod:`.ntk_alpha`, :mod:`.yarn`, :mod:`.llama3`, :mod:`.longrope`, :mod:`.proportional`,
:mod:`.hope`, :mod:`.clipped`) and are registered here, in :data:`BUILTIN` order; :func:`register_scaling` adds
another. Everything else is derived from the entries: the parameters ``RotaryConfig`` accepts,
``from_hf`` / ``to_hf``, the scalings ``posenc bench``, ``posenc bench --model`` and
``posenc probe`` evaluate and how they set them, the labels of their tables and figures, the
``rope-scaling`` plot, :data:`ROPE_SCALINGS` and :data:`SCALING_CONFIGS` (read-only views).

The semantics match ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (tested
against it); the differences are typed configs that fail loudly instead of warnings, float64
frequencies, a static ``ntk`` type, and a ``dynamic`` type with no hidden state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ...config import check_choice, check_even, check_positive
from .clipped import CLIPPED
from .hope import HOPE
from .llama3 import LLAMA3
from .longrope import LONGROPE
from .ntk import DYNAMIC, NTK
from .ntk_alpha import NTK_ALPHA
from .plain import DEFAULT, LINEAR
from .proportional import PROPORTIONAL
from .schema import Scaling, ScalingConfig, ScalingFn
from .yarn import YARN

__all__ = [
    "BUILTIN",
    "ROPE_SCALINGS",
    "SCALING_CONFIGS",
    "SCALINGS",
    "all_scaling_params",
    "base_inv_freq",
    "get_scaling",
    "list_scalings",
    "make_scaling_config",
    "register_scaling",
    "rope_frequencies",
    "unregister_scaling",
]

#: The built-in scalings, in the order listings, tables and figures show them.
BUILTIN: tuple[Scaling, ...] = (DEFAULT, LINEAR, NTK, DYNAMIC, NTK_ALPHA, YARN, LLAMA3, LONGROPE, PROPORTIONAL,
                                 HOPE, CLIPPED)


def base_inv_freq(rotary_dim: int, base: float) -> Tensor:
    """theta_i = base^(-2i/d) for i < d/2, float64 (Su et al. 2021, RoFormer, eq. 15)."""
    check_even("rotary_dim", rotary_dim)
    check_positive("base", base)
    if base == 1.0:
        raise ValueError("base must be != 1 (every pair would rotate at the same rate), got 1.0")
    i = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return float(base) ** (-i / rotary_dim)  # (d/2,)


#: rope type -> its :class:`Scaling` entry. Add one with :func:`register_scaling`.
SCALINGS: dict[str, Scaling] = {}


def register_scaling(entry: Scaling) -> Scaling:
    """Add a scaling type: ``RotaryConfig``, ``set_scaling``, ``rope_frequencies``, ``from_hf`` /
    ``to_hf`` (when ``entry.hf`` is set), the probe and the bench (when ``entry.extension`` is
    set), their labels and the ``rope-scaling`` plot take it from here; nothing else needs
    editing. A name already registered is an error; :func:`unregister_scaling` removes it."""
    if not isinstance(entry, Scaling):
        raise TypeError(f"entry must be a Scaling, got {type(entry).__name__}")
    if entry.name in SCALINGS:
        raise ValueError(f"rope type {entry.name!r} is already registered")
    if entry.hf is not None:
        taken = {e.hf.rope_type: n for n, e in SCALINGS.items() if e.hf is not None}
        if entry.hf.rope_type in taken:
            raise ValueError(f"HF rope_type {entry.hf.rope_type!r} already reads as {taken[entry.hf.rope_type]!r}")
    SCALINGS[entry.name] = entry
    return entry


def unregister_scaling(name: str) -> Scaling:
    """Remove the scaling ``name`` (one a test or plugin registered) and return its entry."""
    return SCALINGS.pop(get_scaling(name).name)


for _entry in BUILTIN:
    register_scaling(_entry)
del _entry


class _View(Mapping):
    """A read-only, always current view of one attribute of every entry of SCALINGS."""

    def __init__(self, attr: str, doc: str) -> None:
        self._attr, self.__doc__ = attr, doc

    def __getitem__(self, name: str) -> Any:
        return getattr(SCALINGS[name], self._attr)

    def __iter__(self):
        return iter(SCALINGS)

    def __len__(self) -> int:
        return len(SCALINGS)

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: {v!r}' for k, v in self.items())}}}"


#: rope type -> pure function ``fn(inv_freq_base, cfg, *, base, seq_len=None) -> (inv_freq, attention_factor)``.
ROPE_SCALINGS: Mapping[str, ScalingFn] = _View("fn", "rope type -> its pure frequency function")
#: rope type -> its typed config class.
SCALING_CONFIGS: Mapping[str, type[ScalingConfig]] = _View("config", "rope type -> its typed config class")


def list_scalings(*, extends: bool = False, training_free: bool = False) -> list[str]:
    """The registered rope types, in registration order.

    ``extends=True``: those with an ``extension`` rule (``posenc probe`` draws them; the
    choices of ``--scalings``). ``training_free=True``: those of them ``posenc bench``
    evaluates by default (``Scaling.bench``)."""
    return [n for n, e in SCALINGS.items()
            if (not (extends or training_free) or e.extension is not None) and (not training_free or e.bench)]


def all_scaling_params() -> tuple[str, ...]:
    """Every parameter some registered rope type takes (for listings and error messages)."""
    seen: dict[str, None] = {}
    for e in SCALINGS.values():
        seen.update(dict.fromkeys(e.params))
    return tuple(seen)


def get_scaling(rope_type: Any) -> Scaling:
    """The entry of ``rope_type``; an unknown one lists the registered types."""
    if not isinstance(rope_type, str):
        raise TypeError(f"scaling must be a str (one of {', '.join(map(repr, SCALINGS))}), "
                        f"got {type(rope_type).__name__} {rope_type!r}")
    check_choice("scaling", rope_type, SCALINGS)
    return SCALINGS[rope_type]


def make_scaling_config(rope_type: str, **params: Any) -> ScalingConfig:
    """The typed config of ``rope_type`` from keyword parameters.

    A parameter the type does not take is a ``ValueError`` listing the ones it does.
    """
    entry = get_scaling(rope_type)
    extra = [k for k in params if k not in entry.params]
    if extra:
        raise ValueError(
            f"{', '.join(map(str, extra))} not a parameter of rope type {rope_type!r} "
            f"(it takes: {', '.join(entry.params) or 'nothing'})"
        )
    return entry.config(**params)


def rope_frequencies(
    rope_type: str, rotary_dim: int, base: float, seq_len: int | None = None, **params: Any
) -> tuple[Tensor, float]:
    """``(inv_freq (rotary_dim/2,) float64, attention_factor)`` of a rope type.

    >>> inv_freq, af = rope_frequencies("yarn", 64, 10000.0, factor=4.0, original_max_position_embeddings=2048)
    """
    cfg = make_scaling_config(rope_type, **params)
    inv_freq = base_inv_freq(rotary_dim, base)
    return SCALINGS[rope_type].fn(inv_freq, cfg, base=float(base), seq_len=seq_len)
