"""Which keys each query may see, described once per forward (:class:`AttentionMask`).

The description is built from the queries' and keys' :class:`~posenc.positions.SequenceInfo`
and whether attention is causal; each attention backend takes the form it needs:

* ``dense()``: a bool (B|1, 1, Tq, Tk) tensor, True where query i may see key j (the eager
  reference and SDPA), or None when every key is visible;
* ``plain_causal``: exactly causal with Tq == Tk (SDPA's ``is_causal``, no tensor at all);
* ``mask_mod()`` / ``block_mask()``: FlexAttention's pointwise form and its block-sparse
  ``BlockMask`` (blocks that no query of a block may see are skipped).

Rules, the same in every form:

* causality uses stream indices, not position ids: queries are the last Tq of the Tk keys in
  stream order (a KV-cache step's new tokens follow the cached ones), so query i sees key j
  when ``j <= i + (Tk - Tq)``. Packed documents and left padding are then right;
* documents (``segment_ids``) never see each other; padding keys (``valid`` False) are never
  seen;
* a query row that sees no key at all (a padding query, whose own document holds no valid
  key) sees every key instead of producing NaN; its output is meaningless and ignored.

Local attention, optional, on top of these rules (one forward may hold several masks: the
model keeps one per kind of layer, each built from the same ``SequenceInfo``):

* ``window=w`` (sliding window; Mistral, Gemma, Cohere2): query i sees key j when
  ``i - w < j`` (with causality: ``i - w < j <= i``, w keys counting itself), by stream index
  like causality. This is transformers' ``sliding_window`` convention
  (``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``). Without
  causality the window is symmetric, ``|i - j| < w`` (transformers' bidirectional overlay
  keeps ``|i - j| <= w``: its w is ours minus one). Stream indices make packed documents and
  left padding right: a document's tokens and a row's real tokens are contiguous.
* ``chunk=c`` (chunked attention; Llama 4's ``attention_chunk_size``): query i sees key j only
  when their *positions* fall in the same chunk, ``q_pos // c == k_pos // c``. Positions, not
  stream indices, so each document and each left-padded row starts its own first chunk, as
  transformers' ``chunked_overlay`` does by subtracting the left padding, and a KV-cache step
  continues the chunk of its position.

Shapes: positions, segment ids, valid (B, T); masks (B|1, 1, Tq, Tk).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from .config import check_int
from .positions import SequenceInfo, contiguous_offset

__all__ = ["AttentionMask", "build_mask"]

# Query rows per step when finding rows that see no key: bounds the scratch to rows x Tk bools.
_ROWS = 1024


def build_mask(
    q_seq: SequenceInfo,
    k_seq: SequenceInfo,
    q_index: Tensor,
    k_index: Tensor,
    causal: bool,
    *,
    window: int | None = None,
    chunk: int | None = None,
) -> Tensor | None:
    """Boolean mask (B or 1, 1, Tq, Tk), True where query i may attend to key j; None = all.

    ``q_index``/``k_index`` are the tokens' indices in the stream (not their position ids).
    See the module docstring for the rules (documents, padding, the sliding ``window`` and the
    position ``chunk``, rows that see no key).
    """
    mask = _raw_mask(q_seq, k_seq, q_index, k_index, causal, window, chunk)
    if mask is not None and (k_seq.valid is not None or q_seq.segment_ids is not None or chunk is not None):
        mask = mask | ~mask.any(-1, keepdim=True)
    return mask


def _raw_mask(q_seq: SequenceInfo, k_seq: SequenceInfo, q_index: Tensor, k_index: Tensor, causal: bool,
              window: int | None = None, chunk: int | None = None) -> Tensor | None:
    """The visibility rules before the rows-that-see-nothing fix."""
    mask: Tensor | None = None
    if causal:
        mask = (k_index[None, :] <= q_index[:, None])[None, None]  # (1, 1, Tq, Tk)
    if window is not None:
        d = q_index[:, None] - k_index[None, :]  # (Tq, Tk) stream distance
        m = (d < window if causal else d.abs() < window)[None, None]  # (1, 1, Tq, Tk)
        mask = m if mask is None else mask & m
    if chunk is not None:
        qc, kc = q_seq.positions // chunk, k_seq.positions // chunk  # (B, Tq), (B|1, Tk)
        m = qc[:, None, :, None] == kc[:, None, None, :]  # (B, 1, Tq, Tk)
        mask = m if mask is None else mask & m
    if k_seq.valid is not None:
        m = k_seq.valid[:, None, None, :]  # (B, 1, 1, Tk)
        mask = m if mask is None else mask & m
    if q_seq.segment_ids is not None and k_seq.segment_ids is not None:
        m = q_seq.segment_ids[:, None, :, None] == k_seq.segment_ids[:, None, None, :]
        mask = m if mask is None else mask & m
    return mask


@dataclass(frozen=True, eq=False)
class AttentionMask:
    """The mask of one forward: queries ``q_seq`` (B, Tq) attending to keys ``k_seq`` (B|1, Tk).

    Build it with :meth:`build`. ``causal`` queries are aligned to the end of the keys (see the
    module docstring); ``window`` / ``chunk`` restrict each query to a sliding window of stream
    indices / to its chunk of positions. It lives for one forward (the model's
    :class:`~posenc.context.AttentionContext` holds it); each form is computed on first use
    and kept for the other layers of that forward.
    """

    q_seq: SequenceInfo
    k_seq: SequenceInfo
    causal: bool
    window: int | None = None
    chunk: int | None = None
    _forms: dict = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        q_seq: SequenceInfo,
        k_seq: SequenceInfo | None = None,
        *,
        causal: bool,
        window: int | None = None,
        chunk: int | None = None,
    ) -> "AttentionMask":
        """The mask for ``q_seq`` attending to ``k_seq`` (self-attention when None), restricted to
        a sliding ``window`` (keys) or a ``chunk`` (positions) when given."""
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
        for name, size in (("window", window), ("chunk", chunk)):
            if size is not None:
                check_int(name, size, minimum=1)
        k_seq = q_seq if k_seq is None else k_seq
        bq, bk = q_seq.positions.shape[0], k_seq.positions.shape[0]
        if bk not in (bq, 1):
            raise ValueError(f"query batch {bq} and key batch {bk} differ (the key batch may be 1 or {bq})")
        tq, tk = q_seq.positions.shape[1], k_seq.positions.shape[1]
        if causal and tq > tk:
            raise ValueError(f"causal attention needs at most as many queries as keys, got Tq={tq} > Tk={tk}")
        return cls(q_seq, k_seq, causal, window, chunk)

    # ---- facts ----------------------------------------------------------------------------------
    @property
    def tq(self) -> int:
        return self.q_seq.positions.shape[1]

    @property
    def tk(self) -> int:
        return self.k_seq.positions.shape[1]

    @property
    def _causal_needed(self) -> bool:
        # One query aligned to the end of the keys sees them all.
        return self.causal and self.tq > 1

    @property
    def _window_needed(self) -> bool:
        # A window of at least max(Tq, Tk) keys hides nothing: no stream distance reaches it.
        return self.window is not None and self.window < max(self.tq, self.tk)

    @property
    def _local(self) -> bool:
        # Chunks are always applied: whether all positions share one chunk needs a host read.
        return self._window_needed or self.chunk is not None

    @property
    def _documents(self) -> bool:
        return self.q_seq.segment_ids is not None and self.k_seq.segment_ids is not None

    @property
    def _may_empty_rows(self) -> bool:
        # Same condition as build_mask: padding, documents or chunks can leave a row empty
        # (a query always sees its own stream index, which a window keeps; a chunk of
        # cross-attention keys at other positions may hold none of the query's).
        return self.k_seq.valid is not None or self.q_seq.segment_ids is not None or self.chunk is not None

    @property
    def is_full(self) -> bool:
        """Every query sees every key (``dense()`` is None)."""
        return not (self._causal_needed or self.k_seq.valid is not None or self._documents or self._local)

    @property
    def causal_only(self) -> bool:
        """Causal (query-aligned, Tq > 1) and nothing else: no padding, documents, window or chunk."""
        return (self._causal_needed and self.k_seq.valid is None and not self._documents
                and not self._may_empty_rows and not self._local)

    @property
    def sliding_only(self) -> bool:
        """Causal (Tq > 1) with a sliding window and nothing else: no padding, documents or
        chunk, so query i sees exactly the keys ``i - w < j <= i`` (stream indices) and no row
        is empty; attention may then read each block of queries' window alone."""
        return (self._causal_needed and self._window_needed and self.chunk is None
                and not self._may_empty_rows and not self._documents)

    @property
    def local_rows(self) -> bool:
        """Causal local attention that a block of query rows can read in part (:meth:`row_block`):
        a sliding window alone (:attr:`sliding_only`), or chunks alone over one shared row of
        contiguous positions (``from_offset``: chunk boundaries are then stream indices; one host
        read, never under torch.compile)."""
        return self.sliding_only or self._chunk_base() is not None

    def row_block(self, a: int, z: int) -> tuple[int, Tensor]:
        """``(lo, m)`` for query rows ``a..z-1`` of a :attr:`local_rows` mask: they see no key
        before ``lo`` nor after their own, and ``m`` (z - a, z + Tk - Tq - lo) bool is the mask
        over keys ``lo .. z + Tk - Tq - 1``, made from stream indices (no (Tq, Tk) tensor)."""
        off, device = self.tk - self.tq, self.q_seq.positions.device
        i = torch.arange(a + off, z + off, device=device)[:, None]  # the rows' stream indices
        if self.chunk is None:  # sliding window
            lo = max(0, a + off - self.window + 1)
            j = torch.arange(lo, z + off, device=device)[None, :]
            return lo, (j <= i) & (i - j < self.window)
        base, c = self._chunk_base(), self.chunk  # stream index s sits at position s + base
        lo = max(0, (a + off + base) // c * c - base)  # the start of row a's chunk
        j = torch.arange(lo, z + off, device=device)[None, :]
        return lo, (j <= i) & ((j + base) // c == (i + base) // c)

    def _chunk_base(self) -> int | None:
        """The position of key 0 when chunks alone apply (causal, no window, padding or
        documents) over one shared, contiguous row of positions with the queries last; else None."""
        if "chunk_base" not in self._forms:
            qp, kp = self.q_seq.positions, self.k_seq.positions
            one_row = lambda p: p.shape[0] == 1 or p.stride(0) == 0  # noqa: E731
            simple = (self.chunk is not None and self.window is None and self._causal_needed
                      and self.k_seq.valid is None and not self._documents and self.q_seq.segment_ids is None
                      and one_row(qp) and one_row(kp) and not torch.compiler.is_compiling())
            aligned = simple and contiguous_offset(qp[:1], kp[:1]) == self.tk - self.tq
            self._forms["chunk_base"] = int(kp[0, 0]) if aligned else None
        return self._forms["chunk_base"]

    @property
    def plain_causal(self) -> bool:
        """Exactly causal with Tq == Tk, no padding, documents, window or chunk: SDPA's ``is_causal``."""
        return (
            self.causal
            and self.tq == self.tk
            and self.k_seq.valid is None
            and self.q_seq.segment_ids is None
            and not self._local
        )

    # ---- forms ------------------------------------------------------------------------------------
    def indices(self) -> tuple[Tensor, Tensor]:
        """Stream indices (Tq,), (Tk,) of queries and keys: queries are the last Tq keys."""
        device = self.q_seq.positions.device
        return torch.arange(self.tk - self.tq, self.tk, device=device), torch.arange(self.tk, device=device)

    def dense(self) -> Tensor | None:
        """Bool (B|1, 1, Tq, Tk), True where query i may see key j; None when all may."""
        if "dense" not in self._forms:
            q_index, k_index = self.indices()
            self._forms["dense"] = build_mask(self.q_seq, self.k_seq, q_index, k_index, self._causal_needed,
                                              **self._local_args())
        return self._forms["dense"]

    def _local_args(self) -> dict:
        """The window and chunk that apply (a window hiding nothing is left out)."""
        return dict(window=self.window if self._window_needed else None, chunk=self.chunk)

    def _chunks(self) -> tuple[Tensor, Tensor]:
        """Chunk numbers of queries (B, Tq) and keys (B|1, Tk): ``positions // chunk``."""
        if "chunks" not in self._forms:
            self._forms["chunks"] = (self.q_seq.positions // self.chunk, self.k_seq.positions // self.chunk)
        return self._forms["chunks"]

    def _visible(self, b, q_idx, kv_idx):
        """The rule before the empty-row fix, pointwise (tensors broadcast)."""
        ok = torch.ones((), dtype=torch.bool, device=self.q_seq.positions.device)
        if self._causal_needed:
            ok = ok & (kv_idx <= q_idx + (self.tk - self.tq))
        if self._window_needed:
            d = q_idx + (self.tk - self.tq) - kv_idx  # stream distance
            ok = ok & (d < self.window) & (d > -self.window)
        if self.chunk is not None:
            qc, kc = self._chunks()
            ok = ok & (qc[b if qc.shape[0] > 1 else 0, q_idx] == kc[b if kc.shape[0] > 1 else 0, kv_idx])
        valid = self.k_seq.valid
        if valid is not None:
            ok = ok & valid[b if valid.shape[0] > 1 else 0, kv_idx]
        if self._documents:
            qs, ks = self.q_seq.segment_ids, self.k_seq.segment_ids
            ok = ok & (qs[b if qs.shape[0] > 1 else 0, q_idx] == ks[b if ks.shape[0] > 1 else 0, kv_idx])
        return ok

    def empty_rows(self) -> Tensor | None:
        """Bool (B, Tq), True for query rows that see no key (they will see all); None if none can.

        Found ``_ROWS`` query rows at a time, so no (Tq, Tk) tensor is built at once.
        """
        if not self._may_empty_rows:
            return None
        q_index, k_index = self.indices()
        parts = []
        for a in range(0, self.tq, _ROWS):
            z = min(a + _ROWS, self.tq)
            q_rows = SequenceInfo.from_checked(*(None if t is None else t[:, a:z] for t in
                                                  (self.q_seq.positions, self.q_seq.segment_ids, self.q_seq.valid)))
            m = _raw_mask(q_rows, self.k_seq, q_index[a:z], k_index, self._causal_needed, **self._local_args())
            parts.append((~m.any(-1)[:, 0]).expand(-1, z - a))  # (B|1, z - a): m may broadcast over rows
        if not parts:
            return torch.zeros(self.q_seq.positions.shape, dtype=torch.bool, device=self.q_seq.positions.device)
        rows = torch.cat(parts, dim=-1)  # (B|1, Tq)
        return rows.expand(self.q_seq.positions.shape[0], -1)

    def mask_mod(self) -> Callable | None:
        """FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``; None when all keys are visible."""
        if self.is_full:
            return None
        empty = self.empty_rows()

        def mod(b, h, q_idx, kv_idx):
            ok = self._visible(b, q_idx, kv_idx)
            return ok if empty is None else ok | empty[b, q_idx]

        return mod

    def block_mask(self, block_size: int = 128):
        """FlexAttention ``BlockMask`` from :meth:`mask_mod` (None when all keys are visible)."""
        from torch.nn.attention.flex_attention import create_block_mask

        key = ("block_mask", block_size)
        if key in self._forms:
            return self._forms[key]
        mod = self.mask_mod()
        if mod is None:
            return None
        batched = any(t is not None and t.shape[0] > 1 for t in
                      (self.k_seq.valid, self.q_seq.segment_ids, self.k_seq.segment_ids)) or self._may_empty_rows
        B = self.q_seq.positions.shape[0] if batched else None
        self._forms[key] = create_block_mask(mod, B, None, self.tq, self.tk, device=self.q_seq.positions.device,
                                             BLOCK_SIZE=block_size)
        return self._forms[key]
