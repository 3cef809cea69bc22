"""Training-free long-context methods that change attention, not only RoPE's angles: Self-Extend,
ReRoPE / leaky ReRoPE, Dual Chunk Attention (torch only; the transformers integration is ``posenc.hf.methods``).

>>> method = build_method("self_extend", group_size=8, neighbor_window=1024)
>>> out = method_attention(q, k, v, method, q_pos, k_pos, rope.inv_freq)   # q, k unrotated
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import AttentionMethod
from .blockwise import block_rows_for, method_attention
from .dual_chunk import DualChunk
from .rerope import ReRoPE
from .self_extend import SelfExtend

__all__ = ["METHODS", "AttentionMethod", "block_rows_for", "build_method", "method_attention", "method_params"]

#: name -> method class; its dataclass fields are the method's parameters.
METHODS: dict[str, type[AttentionMethod]] = {cls.name: cls for cls in (SelfExtend, ReRoPE, DualChunk)}


def method_params(name: str) -> tuple[str, ...]:
    """The parameter names of method ``name`` (its dataclass fields)."""
    return tuple(f.name for f in dataclasses.fields(METHODS[name]))


def build_method(name: str, **params: Any) -> AttentionMethod:
    """The method ``name`` with ``params``; unknown names and keys are a ``ValueError`` listing
    the valid ones, missing parameters a ``ValueError`` naming them."""
    if name not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}; got {name!r}")
    valid = method_params(name)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(f"method {name!r} takes {', '.join(valid)}; got unknown {', '.join(unknown)}")
    required = [f.name for f in dataclasses.fields(METHODS[name])
                if f.default is dataclasses.MISSING and f.name not in params]
    if required:
        raise ValueError(f"method {name!r} needs {', '.join(required)} (no default: the right value depends on "
                         f"the checkpoint's trained length)")
    return METHODS[name](**params)
