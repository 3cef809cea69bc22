"""The one interface every positional encoding implements.

An encoding can act at three places; attention and the model call whichever hooks an
encoding overrides and never branch on its name:

* ``embed``  — absolute family: change token embeddings (B, T, C) from their positions;
* ``rotate`` — rotary family: transform q (B, H, Tq, D) and k (B, Hkv, Tk, D);
* logit terms (:mod:`posenc.terms`) — the relative family. Two hooks:
    - ``logit_bias()`` -> :class:`~posenc.terms.BiasTerm`: content-independent (T5, ALiBi, KERPLE,
      FIRE), one pointwise function of (head, q_pos, k_pos). The model's per-forward context
      takes it once per forward; each backend derives the form it needs (dense table,
      Toeplitz table, FlexAttention ``score_mod``) from that one definition;
    - ``terms(q, k, state, proj)`` -> list of :class:`~posenc.terms.TableTerm` /
      :class:`~posenc.terms.ValueTerm`: content-dependent (Shaw, relative_key, Transformer-XL,
      DeBERTa, CoPE, FoX), called per layer with that layer's q, k and projections (``proj``, a
      :class:`QKProjection`: the encoding never reaches into the layer; it also carries the
      layer's input and the layer's KV-cache slot, which FoX's forget gates read).

``attention_scale(head_dim)`` sets the logit scale (DeBERTa divides by sqrt(d * (1 + n))).

``score_bias``, ``score`` and ``output`` are dense conveniences derived from those two hooks
(for standalone use and tests); encodings do not override them.

Per-forward state: ``prepare(q_pos, k_pos)`` computes whatever depends on positions (and
parameters) only, such as RoPE's cos/sin tables or a relative scheme's distance layout. The
model's per-forward context calls it once per forward (once per decoding step) for each
encoding module and passes the result to every layer's ``rotate`` / ``terms`` as ``state``,
so layers that share a module share the work, and no cache keyed on tensors is needed.

Capabilities are read from which methods a subclass overrides (``has_embed``, ``has_bias``
and friends), so attention stays a short, name-free piece of code. An encoding whose term
kinds depend on its config (Shaw's ``use_value``) overrides the flag properties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .config import EncodingConfig, check_int
from .positions import SequenceInfo
from .terms import BiasTerm, TableTerm, Term, ValueTerm, dense_logit_terms

__all__ = ["Dims", "PositionalEncoding", "QKProjection", "cached_entry", "layer_input", "layer_terms"]


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


@dataclass(frozen=True, eq=False)
class QKProjection:
    """The calling layer as a content-dependent encoding sees it: its projections, its input and
    its slot in the KV cache.

    DeBERTa-v2's ``share_att_key`` projects its position table with the layer's projections;
    this object hands those over explicitly, so an encoding never reads attributes of the layer.
    ``query(x)``/``key(x)``: (N, C) -> (H, N, D); grouped-query key heads are repeated to H.

    ``x``: the layer's input (B, t, C) of this call's new keys (the queries' tokens in
    self-attention, the context in cross-attention; FoX computes its forget gates from it);
    None standalone. ``memory``: the KV cache's dict for this layer (``KVCache.layer_state``), where
    an encoding keeps per-key state of the cached tokens across decoding steps (FoX's prefix
    sums); None without a cache. Its entries are replaced, never written in place, so
    ``KVCache.atomic`` can put them back.
    """

    q_proj: nn.Module
    k_proj: nn.Module
    num_heads: int
    num_kv_heads: int
    head_dim: int
    x: Tensor | None = None
    memory: dict[str, Any] | None = None

    @classmethod
    def of(cls, layer: nn.Module, x: Tensor | None = None, memory: dict[str, Any] | None = None) -> "QKProjection":
        """The projections of an attention layer (``q_proj``, ``k_proj`` and its head counts),
        with its input ``x`` and cache slot ``memory`` when given."""
        return cls(layer.q_proj, layer.k_proj, layer.num_heads, layer.num_kv_heads, layer.head_dim, x, memory)

    def query(self, x: Tensor) -> Tensor:
        """(N, C) -> (H, N, D) with the layer's query projection."""
        return self.q_proj(x).view(x.shape[0], self.num_heads, self.head_dim).transpose(0, 1)

    def key(self, x: Tensor) -> Tensor:
        """(N, C) -> (H, N, D) with the layer's key projection (kv heads repeated to H)."""
        k = self.k_proj(x).view(x.shape[0], self.num_kv_heads, self.head_dim).transpose(0, 1)  # (Hkv, N, D)
        return k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=0)  # (H, N, D)


