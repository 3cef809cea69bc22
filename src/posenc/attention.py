"""Multi-head attention that calls an encoding's hooks, with a KV cache, and the per-forward context.

Shapes: x (B, T, C); q (B, H, Tq, D); k, v (B, Hkv, Tk, D); logits (B, H, Tq, Tk).

Who owns what:

* :class:`AttentionContext` — one forward (one decoding step): the mask description
  (:class:`~posenc.masks.AttentionMask`) and, through :meth:`AttentionContext.prepare`, each
  encoding's :class:`EncodingState` (its ``prepare`` state and its content-independent bias
  with the dense forms memoized). The model builds both once per forward and passes a
  layer's ``EncodingState`` to that layer explicitly; nothing outlives the forward.
* :class:`Attention` — projections, rotation, KV cache, then one call into the backend table
  (:mod:`posenc.backends`: ``impl`` = eager / sdpa / flex / auto). It holds no encoding in a
  model (the model owns them); a standalone ``Attention(..., pe=enc)`` owns ``enc`` as a
  submodule.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from .backends import IMPLS, Impl, LayerTerms, SharedBias, logit_dtype, run
from .backends.sdpa import causal_sdpa_with_bias
from .config import check_int
from .encoding import PositionalEncoding, QKProjection, layer_terms
from .masks import AttentionMask, build_mask
from .positions import SequenceInfo
from .terms import DenseTerm

__all__ = [
    "Attention", "AttentionContext", "EncodingState", "KVCache", "LayerCache", "build_mask", "causal_sdpa_with_bias",
]

_logit_dtype = logit_dtype  # older name, kept for callers


class LayerCache:
    """Keys and values of one layer, (B, Hkv, T, D), after rotation.

    Stored in buffers with spare capacity along T that double when full, so appending one
    decoded token writes one slot instead of copying the whole cache (amortized O(1) per token,
    not O(T)). ``k``/``v`` are views of the filled part.
    """

    def __init__(self) -> None:
        self.kbuf: Tensor | None = None
        self.vbuf: Tensor | None = None
        self.n = 0

    @property
    def k(self) -> Tensor | None:
        return None if self.kbuf is None else self.kbuf[:, :, : self.n]

    @property
    def v(self) -> Tensor | None:
        return None if self.vbuf is None else self.vbuf[:, :, : self.n]

    def set(self, k: Tensor, v: Tensor) -> None:
        """Replace the contents (the sliding-memory and autograd paths)."""
        self.kbuf, self.vbuf, self.n = k, v, k.shape[2]

    def check(self, k: Tensor, v: Tensor, layer: int) -> None:
        """Raise ``ValueError`` unless k, v (B, Hkv, t, D) continue what this layer holds."""
        if self.kbuf is None:
            return
        (B, H, _, D), Dv = self.kbuf.shape, self.vbuf.shape[-1]
        if k.shape[0] != B:
            raise ValueError(
                f"batch size changed from {B} to {k.shape[0]} during decoding: a KVCache holds one "
                "batch; start a new cache (model.new_cache()) for another batch size"
            )
        if (k.shape[1], k.shape[3], v.shape[3]) != (H, D, Dv):
            raise ValueError(
                f"cache layer {layer} holds keys of {H} heads x {D} dims (values {Dv}) but this "
                f"attention makes {k.shape[1]} x {k.shape[3]} (values {v.shape[3]}): the cache was "
                "built for another model"
            )

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, Hkv, t, D) after the filled part, growing capacity by doubling."""
        need = self.n + k.shape[2]
        buf = self.kbuf
        if buf is None or need > buf.shape[2] or buf.dtype != k.dtype or buf.device != k.device:
            cap = max(need, 2 * (0 if buf is None else buf.shape[2]), 16)
            B, H, _, D = k.shape
            kbuf = k.new_empty(B, H, cap, D)  # (B, Hkv, capacity, D)
            vbuf = v.new_empty(B, H, cap, v.shape[-1])
            if self.n:
                kbuf[:, :, : self.n] = self.kbuf[:, :, : self.n]
                vbuf[:, :, : self.n] = self.vbuf[:, :, : self.n]
            self.kbuf, self.vbuf = kbuf, vbuf
        self.kbuf[:, :, self.n : need] = k
        self.vbuf[:, :, self.n : need] = v
        self.n = need
        return self.k, self.v


