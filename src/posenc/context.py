"""The per-forward context of attention: the mask and each encoding's prepared state.

Shapes: positions (B, T); q (B, H, Tq, D); k, v (B, Hkv, Tk, D).

:class:`AttentionContext` lives one forward (one decoding step): the mask description
(:class:`~posenc.masks.AttentionMask`) and, through :meth:`AttentionContext.prepare`, each
encoding's :class:`EncodingState` (its ``prepare`` state and its content-independent bias
with the dense forms memoized). The model builds both once per forward and passes a layer's
``EncodingState`` to that layer explicitly; nothing outlives the forward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from .backends import LayerTerms, SharedBias
from .encoding import PositionalEncoding, QKProjection, layer_terms
from .kv_cache import KVCache
from .masks import AttentionMask
from .positions import SequenceInfo

__all__ = ["AttentionContext", "EncodingState", "layer_context"]


@dataclass(eq=False)
class EncodingState:
    """One encoding module in one forward: its ``prepare`` state and its bias.

    Made by :meth:`AttentionContext.prepare` once per forward per module; every layer that uses
    the module gets the same object, so they share the state and the bias's dense forms.
    ``pe=None`` is the state of "no encoding" (identity rotation, no terms).
    """

    pe: PositionalEncoding | None
    q_pos: Tensor
    k_pos: Tensor
    state: Any = None
    bias: SharedBias | None = None

    def scale(self, head_dim: int) -> float:
        """Multiplier of q·kᵀ."""
        return head_dim**-0.5 if self.pe is None else self.pe.attention_scale(head_dim)

    def rotate(self, q: Tensor, k: Tensor, k_pos: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``pe.rotate`` of the new q (B, H, Tq, D) and k (B, Hkv, t, D).

        ``k_pos`` None: the new keys sit at the query positions (self-attention), and the
        prepared state serves q and k. Keys at other positions ``k_pos`` (B, t) or (A, B, t) (cross-attention)
        are rotated without it: the state describes keys at the query positions only.
        """
        if self.pe is None or not self.pe.has_rotate:
            return q, k
        if k_pos is None:
            return self.pe.rotate(q, k, self.q_pos, self.q_pos, state=self.state)
        return self.pe.rotate(q, k, self.q_pos, k_pos, state=None)

    def under(self, mask: AttentionMask) -> "EncodingState":
        """This state for layers attending under another ``mask`` (a sliding-window or chunked
        layer of the same forward): the ``prepare`` state is shared; the bias gets its own
        masked forms (its dense table is computed once more for this mask)."""
        if self.bias is None or self.bias.mask is mask:
            return self
        return dataclasses.replace(self, bias=SharedBias(self.bias.term, mask))

    def layer_terms(self, q: Tensor, k: Tensor, v: Tensor, proj: QKProjection) -> LayerTerms:
        """The layer's terms: the shared bias plus ``pe.terms(q, k, state, proj)``."""
        terms = [] if self.pe is None else layer_terms(self.pe, q, k, self.state, proj)
        return LayerTerms.of(self.q_pos, self.k_pos, self.bias, terms)


