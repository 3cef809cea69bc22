"""The one interface every positional encoding implements.

An encoding can act at three places; attention and the model call whichever hooks an
encoding overrides and never branch on its name:

* ``embed``  — absolute family: change token embeddings (B, T, C) from their positions;
* ``rotate`` — rotary family: transform q (B, H, Tq, D) and k (B, Hkv, Tk, D);
* ``score``  — an additive term on the attention logits (B, H, Tq, Tk). Two flavours:
    - ``score_bias(q_pos, k_pos)``: content-independent (T5, ALiBi, KERPLE, FIRE). It is a
      function of positions only, so the model computes it once per forward and shares it
      across layers, and a fused kernel can take it as a bias;
    - ``score(q, k, q_pos, k_pos, scale)``: content-dependent (Shaw, Transformer-XL, DeBERTa).
  ``output(probs, v, q_pos, k_pos)`` lets a score-type encoding add a term to the attention
  output (Shaw et al.'s value vectors a^V).

``attention_scale(head_dim)`` sets the logit scale (DeBERTa divides by sqrt(d * (1 + n))).

Per-forward state: ``prepare(q_pos, k_pos)`` computes whatever depends on positions (and
parameters) only, such as RoPE's cos/sin tables or a relative scheme's distance layout. The
attention context calls it once per forward (once per decoding step) for each encoding module
and passes the result to every layer's ``rotate`` / ``score`` / ``output`` as ``state``, so
layers that share a module share the work, and no cache keyed on tensors is needed. Called
standalone (``state=None``), a hook prepares its own state.

Capabilities are read from which methods a subclass overrides (``has_embed`` and friends),
so attention stays a short, name-free piece of code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from .config import EncodingConfig, check_int
from .positions import SequenceInfo

__all__ = ["Dims", "PositionalEncoding"]


@dataclass(frozen=True)
class Dims:
    """Model dimensions an encoding may need: width C, heads H (query heads), head dim D."""

    d_model: int
    num_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        check_int("d_model", self.d_model, minimum=1)
        check_int("num_heads", self.num_heads, minimum=1)
        check_int("head_dim", self.head_dim, minimum=1)


class PositionalEncoding(nn.Module):
    """Base class. Subclasses set ``Config`` and override any subset of the hooks.

    Class attributes filled by :func:`posenc.registry.register`: ``name``, ``family``,
    ``summary``, ``paper``.
    """

    Config: ClassVar[type[EncodingConfig]] = EncodingConfig
    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    paper: ClassVar[str] = ""

    def __init__(self, config: EncodingConfig, dims: Dims) -> None:
        super().__init__()
        if not isinstance(config, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, got {type(config).__name__}")
        self.config = config
        self.dims = dims

    # ---- capabilities -------------------------------------------------------------------
    def _overrides(self, method: str) -> bool:
        return getattr(type(self), method) is not getattr(PositionalEncoding, method)

    @property
    def has_embed(self) -> bool:
        return self._overrides("embed")

    @property
    def has_rotate(self) -> bool:
        return self._overrides("rotate")

    @property
    def has_score_bias(self) -> bool:
        return self._overrides("score_bias")

    @property
    def has_score(self) -> bool:
        return self._overrides("score")

    @property
    def has_output(self) -> bool:
        return self._overrides("output")

    # ---- hooks ----------------------------------------------------------------------------
    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> Any:
        """Per-forward state for the hooks below, from query positions (B, Tq) and the
        positions of all keys attended to (B, Tk), cache included. Default: no state.

        In self-attention the caller passes the same tensor as ``q_pos`` for the keys that
        are new in this forward, so ``rotate(..., k_pos=q_pos)`` can reuse the query tables.
        """
        return None

    def embed(self, x: Tensor, seq: SequenceInfo, state: dict[str, Any] | None = None) -> Tensor:
        """Return embeddings (B, T, C) with position information.

        ``state`` is a dict owned by the KV cache, kept across decoding steps (recurrent and
        convolutional encodings keep their running context there); None without a cache.
        """
        return x

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: Any = None
    ) -> tuple[Tensor, Tensor]:
        """Return rotated (q, k): q (B, H, Tq, D) at q_pos (B, Tq), k (B, Hkv, Tk, D) at k_pos.

        ``k_pos`` are the positions of the keys being rotated (the new ones, not the cache);
        ``state`` is ``prepare``'s result for this forward, or None.
        """
        return q, k

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Content-independent logit bias, float32, shape (B or 1, H, Tq, Tk)."""
        raise NotImplementedError

    def score(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        scale: float,
        layer: nn.Module | None = None,
        state: Any = None,
    ) -> Tensor:
        """Content-dependent logit term (B, H, Tq, Tk) in logit units (already scaled).

        q (B, H, Tq, D); k (B, H, Tk, D), grouped-query heads already expanded. ``layer`` is
        the calling attention module (None when called standalone); an encoding that reuses
        the layer's own projections reads them there (DeBERTa's ``share_att_key`` projects
        its position table with the layer's ``q_proj``/``k_proj``). ``state``: see ``prepare``.
        """
        raise NotImplementedError

    def output(self, probs: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, state: Any = None) -> Tensor:
        """Additive term on the attention output (B, H, Tq, D) from probs (B, H, Tq, Tk)."""
        raise NotImplementedError

    def attention_scale(self, head_dim: int) -> float:
        """Multiplier of q·k in the logits."""
        return 1.0 / math.sqrt(head_dim)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config.to_dict().items())