class KVCache:
    """Cache for incremental decoding and Transformer-XL style segment memory.

    Args:
        num_layers: one :class:`LayerCache` per layer.
        max_length: keep at most this many past tokens (a sliding memory); None keeps all.
        detach: store keys/values without gradient (Transformer-XL's memory).

    ``seq`` holds the positions/segments/validity of the cached tokens (shared by all layers);
    ``embed_state`` is where stateful ``embed`` hooks (recurrent, convolutional) keep context;
    ``prepare_memo`` where ``prepare_cached`` hooks keep what they computed from parameters and
    positions alone (Transformer-XL's projected distance rows), one dict per encoding module.
    Those entries assume the weights do not change while the cache is in use (one decoding run,
    without autograd); start a new cache after changing them.
    """

    def __init__(self, num_layers: int, max_length: int | None = None, detach: bool = False) -> None:
        check_int("num_layers", num_layers, minimum=1)
        if max_length is not None:
            check_int("max_length", max_length, minimum=1)
        if not isinstance(detach, bool):
            raise TypeError(f"detach must be a bool, got {type(detach).__name__} {detach!r}")
        self.layers = [LayerCache() for _ in range(num_layers)]
        self.max_length = max_length
        self.detach = detach
        self.seq: SequenceInfo | None = None
        self.seen = 0  # tokens processed so far (stream index of the next token)
        self.embed_state: dict = {}
        self.prepare_memo: dict = {}

    @property
    def batch_size(self) -> int | None:
        """Rows of the cached batch, or None while the cache is empty."""
        return None if self.seq is None else self.seq.positions.shape[0]

    def check_batch(self, batch: int) -> None:
        """Raise ``ValueError`` unless a step of ``batch`` rows may continue this cache."""
        if self.batch_size is not None and self.batch_size != batch:
            raise ValueError(
                f"this KVCache holds a batch of {self.batch_size} sequences but the new "
                f"tokens have batch size {batch}; start a new cache (model.new_cache()) for another batch"
            )

    @contextlib.contextmanager
    def atomic(self) -> Iterator["KVCache"]:
        """All or nothing: if the body raises, the cache is put back exactly as it was.

        A forward writes each layer's keys in turn; one that fails half way (a position past a
        learned table, in layer 2 of 4) would otherwise leave layers of different lengths, and
        the next, correct step would attend to a stale half-step. Appended slots are undone by
        resetting each layer's length (writes past it are never read); replaced tensors (the
        sliding-memory path) and the embed hooks' state entries are put back from references
        (both are replaced, never written in place).
        """
        layers = [(c, c.kbuf, c.vbuf, c.n) for c in self.layers]
        states = [(key, d, dict(d)) for key, d in self.embed_state.items()]
        seq, seen = self.seq, self.seen
        try:
            yield self
        except BaseException:
            for c, kbuf, vbuf, n in layers:
                c.kbuf, c.vbuf, c.n = kbuf, vbuf, n
            self.embed_state.clear()
            for key, d, content in states:
                d.clear()
                d.update(content)
                self.embed_state[key] = d
            self.seq, self.seen = seq, seen
            raise

    @property
    def length(self) -> int:
        return 0 if self.seq is None else self.seq.positions.shape[1]

    def keys_info(self, new: SequenceInfo) -> tuple[SequenceInfo, Tensor, Tensor]:
        """(k_seq, q_index, k_index) for a step adding ``new`` tokens; does not modify the cache."""
        device = new.positions.device
        t_new = new.positions.shape[1]
        q_index = torch.arange(self.seen, self.seen + t_new, device=device)
        k_index = torch.arange(self.seen - self.length, self.seen + t_new, device=device)
        if self.seq is None:
            return new, q_index, k_index
        self.check_batch(new.positions.shape[0])
        old = self.seq
        if (old.segment_ids is None) != (new.segment_ids is None) or (old.valid is None) != (new.valid is None):
            raise ValueError("a cached batch and its continuation must both have (or lack) segment_ids and valid")
        cat = lambda a, b: None if a is None else torch.cat([a, b], dim=1)  # noqa: E731
        k_seq = SequenceInfo._derived(
            cat(old.positions, new.positions), cat(old.segment_ids, new.segment_ids), cat(old.valid, new.valid)
        )
        return k_seq, q_index, k_index

    def commit(self, k_seq: SequenceInfo, t_new: int) -> None:
        """Record the step's key info (after all layers updated)."""
        keep = self._keep(k_seq.positions.shape[1])
        cut = lambda t: None if t is None else t[:, -keep:]  # noqa: E731
        self.seq = SequenceInfo._derived(cut(k_seq.positions), cut(k_seq.segment_ids), cut(k_seq.valid))
        self.seen += t_new

    def _keep(self, total: int) -> int:
        return total if self.max_length is None else min(total, self.max_length)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's k, v to layer ``layer``; return all keys/values to attend to."""
        if not 0 <= layer < len(self.layers):
            raise ValueError(f"layer must be in [0, {len(self.layers) - 1}] for a cache of {len(self.layers)} layers, got {layer}")
        c = self.layers[layer]
        c.check(k, v, layer)
        tracked = torch.is_grad_enabled() and (k.requires_grad or v.requires_grad)
        if self.max_length is None and not tracked:
            return c.append(k, v)
        # Sliding memory, or keys that carry gradient (in-place writes would break autograd).
        if c.kbuf is not None:
            k, v = torch.cat([c.k, k], dim=2), torch.cat([c.v, v], dim=2)
        keep = self._keep(k.shape[2])
        ck, cv = k[:, :, -keep:], v[:, :, -keep:]
        c.set(ck.detach(), cv.detach()) if self.detach else c.set(ck, cv)
        return k, v


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

    def rotate(self, q: Tensor, k: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``pe.rotate`` of the new q (B, H, Tq, D) and k (B, Hkv, t, D) at ``k_pos`` (B, t)."""
        if self.pe is None or not self.pe.has_rotate:
            return q, k
        return self.pe.rotate(q, k, self.q_pos, k_pos, state=self.state)

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
    result to the layers; a standalone :class:`Attention` prepares its own.
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

    def prepare(self, pe: PositionalEncoding | None, memo: dict | None = None) -> EncodingState:
        """``pe``'s state for this forward: ``pe.prepare(q_pos, k_pos)`` and its bias.

        ``memo``: the cache's dict for this encoding module (``KVCache.prepare_memo``) when the
        forward continues a cache without autograd; then ``pe.prepare_cached`` is called instead,
        which may reuse what earlier steps computed.
        """
        q_pos, k_pos = self.q_seq.positions, self.k_seq.positions
        if pe is None:
            return EncodingState(None, q_pos, k_pos)
        if not isinstance(pe, PositionalEncoding):
            raise TypeError(f"pe must be a PositionalEncoding or None, got {type(pe).__name__}")
        bias = None
        if pe._overrides("logit_bias"):
            bias = SharedBias(pe.logit_bias(), self.mask)
        elif pe.has_bias:  # an old-style score_bias override, taken as its dense tensor
            bias = SharedBias(DenseTerm(pe.score_bias(q_pos, k_pos)), self.mask)
        state = pe.prepare(q_pos, k_pos) if memo is None else pe.prepare_cached(q_pos, k_pos, memo)
        return EncodingState(pe, q_pos, k_pos, state, bias)


class Attention(nn.Module):
    """Multi-head (optionally grouped-query) attention with positional hooks.

    Args:
        d_model: model width C.
        num_heads: query heads H.
        num_kv_heads: key/value heads (grouped-query attention); defaults to H.
        pe: for standalone use, the encoding this layer owns (a submodule). In a
            :class:`~posenc.model.Transformer` the model owns the encodings and passes each
            layer's :class:`EncodingState` to ``forward`` instead.
        causal: causal (decoder) or bidirectional (encoder) self-attention.
        impl: the backend, one of "eager" (reference), "sdpa", "flex", "auto" (see
            :mod:`posenc.backends`).
        head_dim: defaults to C // H.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        pe: PositionalEncoding | None = None,
        *,
        causal: bool = True,
        impl: Impl = "sdpa",
        head_dim: int | None = None,
        bias: bool = False,
    ) -> None:
        super().__init__()
        check_int("d_model", d_model, minimum=1)
        check_int("num_heads", num_heads, minimum=1)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_int("num_kv_heads", num_kv_heads, minimum=1)
        if head_dim is not None:
            check_int("head_dim", head_dim, minimum=1)
        for name, flag in (("causal", causal), ("bias", bias)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})"
            )
        head_dim = d_model // num_heads if head_dim is None else head_dim
        if head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {head_dim}")
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}")
        if pe is not None and not isinstance(pe, PositionalEncoding):
            raise TypeError(f"pe must be a PositionalEncoding or None, got {type(pe).__name__}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.d_model, self.causal, self.impl = d_model, causal, impl
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=bias)
        self.pe = pe  # a registered submodule (or None): standalone use only

    def forward(
        self,
        x: Tensor,
        ctx: AttentionContext | SequenceInfo,
        *,
        encoding: EncodingState | None = None,
        context: Tensor | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> Tensor:
        """x (B, Tq, C) -> (B, Tq, C).

        ``ctx`` is an :class:`AttentionContext` (as the model passes) or just the queries'
        :class:`SequenceInfo` for standalone self-attention. ``encoding`` is this layer's
        :class:`EncodingState` from ``ctx.prepare(pe)`` (the model passes it); None prepares
        ``self.pe``'s. ``context`` (B, Tk, C) makes this cross-attention (give a context built
        with the keys' info).
        """
        for name, t in (("x", x), ("context", context)):
            if t is not None and (t.dim() != 3 or t.shape[-1] != self.d_model):
                raise ValueError(f"{name} must have shape (B, T, {self.d_model}), got {tuple(t.shape)}")
        if isinstance(ctx, SequenceInfo):
            ctx = AttentionContext.build(ctx, causal=self.causal, cache=cache)
        elif not isinstance(ctx, AttentionContext):
            raise TypeError(f"ctx must be an AttentionContext or a SequenceInfo, got {type(ctx).__name__}")
        if encoding is None:
            encoding = ctx.prepare(self.pe)
        elif not isinstance(encoding, EncodingState):
            raise TypeError(f"encoding must be an EncodingState (ctx.prepare(pe)) or None, got {type(encoding).__name__}")
        elif self.pe is not None and encoding.pe is not self.pe:
            raise ValueError("this Attention owns an encoding (pe=...); pass encoding=None or ctx.prepare(attn.pe)")
        B, Tq, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        if ctx.q_seq.positions.shape[1] != Tq:
            raise ValueError(f"positions cover {ctx.q_seq.positions.shape[1]} tokens but x has {Tq}")
        src = x if context is None else context
        Tk = src.shape[1]
        q = self.q_proj(x).view(B, Tq, H, D).transpose(1, 2)  # (B, H, Tq, D)
        k = self.k_proj(src).view(B, Tk, Hkv, D).transpose(1, 2)  # (B, Hkv, Tk, D)
        v = self.v_proj(src).view(B, Tk, Hkv, D).transpose(1, 2)  # (B, Hkv, Tk, D)

        # In self-attention the new keys sit exactly at the query positions: passing the same
        # tensor lets an encoding use its query tables for the keys too.
        q, k = encoding.rotate(q, k, encoding.q_pos if context is None else encoding.k_pos[:, -Tk:])
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, Hkv, Tcache + Tk, D)
        if Hkv != H:
            k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, Tk, D)
            v = v.repeat_interleave(H // Hkv, dim=1)
        terms = encoding.layer_terms(q, k, v, QKProjection.of(self))
        out = run(self.impl, q, k, v, scale=encoding.scale(D), mask=ctx.mask, terms=terms)  # (B, H, Tq, D)
        out = out.transpose(1, 2).reshape(B, Tq, H * D)  # (B, Tq, H*D)
        return self.o_proj(out)
