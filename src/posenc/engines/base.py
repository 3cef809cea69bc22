"""What an inference engine computes as RoPE from one model file: :class:`EngineRope`, and the
registry of engines' rules (:func:`register_engine`, :data:`ENGINES`).

The same config.json means different RoPEs in different engines: each re-derives the
frequencies and the attention factor from the file with its own code, and they disagree on
keys (``type`` vs ``rope_type``), on defaults (which length YaRN is relative to), on formulas
(DeepSeek's ``mscale_all_dim``) and on what happens past the original length (vLLM's
"dynamic" NTK is static). A *rule* is one engine's reading, re-derived from its source and
cited by file and version: ``rule(config) -> list[EngineRope]``, one entry per layer type that
rotates. The rules are pure functions of the parsed config.json (a .gguf is read into one
first, see :mod:`posenc.engines.files`), so any engine's reading can be computed here without
the engine installed: that is the point, since vLLM and SGLang need CUDA builds.

Conventions, shared with :mod:`posenc.rotary`: ``inv_freq`` is float64 theta_i of the rotated
pairs (length ``rotary_dim / 2``); ``attention_factor`` multiplies cos and sin (logits carry its
square); ``softmax_scale`` multiplies the attention's 1/sqrt(d) (DeepSeek's YaRN mscale^2),
so the logits of a (q, k) pair at distance m are scaled by
``attention_factor**2 * softmax_scale`` and rotated by ``m * inv_freq``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import torch
from torch import Tensor

__all__ = ["ENGINES", "EngineRope", "EngineRule", "Unsupported", "engine_names", "engine_rule", "register_engine"]

#: what a rope does past the length the checkpoint was trained at: the same frequencies
#: (static), frequencies recomputed from the current sequence length (dynamic), or a second
#: set of frequencies used once the sequence is longer than ``switch_at`` (switch: LongRoPE)
Beyond = Literal["static", "dynamic", "switch"]


class Unsupported(ValueError):
    """An engine cannot run this file as written (it refuses it, or has no such scaling): the
    message is the one line to show, naming the nearest the engine can do where there is one."""


@dataclass(frozen=True)
class EngineRope:
    """One engine's RoPE for one layer type of one file.

    ``layer_type``: None when every rotating layer shares it, else the config's layer type
    (``"full_attention"``, ``"sliding_attention"``). ``layers``: the decoder layers that use it
    (None: all). ``layout``: ``"half"`` (rotate_half, GPT-NeoX) or ``"interleaved"`` (GPT-J).
    ``at_length``: for ``beyond="dynamic"`` or ``"switch"``, ``n -> (inv_freq, attention_factor)``
    for a sequence of ``n`` tokens; None for static. ``notes``: what this engine does with the
    file that a user would not guess (a key ignored, a default taken), one short line each.
    ``source``: the file(s) and version the rule was derived from.
    """

    engine: str
    inv_freq: Tensor
    attention_factor: float = 1.0
    softmax_scale: float = 1.0
    rotary_dim: int = 0
    layout: Literal["half", "interleaved"] = "half"
    beyond: Beyond = "static"
    switch_at: int | None = None
    at_length: Callable[[int], tuple[Tensor, float]] | None = field(default=None, compare=False, repr=False)
    layer_type: str | None = None
    layers: tuple[int, ...] | None = None
    notes: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        inv = torch.as_tensor(self.inv_freq, dtype=torch.float64)
        if inv.ndim != 1 or inv.numel() == 0:
            raise ValueError(f"inv_freq must be a non-empty 1-D vector, got shape {tuple(inv.shape)}")
        object.__setattr__(self, "inv_freq", inv)
        if not self.rotary_dim:
            object.__setattr__(self, "rotary_dim", 2 * inv.numel())
        if self.rotary_dim != 2 * inv.numel():
            raise ValueError(f"rotary_dim {self.rotary_dim} != 2 * len(inv_freq) = {2 * inv.numel()}")
        if self.layout not in ("half", "interleaved"):
            raise ValueError(f"layout must be 'half' or 'interleaved', got {self.layout!r}")
        if self.beyond not in ("static", "dynamic", "switch"):
            raise ValueError(f"beyond must be 'static', 'dynamic' or 'switch', got {self.beyond!r}")
        if (self.beyond != "static") != (self.at_length is not None):
            raise ValueError("at_length is required for beyond='dynamic'/'switch' and only then")
        if self.beyond == "switch" and self.switch_at is None:
            raise ValueError("beyond='switch' needs switch_at (the length past which the long factors apply)")

    def frequencies(self, length: int | None = None) -> tuple[Tensor, float]:
        """``(inv_freq, attention_factor)`` for a sequence of ``length`` tokens (None: the
        frequencies below the original length)."""
        if length is None or self.at_length is None:
            return self.inv_freq, self.attention_factor
        inv, factor = self.at_length(int(length))
        return torch.as_tensor(inv, dtype=torch.float64), float(factor)

    def logit_scale(self, length: int | None = None) -> float:
        """What this RoPE multiplies every logit by: attention_factor^2 * softmax_scale."""
        return self.frequencies(length)[1] ** 2 * self.softmax_scale


#: ``rule(config) -> [EngineRope, ...]``: one per rotating layer type; raises
#: :class:`Unsupported` when the engine cannot run the file, ValueError/TypeError on a bad file
EngineRule = Callable[[Mapping[str, Any]], list[EngineRope]]


@dataclass(frozen=True)
class _Entry:
    name: str
    rule: EngineRule
    version: str
    summary: str


ENGINES: dict[str, _Entry] = {}


def register_engine(name: str, *, version: str, summary: str) -> Callable[[EngineRule], EngineRule]:
    """Register ``rule`` as engine ``name``'s reading of a config (``version``: the engine
    release the rule was derived from; ``summary``: one line for ``posenc rope``)."""

    def wrap(rule: EngineRule) -> EngineRule:
        if name in ENGINES:
            raise ValueError(f"engine {name!r} is already registered")
        ENGINES[name] = _Entry(name, rule, version, summary)
        return rule

    return wrap


def engine_names() -> list[str]:
    """The registered engines, transformers first (the reference the others are compared with)."""
    return sorted(ENGINES, key=lambda n: (n != "transformers", n))


def engine_rule(name: str) -> EngineRule:
    try:
        return ENGINES[name].rule
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(engine_names())}") from None
