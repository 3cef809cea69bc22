"""Logit terms: what a relative encoding adds to attention, described once.

Every relative scheme in posenc adds to the attention logits a term that is a pointwise
function of (batch, head, query, key) — and Shaw et al. also add a term to the output. A term
is described once here; each attention backend derives the form it needs from that one
description:

* ``dense(q_pos, k_pos)``: the (B|1, H, Tq, Tk) tensor (the eager reference, and SDPA's
  float ``attn_mask``);
* ``score_mod(q_pos, k_pos)``: a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)``
  that reads only small tensors (a bias table, slopes, a (B, H, T, R) table of q·Eᵀ), so no
  (Tq, Tk) tensor is ever built.

Ten kinds:

* :class:`BiasTerm` — content-independent: ``fn(h, q_pos, k_pos)`` written with broadcasting
  tensor ops (T5 buckets, ALiBi, KERPLE, FIRE). ``toeplitz=True`` says it depends on
  ``q_pos - k_pos`` only, so contiguous positions need its Tq + Tk - 1 distinct values only.
* :class:`TableTerm` — content-dependent with a bounded number R of distinct (clipped or
  bucketed) relative positions: ``logit[b, h, i, j] += table[b, h, i, bucket(q_pos_i, k_pos_j)]``
  on the query side (q·Eᵀ: Shaw's a^K, relative_key, DeBERTa c2p), or with row ``j`` on the
  key side (k·Eᵀ: relative_key_query, DeBERTa p2c). The table is O(T·R), not O(T²).
* :class:`DenseTerm` — a precomputed (B|1, H, Tq, Tk) logit tensor, for schemes without a
  bounded number of distinct distances.
* :class:`LogitsTerm` — an encoding's own (B, H, Tq, Tk) logits in place of q·kᵀ (PaTH's
  decoding step); its dense form is the difference.
* :class:`PrefixSumTerm` — a sum of per-token quantities over the tokens between key and
  query, ``c_i - c_j`` from their (B, H, T) prefix sums (FoX's log forget gates): rank
  structured, so ``score_mod`` reads two (B, H, T) tensors.
* :class:`CountTerm` — CoPE's gain read at a count of gated keys between key and query:
  ``dense`` builds it; the fused function computes it block by block from the attention's
  own logits (defined in :mod:`posenc.scan_terms`, as the next).
* :class:`StickBreakingTerm` — stick-breaking attention's log weights: the logit of key j
  gains the sum of log(1 - sigmoid(logit)) over the keys from j to the query, and the layer's
  weights are exp(logits), not their softmax (:attr:`StickBreakingTerm.normalized`): the
  fused function computes it block by block from the attention's own logits, like a count.
* :class:`StickTerm` — the same sums of log sigmoid(±y) with gates y of vectors of its own
  (per_row_alibi's forget gates), in a softmax: the fused function computes it block by block
  from the gate vectors (both are :class:`StickSums`, with a :class:`StickRule`).
* :class:`HouseholderTerm` — PaTH's q_iᵀ H_i ⋯ H_{j+1} k_j in place of q_i·k_j (its dense form
  is the difference): under a plain causal mask a leaf of its own computes it chunk by chunk
  (:mod:`posenc.backends.householder_flash`), with no (Tq, Tk) tensor.
* :class:`ValueTerm` — Shaw's a^V: ``out_i += sum_j p_ij · values[h, bucket(q_pos_i, k_pos_j)]``.
  It needs the probabilities, so FlexAttention (which returns only the output) cannot take it.

Shapes: positions (B, T) int64; tables float32 (or float64 in a float64 model), in logit
units (already multiplied by the attention scale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .positions import contiguous_offset, shared_rows
from .scan_terms import (EXCLUDED, CountTerm, HouseholderTerm, StickBreakingTerm, StickRule, StickSums, StickTerm, contextual_positions,
                         interpolated_gain, stick_log_left)

__all__ = ["BiasTerm", "CountTerm", "DenseTerm", "DiagonalSums", "HouseholderTerm", "LogitsTerm", "PrefixSumTerm", "SaturatingBucket", "StickBreakingTerm", "StickRule", "StickSums",
           "StickTerm", "TableTerm", "ValueTerm", "Term", "EXCLUDED", "contextual_positions", "dense_logit_terms", "interpolated_gain",
           "stick_log_left"]

# fn(h, q_pos, k_pos) -> bias; the three arguments broadcast against each other.
BiasFn = Callable[[Tensor, Tensor, Tensor], Tensor]
# bucket(q_pos, k_pos) -> int64 index in [0, R); the two arguments broadcast.
BucketFn = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True, eq=False)
class BiasTerm:
    """A content-independent logit bias ``fn(h, q_pos, k_pos)`` (float32 or wider, logit units).

    ``fn`` must be pointwise and written with broadcasting tensor ops, so one definition serves
    the dense table (h (H, 1, 1) against (B, 1, Tq, 1) and (B, 1, 1, Tk) positions) and a
    FlexAttention ``score_mod`` (0-d tensors). ``toeplitz``: depends on ``q_pos - k_pos`` only,
    so for contiguous positions the dense form evaluates ``fn`` on the Tq + Tk - 1 distinct
    distances and lays them out as a Toeplitz matrix.
    """

    fn: BiasFn
    num_heads: int
    toeplitz: bool = True

    def dense(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B|1, H, Tq, Tk) from positions q_pos (B|1, Tq), k_pos (B|1, Tk).

        One row (1, H, Tq, Tk) when every row's positions are provably the same (see
        :func:`~posenc.positions.shared_rows`).
        """
        q_pos, k_pos = shared_rows(q_pos, k_pos)
        values = self.toeplitz_values(q_pos, k_pos)
        if values is not None:
            return self.toeplitz_layout(values, q_pos.shape[1], k_pos.shape[1])
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            # Recomputed in the backward: autograd would keep fn's per-pair intermediates (T5's
            # bucket indices, KERPLE's distances) through every layer's forward, not only the bias.
            return checkpoint(self.all_pairs, q_pos, k_pos, use_reentrant=False)
        return self.all_pairs(q_pos, k_pos)

    def all_pairs(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``fn`` on every (query, key) pair: (B|1, H, Tq, Tk) (the reference form)."""
        h = torch.arange(self.num_heads, device=q_pos.device)[:, None, None]  # (H, 1, 1)
        return self.fn(h, q_pos[:, None, :, None], k_pos[:, None, None, :])  # (B|1, H, Tq, Tk)

    def block_sums(self, q_pos: Tensor, k_pos: Tensor) -> tuple[tuple[Tensor, ...], Callable] | None:
        """For a backward that sums the dense gradient block by block of query rows
        (:meth:`posenc.backends.cpu_flash.SummedBias.blockwise`): the tensors the bias is made
        of and ``make(dtype)``, an accumulator with ``add(i0, block)`` (a (1, H, rows, z) block
        of the gradient, rows from i0, keys from 0) and ``grads()`` (those tensors' gradients),
        so no dense gradient exists. None (the default): the dense gradient, or the Toeplitz
        values' diagonal sums."""
        return None

    def toeplitz_values(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """The bias's Tq + Tk - 1 distinct values (1, H, Tq + Tk - 1), in the order
        :meth:`toeplitz_layout` reads them, when it is Toeplitz here (``toeplitz``, one row of
        contiguous positions for every batch row); else None."""
        q_pos, k_pos = shared_rows(q_pos, k_pos)
        if not (self.toeplitz and q_pos.shape[0] == 1 and k_pos.shape[0] == 1):
            return None
        s = contiguous_offset(q_pos, k_pos)
        return None if s is None else self._per_distance(s, q_pos.shape[1], k_pos.shape[1], q_pos.device)

    @staticmethod
    def toeplitz_layout(values: Tensor, tq: int, tk: int) -> Tensor:
        """(1, H, Tq, Tk) with entry (i, j) = ``values[..., Tq - 1 - i + j]`` (distance s + i - j)."""
        # Window w holds distances s + Tq - 1 - w - j over keys j, i.e. query i = Tq - 1 - w;
        # picking the windows in reverse is one contiguous copy (flip would keep the windows'
        # overlapping strides).
        windows = values.unfold(-1, tk, 1)  # (1, H, Tq, Tk) view, rows in reverse order
        return windows.index_select(-2, torch.arange(tq - 1, -1, -1, device=values.device))  # (1, H, Tq, Tk)

    def _per_distance(self, s: int, tq: int, tk: int, device: torch.device, query: Tensor | None = None) -> Tensor:
        # Distances q_pos_i - k_pos_j = s + i - j, evaluated once each as "query at d, key at 0",
        # or, given ``query`` (a 0-d position), as "query at `query`, key at query - d": for a
        # fn that depends on the distance only among queries like that one (FIRE below its L).
        d = s + torch.arange(tq - 1, -tk, -1, device=device)  # (Tq + Tk - 1,) descending
        if query is None:
            return self.all_pairs(d[None], d.new_zeros(1, 1))[..., 0]  # (1, H, Tq + Tk - 1)
        return self.all_pairs(query.view(1, 1), (query - d)[None])[..., 0, :]  # (1, H, Tq + Tk - 1)

    def _toeplitz(self, s: int, tq: int, tk: int, device: torch.device, query: Tensor | None = None) -> Tensor:
        return self.toeplitz_layout(self._per_distance(s, tq, tk, device, query), tq, tk)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> Callable:
        """FlexAttention ``score_mod`` adding this bias: positions looked up per (b, q_idx, kv_idx)."""
        qb, kb = q_pos.shape[0] > 1, k_pos.shape[0] > 1

        def mod(score, b, h, q_idx, kv_idx):
            qp = q_pos[b if qb else 0, q_idx]
            kp = k_pos[b if kb else 0, kv_idx]
            return score + self.fn(h, qp, kp).to(score.dtype)

        return mod


class DiagonalSums:
    """The gradient of a Toeplitz bias's values, summed from dense gradient blocks.

    The bias (1, H, Tq, Tk) has entry (i, j) = ``values[..., Tq - 1 - i + j]``
    (:meth:`posenc.terms.BiasTerm.toeplitz_layout`), so the gradient of value w is the sum of
    dbias over the diagonal j - i = w - (Tq - 1). :meth:`add` takes a block of rows: flipped,
    each row padded by the block's height and the rows re-read one element shorter, the
    block's diagonals become columns (row r moves r places right), summed in one reduction.
    """

    def __init__(self, num_heads: int, tq: int, tk: int, dtype: torch.dtype, device: torch.device) -> None:
        self.tq = tq
        self.values = torch.zeros(1, num_heads, tq + tk - 1, dtype=dtype, device=device)

    def add(self, i0: int, block: Tensor) -> None:
        """Add dbias of rows i0 .. i0 + rows and keys 0 .. z: ``block`` (1, H, rows, z)."""
        H, rows, z = block.shape[1:]
        skewed = F.pad(block.flip(-2), (0, rows))  # (1, H, rows, z + rows)
        skewed = skewed.flatten(-2)[..., : rows * (z + rows - 1)].view(1, H, rows, z + rows - 1)
        start = self.tq - i0 - rows  # the value of row i0 + rows - 1, key 0
        self.values[..., start:start + z + rows - 1] += skewed.sum(-2)


class SaturatingBucket:
    """The contract of a bucket function that depends on the distance ``d = q_pos - k_pos``
    only and is constant for ``d >= hi`` and for ``d <= lo`` (``lo <= hi``, ints): a clipped
    or log-bucketed table. Subclasses (:class:`~posenc.relative.distance.DistanceBucket`,
    :class:`~posenc.relative.distance.LookupBucket`) set ``lo``/``hi`` and define ``__call__``;
    :class:`TableTerm` uses the bounds to treat saturated keys as one row (see its ``dense``).
    """

    lo: int
    hi: int

    def __call__(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        raise NotImplementedError

    def at(self, d: int, device: torch.device) -> int:
        """The bucket of distance ``d``."""
        zero = torch.zeros((), dtype=torch.long, device=device)
        return int(self(zero + d, zero))


class TableTerm:
    """A content-dependent term read from a (B, H, T_side, R) table by relative bucket.

    ``side="query"``: ``logit[b, h, i, j] += table[b, h, i, bucket(q_pos_i, k_pos_j)]``;
    ``side="key"``: ``logit[b, h, i, j] += table[b, h, j, bucket(q_pos_i, k_pos_j)]``.

    Given either as the table itself or, with :meth:`product`, as its two factors
    ``table = x @ rows``: x (B, H, T_side, D) the queries or keys, rows (H, D, R) the
    position vectors, or (D, R) shared by the heads. From factors the table is computed on
    first use (the fused kernel and ``score_mod`` read it), and ``dense`` may skip it.
    """

    def __init__(self, table: Tensor | None, side: Literal["query", "key"], bucket: BucketFn) -> None:
        if side not in ("query", "key"):
            raise ValueError(f"side must be 'query' or 'key', got {side!r}")
        self._table, self.side, self.bucket = table, side, bucket
        self.x: Tensor | None = None
        self.rows: Tensor | None = None

    @classmethod
    def product(cls, x: Tensor, rows: Tensor, side: Literal["query", "key"], bucket: BucketFn) -> "TableTerm":
        """The term whose table is ``x @ rows``: x (B, H, T_side, D), rows (H, D, R) or (D, R)."""
        term = cls(None, side, bucket)
        term.x, term.rows = x, rows
        return term

    @property
    def is_factored(self) -> bool:
        """True while the table is given by its factors ``x @ rows`` and not yet built."""
        return self._table is None

    @property
    def table(self) -> Tensor:
        """(B, H, T_side, R), computed once from the factors if it was not given."""
        if self._table is None:
            self._table = self.x @ self.rows  # (B, H, T_side, R)
        return self._table

    def index(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B|1, Tq, Tk) int64 buckets."""
        return self.bucket(q_pos[:, :, None], k_pos[:, None, :])

    def dense(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B, H, Tq, Tk): the table gathered at every (query, key) pair.

        From factors, when the other side has few positions (a decoding step's one query
        against a key-side table), the pair's row of ``rows`` is gathered and dotted with x
        instead: x_j·rows[bucket(i, j)] costs Tq·Tk·D against the table's T_side·R·D, and it
        is taken when its (B, H, Tq, Tk, D) rows are no larger than the (B, H, T_side, R)
        table (Tq·D <= R on the key side; e.g. DeBERTa's p2c over a 512-key cache computed
        k·Q^rᵀ for all R = 256 rows to read one per key). See :meth:`_key_rows` for the keys
        whose bucket is saturated.
        """
        other = q_pos.shape[1] if self.side == "key" else k_pos.shape[1]  # Tq or Tk
        if self.is_factored and other * self.x.shape[-1] <= self.rows.shape[-1]:
            if self.side == "key":
                return self._key_rows(q_pos, k_pos)
            return self._gather_rows(self.index(q_pos, k_pos), self.x)
        idx = self.index(q_pos, k_pos)  # (B|1, Tq, Tk)
        B, H = self.table.shape[:2]
        if self.side == "query":
            idx = idx[:, None].expand(B, H, -1, -1)  # (B, H, Tq, Tk)
            return self.table.gather(-1, idx)
        idx = idx.transpose(1, 2)[:, None].expand(B, H, -1, -1)  # (B, H, Tk, Tq)
        return self.table.gather(-1, idx).transpose(-2, -1)  # (B, H, Tq, Tk)

    def _key_rows(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Key side from factors, few queries: (B, H, Tq, Tk).

        With a :class:`SaturatingBucket` and contiguous positions (pair (i, j) at distance
        s + i - j), the keys j <= s - hi are at distance >= hi from every query, so they all
        read the one row bucket(hi): x_j·rows[bucket(hi)] is one matrix-vector product over
        them, not a gathered row per key (likewise keys at distance <= lo from every query).
        Only the keys in between, at most hi - lo + Tq of them, gather their rows. A long
        decoding cache is mostly saturated: DeBERTa's p2c at a 4096-token context gathers the
        rows of 511 keys instead of 4096.
        """
        s = contiguous_offset(q_pos, k_pos) if isinstance(self.bucket, SaturatingBucket) else None
        if s is None:
            return self._gather_rows(self.index(q_pos, k_pos), self.x)
        tq, tk = q_pos.shape[1], k_pos.shape[1]
        j0 = min(max(s - self.bucket.hi + 1, 0), tk)  # keys [0, j0): distance >= hi for every query
        j1 = min(max(s + tq - 1 - self.bucket.lo, j0), tk)  # keys [j1, Tk): distance <= lo for every query
        parts = []
        if j0:
            parts.append(self._saturated(self.bucket.hi, 0, j0, tq, q_pos.device))
        if j1 > j0:
            idx = self.index(q_pos, k_pos[:, j0:j1])  # (B|1, Tq, j1 - j0)
            parts.append(self._gather_rows(idx, self.x[:, :, j0:j1]))
        if j1 < tk:
            parts.append(self._saturated(self.bucket.lo, j1, tk, tq, q_pos.device))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _saturated(self, d: int, j0: int, j1: int, tq: int, device: torch.device) -> Tensor:
        """(B, H, Tq, j1 - j0): keys [j0, j1) of a key-side term, all reading the row of distance d."""
        b = self.bucket.at(d, device)
        row = self.rows[..., b]  # (H, D) or (D,)
        row = row[:, None] if row.dim() == 2 else row  # (H, 1, D) or (D,), against x (B, H, keys, D)
        # vecdot, not x @ row: a batched matrix-vector product is several times slower on CPU.
        per_key = torch.linalg.vecdot(self.x[:, :, j0:j1], row)  # (B, H, j1 - j0)
        return per_key[:, :, None].expand(-1, -1, tq, -1)

    def _gather_rows(self, idx: Tensor, x: Tensor) -> Tensor:
        """(B, H, Tq, Tk) = x_(i or j)·rows[:, bucket(i, j)], without the table; x is the
        term's x, or the keys idx covers."""
        # Rows first: the encodings' rows are projections stored (R, H, D) or (R, D), so this is
        # a view and index_select copies whole rows (index_select, not rows[idx]: advanced
        # indexing is several times slower on CPU).
        rows = self.rows.movedim(-1, 0)  # (R, H, D) or (R, D)
        picked = rows.index_select(0, idx.flatten()).unflatten(0, idx.shape)  # (B|1, Tq, Tk, [H,] D)
        picked = picked.movedim(-2, 1) if rows.dim() == 3 else picked[:, None]  # (B|1, H|1, Tq, Tk, D)
        x = x[:, :, :, None] if self.side == "query" else x[:, :, None]  # (B, H, Tq, 1, D) or (B, H, 1, Tk, D)
        return torch.linalg.vecdot(picked, x)  # (B, H, Tq, Tk)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> Callable:
        """FlexAttention ``score_mod`` reading the table at (b, h, row, bucket)."""
        qb, kb = q_pos.shape[0] > 1, k_pos.shape[0] > 1
        table, query_side = self.table, self.side == "query"

        def mod(score, b, h, q_idx, kv_idx):
            r = self.bucket(q_pos[b if qb else 0, q_idx], k_pos[b if kb else 0, kv_idx])
            return score + table[b, h, q_idx if query_side else kv_idx, r].to(score.dtype)

        return mod


@dataclass(frozen=True, eq=False)
class ValueTerm:
    """Shaw et al.'s value term: ``out_i += sum_j p_ij · values[h, bucket(q_pos_i, k_pos_j)]``.

    ``values`` (H|1, R, Dv). Backends that do not expose the probabilities cannot take it.
    """

    values: Tensor
    bucket: BucketFn

    def dense_output(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B, H, Tq, Dv) from probs (B, H, Tq, Tk): probabilities summed per bucket, times values."""
        idx = self.bucket(q_pos[:, :, None], k_pos[:, None, :])  # (B|1, Tq, Tk)
        B, H, Tq, _ = probs.shape
        R = self.values.shape[-2]
        per_bucket = probs.new_zeros(B, H, Tq, R)
        per_bucket.scatter_add_(-1, idx[:, None].expand(B, H, -1, -1), probs)  # (B, H, Tq, R)
        return torch.matmul(per_bucket, self.values.to(probs.dtype))  # (B, H, Tq, Dv)


@dataclass(frozen=True, eq=False)
class DenseTerm:
    """A logit term given as its full (B|1, H, Tq, Tk) tensor (float32 or wider, logit units).

    For schemes with no bounded set of distinct distances (Transformer-XL's sinusoidal
    relative keys): they build the (Tq, Tk) tensor anyway, so a fused kernel only reads it.
    """

    logits: Tensor

    def dense(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The tensor itself, (B|1, H, Tq, Tk)."""
        return self.logits

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> Callable:
        """FlexAttention ``score_mod`` reading the tensor at (b, h, q_idx, kv_idx)."""
        logits, batched = self.logits, self.logits.shape[0] > 1

        def mod(score, b, h, q_idx, kv_idx):
            return score + logits[b if batched else 0, h, q_idx, kv_idx].to(score.dtype)

        return mod


@dataclass(frozen=True, eq=False)
class LogitsTerm:
    """An encoding's own logits in place of q·kᵀ: the layer's scaled logit is scale · logits_ij,
    not scale · q_i·k_j (PaTH's decoding step: q_iᵀ H_i ⋯ H_{j+1} k_j, from the keys its KV
    cache keeps carried through the Householders).

    ``logits`` (B, H, Tq, Tk), float32 or wider and unscaled; ``q`` (B, H, Tq, D), ``k``
    (B, H, Tk, D) and ``scale`` the attention call's own. Additive as every term: ``dense`` is
    the difference scale · (logits - q·kᵀ), which the eager reference, the fused function and
    flex add to their own scaled q·kᵀ; the planner's OWN_LOGITS leaf takes scale · logits
    as the logits and computes no q·kᵀ.
    """

    logits: Tensor
    q: Tensor
    k: Tensor
    scale: float

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors this term reads."""
        return (self.logits, self.q, self.k)

    def dense(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B, H, Tq, Tk): scale · (logits - q·kᵀ)."""
        return self.scale * (self.logits - self.q.to(self.logits.dtype) @ self.k.to(self.logits.dtype).mT)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> Callable:
        """FlexAttention ``score_mod`` reading the dense difference."""
        return DenseTerm(self.dense(q_pos, k_pos)).score_mod(q_pos, k_pos)


@dataclass(frozen=True, eq=False)
class PrefixSumTerm:
    """The sum of a per-token quantity g over the tokens between a key and its query, from the
    prefix sums c_t = sum_{l<=t} g_l (float32 or wider, logit units):

        key j at or before query i:  logit_ij += sum_{l=j+1}^{i} g_l = c_i - c_j
        key j after query i:         logit_ij += sum_{l=i+1}^{j} g'_l = c'_j - c'_i

    i and j are stream indices (the queries are the last Tq of the Tk keys, as in the mask).
    ``query`` (B, H, Tq) holds c at the queries and ``key`` (B, H, Tk) at the keys; ``after``
    the pair (c' at the queries, c' at the keys) of a second quantity for keys after the
    query, or None to use g itself there (``c_j - c_i``, the mirror image). FoX's log forget
    gates (:mod:`posenc.relative.fox`) are such a g. The term is rank structured: its
    ``score_mod`` and :func:`posenc.backends.fused.fused_attention` read the (B, H, T) sums,
    and only ``dense`` (the eager reference) builds a (Tq, Tk) tensor.
    """

    query: Tensor
    key: Tensor
    after: tuple[Tensor, Tensor] | None = None

    def tensors(self) -> tuple[Tensor, ...]:
        """The prefix sums this term reads."""
        return (self.query, self.key) + (() if self.after is None else self.after)

    def dense(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B, H, Tq, Tk): the two broadcast differences, chosen by stream order."""
        Tq, Tk = self.query.shape[-1], self.key.shape[-1]
        before = self.query[..., :, None] - self.key[..., None, :]  # (B, H, Tq, Tk): c_i - c_j
        if self.after is None:
            after = -before  # c_j - c_i
        else:
            after = self.after[1][..., None, :] - self.after[0][..., :, None]  # c'_j - c'_i
        device = self.query.device
        at_or_before = torch.arange(Tk, device=device) <= torch.arange(Tk - Tq, Tk, device=device)[:, None]  # (Tq, Tk)
        return torch.where(at_or_before, before, after)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> Callable:
        """FlexAttention ``score_mod`` reading the prefix sums at (b, h, q_idx) and (b, h, kv_idx)."""
        cq, ck, after = self.query, self.key, self.after
        offset = ck.shape[-1] - cq.shape[-1]  # query i is stream index offset + i

        def mod(score, b, h, q_idx, kv_idx):
            before = cq[b, h, q_idx] - ck[b, h, kv_idx]
            later = -before if after is None else after[1][b, h, kv_idx] - after[0][b, h, q_idx]
            return score + torch.where(kv_idx <= q_idx + offset, before, later).to(score.dtype)

        return mod


Term = (BiasTerm | TableTerm | ValueTerm | DenseTerm | LogitsTerm | PrefixSumTerm | CountTerm | StickBreakingTerm
        | StickTerm | HouseholderTerm)


def dense_logit_terms(terms: list[Term], q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
    """The sum of the logit terms' dense forms (ValueTerms skipped), or None if there are none."""
    total: Tensor | None = None
    for t in terms:
        if isinstance(t, ValueTerm):
            continue
        d = t.dense(q_pos, k_pos)
        total = d if total is None else total + d
    return total
