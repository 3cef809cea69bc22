"""Multi-head attention that calls an encoding's hooks.

Shapes: x (B, T, C); q (B, H, Tq, D); k, v (B, Hkv, Tk, D); logits (B, H, Tq, Tk).

:class:`Attention`: projections, rotation, KV cache (:mod:`posenc.kv_cache`), then one call
into the backends (:func:`posenc.backends.run`: ``impl`` = eager / sdpa / flex / auto, the
path chosen by :func:`posenc.backends.plan`). The per-forward state it reads comes from
:mod:`posenc.context`. It holds no encoding in a model (the model owns them); a standalone
``Attention(..., pe=enc)`` owns ``enc`` as a submodule.
"""

from __future__ import annotations

from torch import Tensor, nn

from .backends import IMPLS, Impl, run
from .config import check_int
from .context import AttentionContext, EncodingState, layer_context
from .encoding import PositionalEncoding, QKProjection
from .kv_cache import KVCache
from .positions import SequenceInfo

__all__ = ["Attention"]


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
        ctx, encoding = layer_context(ctx, encoding, self.pe, causal=self.causal, cache=cache, owner="Attention",
                                      handle="attn")
        B, Tq, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        if ctx.q_seq.positions.shape[1] != Tq:
            raise ValueError(f"positions cover {ctx.q_seq.positions.shape[1]} tokens but x has {Tq}")
        src = x if context is None else context
        Tk = src.shape[1]
        q = self.q_proj(x).view(B, Tq, H, D).transpose(1, 2)  # (B, H, Tq, D)
        k = self.k_proj(src).view(B, Tk, Hkv, D).transpose(1, 2)  # (B, Hkv, Tk, D)
        v = self.v_proj(src).view(B, Tk, Hkv, D).transpose(1, 2)  # (B, Hkv, Tk, D)

        # Self-attention: the new keys sit at the query positions (the prepared state serves both).
        q, k = encoding.rotate(q, k, None if context is None else encoding.k_pos[..., -Tk:])
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, Hkv, Tcache + Tk, D)
            if k.shape[2] != ctx.mask.tk:
                raise ValueError(
                    f"cache layer {layer} holds {k.shape[2]} keys with this step's but the context describes "
                    f"{ctx.mask.tk}: after a standalone step, call cache.commit(ctx.k_seq, T) (the model does)"
                )
        if Hkv != H:
            k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, Tk, D)
            v = v.repeat_interleave(H // Hkv, dim=1)
        # The handle gives the encoding the input of the new keys and this layer's cache slot.
        memory = None if cache is None else cache.layer_state(layer)
        terms = encoding.layer_terms(q, k, v, QKProjection.of(self, src, memory))
        out = run(self.impl, q, k, v, scale=encoding.scale(D), mask=ctx.mask, terms=terms)  # (B, H, Tq, D)
        out = out.transpose(1, 2).reshape(B, Tq, H * D)  # (B, Tq, H*D)
        return self.o_proj(out)