def layer_input(proj: "QKProjection | None", name: str, reads: str, q: Tensor, k: Tensor, d_model: int) -> Tensor:
    """``proj.x``, the layer input (B, t, C) of a call's t new keys, for an encoding whose terms
    read it (``name`` computes its ``reads`` from it: FoX's forget gates, PaTH's Householders);
    a ValueError naming ``name`` when it is missing or its shape does not fit q (B, H, Tq, D)
    and k (B, H, Tk, D): Tq <= t <= Tk, the queries being the last of the keys."""
    x = None if proj is None else proj.x
    B, Tq, Tk = q.shape[0], q.shape[2], k.shape[2]
    if x is None:
        raise ValueError(
            f"{name} computes its {reads} from the attention layer's input: call it through "
            "posenc.Attention, or pass proj=QKProjection.of(layer, x)"
        )
    if x.dim() != 3 or x.shape[0] != B or not Tq <= x.shape[1] <= Tk or x.shape[2] != d_model:
        raise ValueError(f"{name}'s layer input must have shape ({B}, t, {d_model}) for the call's t new keys, "
                         f"{Tq} <= t <= {Tk} (the queries are the last of the keys), got {tuple(x.shape)}")
    return x


def cached_entry(proj: "QKProjection | None", key: str, t: int, tk: int, dim: int, name: str, needs: str,
                 held_as: str) -> tuple[dict | None, Tensor | None, int, int]:
    """(memory, past, cached, held) of an encoding whose terms keep per-key state in the KV
    cache: ``memory`` the layer's dict (``proj.memory``, None without a cache), ``past`` its
    ``key`` entry (None when empty), ``cached = tk - t`` the keys of this call not among its t
    new ones, ``held`` how many keys ``past`` holds along ``dim``. A ValueError naming ``name``
    when the call needs more cached keys than ``past`` holds (``needs``: what of every key it
    needs; ``held_as``: what the cache holds of them)."""
    memory = None if proj is None else proj.memory
    past = None if memory is None else memory.get(key)
    held = 0 if past is None else past.shape[dim]
    cached = tk - t
    if cached > held:
        raise ValueError(
            f"{name} needs the {needs} of all {tk} keys: this call has the layer input of {t} and {held} cached "
            f"keys' {held_as}; keys beyond them come from a KVCache (decode through posenc.Attention or "
            "Transformer with cache=...)"
        )
    return memory, past, cached, held


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
    # How many position axes the hooks are built for: 1, a sequence's positions (B, T); A >= 2 for a
    # multi-axis encoding (M-RoPE 3, 2-D RoPE 2, XD-RoPE 4 by default), whose ``position_ids``
    # return ``seq.axes`` (A, B, T) when given. A class attribute, so the registry answers without
    # building the encoding (``posenc bench``'s presets run the 1-D ones).
    position_axes: ClassVar[int] = 1

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
    def has_bias(self) -> bool:
        """``logit_bias()`` gives a content-independent logit bias (once per forward)."""
        return self._overrides("logit_bias")

    @property
    def has_terms(self) -> bool:
        """``terms()`` gives content-dependent logit terms (per layer). Override when the
        config decides (a value-only Shaw has none)."""
        return self._overrides("terms")

    @property
    def has_value_terms(self) -> bool:
        """``terms()`` may include a :class:`~posenc.terms.ValueTerm` (it needs the
        probabilities, so backends without them cannot run this encoding). Encodings that
        return ValueTerms override this."""
        return False

    @property
    def reads_layer_input(self) -> bool:
        """``terms()`` reads the layer input ``proj.x`` (FoX's forget gates): its logits depend
        on the tokens themselves, not on q, k and positions alone. Encodings that do override this."""
        return False

    # ---- hooks ----------------------------------------------------------------------------
    def position_ids(self, seq: SequenceInfo) -> Tensor:
        """The position ids the hooks below receive as ``q_pos`` / ``k_pos``, read from ``seq``:
        ``seq.positions`` (B, T). A multi-axis encoding (M-RoPE, 2-D RoPE) returns ``seq.axes``
        (A, B, T) when ``seq`` carries them (after checking A), and its hooks accept (B, T) too."""
        return seq.positions

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> Any:
        """Per-forward state for the hooks below, from query positions (B, Tq) and the
        positions of all keys attended to (B, Tk), cache included. Default: no state.

        A rotary encoding's state serves the keys that are new in this forward, which sit at
        the query positions (self-attention): ``rotate`` reuses the query tables for them.
        Attention passes ``state=None`` for keys elsewhere (cross-attention), and ``rotate``
        then builds its tables from ``k_pos``.
        A content-dependent encoding keeps the positions it needs in this state: ``terms``
        receives only the state.
        """
        return None

    def prepare_cached(self, q_pos: Tensor, k_pos: Tensor, memo: dict[str, Any]) -> Any:
        """``prepare`` for a forward that continues a KV cache without autograd (decoding).

        ``memo`` is a dict owned by the cache for this encoding module: an encoding may keep
        there what depends on its parameters and positions only (e.g. projected rows per
        distance) and extend it step by step instead of recomputing it. The result must equal
        ``prepare``'s. Default: ``prepare``.
        """
        return self.prepare(q_pos, k_pos)

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

    def logit_bias(self) -> BiasTerm:
        """The content-independent logit bias as one pointwise function of (h, q_pos, k_pos).

        (Named ``logit_bias``, not ``bias``: ``bias`` is a common parameter name in modules.)

        Called once per forward by the model's context; float32 (or wider) in logit units.
        """
        raise NotImplementedError(f"{type(self).__name__} has no content-independent bias (has_bias is False)")

    def logit_bias_cached(self, q_pos: Tensor, k_pos: Tensor, memo: dict[str, Any]) -> BiasTerm:
        """``logit_bias`` for a forward that continues a KV cache without autograd (decoding).

        ``memo`` is the cache's dict for this encoding module (the one ``prepare_cached`` gets:
        use keys of your own); q_pos, k_pos are this forward's positions. An encoding whose bias
        is costly per distance may keep its values there and read them each step. The result
        must equal ``logit_bias()``'s at these positions. Default: ``logit_bias()``.
        """
        return self.logit_bias()

    def terms(self, q: Tensor, k: Tensor, state: Any, proj: QKProjection | None) -> list[TableTerm | ValueTerm]:
        """Content-dependent logit terms (and value terms) of one layer.

        q (B, H, Tq, D); k (B, H, Tk, D), grouped-query heads already expanded; ``state`` is
        ``prepare(q_pos, k_pos)``'s result for this forward (never None); ``proj`` the calling
        layer's projections, input and cache slot (None when called standalone). Tables are in logit units (already
        multiplied by ``attention_scale``).
        """
        raise NotImplementedError(f"{type(self).__name__} has no content-dependent terms (has_terms is False)")

    def attention_scale(self, head_dim: int) -> float:
        """Multiplier of q·k in the logits."""
        return 1.0 / math.sqrt(head_dim)

    # ---- dense conveniences derived from the hooks (not overridden) ---------------------------
    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``logit_bias().dense(q_pos, k_pos)``: (B or 1, H, Tq, Tk), float32 or wider."""
        return self.logit_bias().dense(q_pos, k_pos)

    def score(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        *,
        layer: nn.Module | None = None,
        state: Any = None,
        proj: QKProjection | None = None,
    ) -> Tensor:
        """The sum of ``terms(...)``'s logit terms, dense: (B, H, Tq, Tk) in logit units
        (the terms carry the encoding's own ``attention_scale``).

        ``layer``: an :class:`~posenc.Attention` whose projections become ``proj`` when
        ``proj`` is None. ``state``: ``prepare(q_pos, k_pos)`` when None.
        """
        state = self.prepare(q_pos, k_pos) if state is None else state
        proj = proj if proj is not None or layer is None else QKProjection.of(layer)
        total = dense_logit_terms(self.terms(q, k, state, proj), q_pos, k_pos)
        if total is None:
            return q.new_zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2], dtype=torch.promote_types(q.dtype, torch.float32))
        return total

    def output(
        self,
        probs: Tensor,
        v: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        *,
        state: Any = None,
        q: Tensor | None = None,
        k: Tensor | None = None,
        proj: QKProjection | None = None,
    ) -> Tensor:
        """The sum of ``terms(...)``'s value terms on the output: (B, H, Tq, Dv) from probs
        (B, H, Tq, Tk). ``q``/``k`` are passed on to ``terms`` (encodings whose value terms do
        not read them, like Shaw's, accept None)."""
        state = self.prepare(q_pos, k_pos) if state is None else state
        out = torch.zeros_like(v[:, :, :1]).expand(*probs.shape[:3], v.shape[-1])  # (B, H, Tq, Dv)
        for t in self.terms(q, k, state, proj):
            if isinstance(t, ValueTerm):
                out = out + t.dense_output(probs, q_pos, k_pos).to(v.dtype)
        return out

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config.to_dict().items())


def layer_terms(
    pe: PositionalEncoding, q: Tensor, k: Tensor, state: Any, proj: QKProjection | None
) -> list[Term]:
    """What attention calls per layer: ``pe.terms(q, k, state, proj)``, or [] without terms."""
    if not (pe.has_terms or pe.has_value_terms):
        return []
    return pe.terms(q, k, state, proj)