@dataclass(eq=False)
class AttentionContext:
    """Everything attention needs that depends on positions only, for one forward.

    ``mask`` describes which keys each query sees (its dense form, ``plain_causal`` and
    FlexAttention ``BlockMask`` are memoized in it); :meth:`prepare` makes an encoding's
    :class:`EncodingState`. The model calls ``prepare`` once per encoding module and passes the
    result to the layers; a standalone :class:`~posenc.attention.Attention` prepares its own.
    """

    mask: AttentionMask

    @property
    def q_seq(self) -> SequenceInfo:
        return self.mask.q_seq

    @property
    def k_seq(self) -> SequenceInfo:
        return self.mask.k_seq

    @property
    def plain_causal(self) -> bool:
        return self.mask.plain_causal

    @classmethod
    def build(
        cls,
        q_seq: SequenceInfo,
        k_seq: SequenceInfo | None = None,
        *,
        causal: bool,
        cache: KVCache | None = None,
    ) -> "AttentionContext":
        """Context for queries ``q_seq`` attending to ``k_seq`` (self-attention when None).

        With a ``cache``, keys are the cached tokens followed by ``q_seq`` (call
        ``cache.commit`` after the forward). Without one, queries are aligned to the end of
        the keys, so causal cross-attention with Tq < Tk behaves as decoding would.
        """
        if cache is not None:
            if k_seq is not None:
                raise ValueError("k_seq must be None when a cache is given (keys come from the cache)")
            k_seq, _, _ = cache.keys_info(q_seq)
        return cls(AttentionMask.build(q_seq, k_seq, causal=causal))

    def local(self, window: int | None = None, chunk: int | None = None) -> "AttentionContext":
        """This forward's context for layers restricted to a sliding ``window`` or a position
        ``chunk`` (:class:`~posenc.masks.AttentionMask`); itself when both are None."""
        if window is None and chunk is None:
            return self
        m = self.mask
        return AttentionContext(AttentionMask.build(m.q_seq, m.k_seq, causal=m.causal, window=window, chunk=chunk))

    def prepare(self, pe: PositionalEncoding | None, memo: dict | None = None) -> EncodingState:
        """``pe``'s state for this forward: ``pe.prepare(q_pos, k_pos)`` and its bias.

        ``memo``: the cache's dict for this encoding module (``KVCache.prepare_memo``) when the
        forward continues a cache without autograd; then ``pe.prepare_cached`` and
        ``pe.logit_bias_cached`` are called instead, which may reuse what earlier steps computed.
        """
        if pe is None:
            return EncodingState(None, self.q_seq.positions, self.k_seq.positions)
        if not isinstance(pe, PositionalEncoding):
            raise TypeError(f"pe must be a PositionalEncoding or None, got {type(pe).__name__}")
        q_pos, k_pos = pe.position_ids(self.q_seq), pe.position_ids(self.k_seq)  # (B, T), or (A, B, T) multi-axis
        if memo is None:
            bias = SharedBias(pe.logit_bias(), self.mask) if pe.has_bias else None
            state = pe.prepare(q_pos, k_pos)
        else:
            bias = SharedBias(pe.logit_bias_cached(q_pos, k_pos, memo), self.mask) if pe.has_bias else None
            state = pe.prepare_cached(q_pos, k_pos, memo)
        return EncodingState(pe, q_pos, k_pos, state, bias)


def layer_context(
    ctx: AttentionContext | SequenceInfo, encoding: EncodingState | None, pe: PositionalEncoding | None, *,
    causal: bool, cache: KVCache | None, owner: str, handle: str,
) -> tuple[AttentionContext, EncodingState]:
    """The context and encoding state an attention layer's forward runs with, from what it was
    given: ``ctx`` an :class:`AttentionContext` (as the model passes) or the queries'
    :class:`SequenceInfo` (standalone: a context built here, ``causal``, with ``cache``);
    ``encoding`` the layer's :class:`EncodingState` (``ctx.prepare(pe)``), or None to prepare
    the layer's own ``pe``. ``owner`` and ``handle`` name the layer in the error for a state
    of another encoding than the one it owns (``ctx.prepare(<handle>.pe)``)."""
    if isinstance(ctx, SequenceInfo):
        ctx = AttentionContext.build(ctx, causal=causal, cache=cache)
    elif not isinstance(ctx, AttentionContext):
        raise TypeError(f"ctx must be an AttentionContext or a SequenceInfo, got {type(ctx).__name__}")
    if encoding is None:
        return ctx, ctx.prepare(pe)
    if not isinstance(encoding, EncodingState):
        raise TypeError(f"encoding must be an EncodingState (ctx.prepare(pe)) or None, got {type(encoding).__name__}")
    if pe is not None and encoding.pe is not pe:
        raise ValueError(f"this {owner} owns an encoding (pe=...); pass encoding=None or ctx.prepare({handle}.pe)")
    return ctx, encoding
