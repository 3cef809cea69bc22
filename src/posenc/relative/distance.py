"""Content-dependent relative terms without a (T, T, D) tensor: skew and gather.

Shapes: B batch, H heads, Tq queries, Tk keys, D head dim, W rows of a distance table.

A content-dependent relative term has the form ``x_i · r[f(q_pos_i - k_pos_j)]``: a query
(or key) vector against the table row of the pair's (clipped, bucketed) distance. Spelling
it out builds a (Tq, Tk, D) tensor of rows (HF BERT's ``relative_key``). Instead:

1. multiply x by the W rows of the distances that occur: (B, H, T, D) @ (D, W) -> (B, H, T, W);
2. move each (i, distance) score to its (i, j) pair:

   * **skew** (Huang et al. 2018, Music Transformer; Dai et al. 2019's ``_rel_shift``) when
     every row is contiguous (``q_pos = a + arange(Tq)``, ``k_pos = c + arange(Tk)``, the same
     ``a - c`` for every batch row): the pair (i, j) has distance ``s + i - j``, so with the
     Tq + Tk - 1 distances in descending order the (Tq, Tk) result is a strided view of the
     (Tq, Tq + Tk - 1) scores. It is done per block of queries, each block skewed straight
     into a preallocated (B, H, Tq, Tk) output, so the peak is the output plus one block;
   * **gather** otherwise (packed documents, padding, per-row KV-cache offsets): the column of
     each pair's actual distance, from a (B, Tq, Tk) index.

**Saturation.** Every clipped or bucketed table is constant beyond two distances ``lo < hi``
(the encoding's ``bounds``, config constants): ``f(d) = f(hi)`` for d >= hi and ``f(lo)`` for
d <= lo. Then only the W <= hi - lo + 1 rows in between are multiplied; on the skew path the
columns past them are a broadcast of the boundary column (``expand``), so a clip of k costs
a (2k + 1)-column matmul instead of 2T - 1. On the gather path the index is
``clamp(d, lo, hi) - lo``: no data-dependent shape, so it compiles with ``dynamic=True``.

Memory is O(B·H·Tq·Tk + B·H·block·(block + Tk)), never O(T²·D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from ..positions import contiguous_offset, relative_positions
from ..terms import SaturatingBucket

__all__ = ["DistanceBucket", "LookupBucket", "RelativeLayout", "saturation_bounds", "skew", "unskew", "uniform_offset"]

# Queries per block on the skew path: the scratch of one block is (B, H, BLOCK, BLOCK + Tk - 1),
# about BLOCK / Tq of the output, and unclipped tables multiply 1 + BLOCK / Tq times the q·k^T
# flops. 128 rows keep both small at T >= 1024 and the matmuls large enough to run at speed.
BLOCK = 128


@dataclass(frozen=True)
class DistanceBucket(SaturatingBucket):
    """``bucket(q_pos, k_pos) = clamp(q_pos - k_pos, lo, hi) - lo``: the row of a table whose
    row r holds distance ``lo + r`` (distances beyond [lo, hi] share the boundary rows).

    The bucket function of a :class:`~posenc.terms.TableTerm` / :class:`~posenc.terms.ValueTerm`
    for clipped tables (Shaw, relative_key: ``lo = -clip, hi = clip``) and for a table over
    the distances that occur (Transformer-XL). Pointwise and broadcasting, so it serves the
    dense gather, the fused kernel and a FlexAttention ``score_mod``; equal by value, so terms
    of one encoding share one index per block.
    """

    lo: int
    hi: int

    def __call__(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return (q_pos - k_pos).clamp(self.lo, self.hi) - self.lo


@dataclass(frozen=True, eq=False)
class LookupBucket(SaturatingBucket):
    """``bucket(q_pos, k_pos) = lut[clamp(q_pos - k_pos, lo, hi) - lo]``: a bucketing that is
    constant beyond [lo, hi] (DeBERTa's log buckets), read from a table of its values
    ``lut`` (hi - lo + 1,) int64 instead of recomputing logarithms for every pair."""

    lut: Tensor
    lo: int
    hi: int

    def __call__(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.lut[(q_pos - k_pos).clamp(self.lo, self.hi) - self.lo]


# The Toeplitz test lives with the positions; the relative schemes use it under this name.
uniform_offset = contiguous_offset


def skew(scores: Tensor, tk: int) -> Tensor:
    """(..., Tq, Tq + Tk - 1) -> (..., Tq, Tk) with ``out[i, j] = scores[i, Tq - 1 - i + j]``.

    Column c of ``scores`` holds index difference ``i - j = Tq - 1 - c`` (descending). The
    result is a view: in the flattened (Tq * R) scores, (i, Tq - 1 - i + j) sits at
    ``(Tq - 1) + i * (R - 1) + j``, i.e. rows of stride R - 1 after dropping Tq - 1 entries.
    """
    tq, r = scores.shape[-2:]
    if r != tq + tk - 1:
        raise ValueError(f"skew needs Tq + Tk - 1 = {tq + tk - 1} columns, got {r}")
    if tq == 1:
        return scores
    flat = scores.contiguous().flatten(-2)  # (..., Tq * R)
    return flat.narrow(-1, tq - 1, tq * (r - 1)).unflatten(-1, (tq, r - 1)).narrow(-1, 0, tk)  # (..., Tq, Tk)


def unskew(pairs: Tensor, r: int) -> Tensor:
    """The adjoint of :func:`skew`: (..., Tq, Tk) -> (..., Tq, R) with ``out[i, Tq - 1 - i + j] = pairs[i, j]``.

    Every other entry is zero; used to sum attention probabilities per distance.
    """
    tq, tk = pairs.shape[-2:]
    if r != tq + tk - 1:
        raise ValueError(f"unskew needs R = Tq + Tk - 1 = {tq + tk - 1}, got {r}")
    if tq == 1:
        return pairs
    z = F.pad(pairs, (0, r - 1 - tk))  # (..., Tq, R - 1)
    z = F.pad(z.flatten(-2), (tq - 1, 1))  # (..., Tq * R)
    return z.unflatten(-1, (tq, r))  # (..., Tq, R)


@dataclass(frozen=True)
class _Block:
    """Rows [i0, i1) of a skew: ``lead`` + ``mid`` + ``trail`` = i1 - i0 + Tk - 1 distance
    columns, the mid ones being table columns [c0, c0 + mid); lead (trail) columns repeat
    table column 0 (W - 1), the saturated end. With mid = 0, [c0, c1) is that one column."""

    i0: int
    i1: int
    lead: int
    mid: int
    trail: int
    c0: int
    c1: int

    def spread(self, cols: Tensor, scratch: Tensor) -> Tensor:
        """Table-column scores (B, H, rows, c1 - c0) -> the block's skew input (B, H, rows, lead + mid + trail).

        Written into the flat ``scratch`` (reused by every block): copying the broadcast ends
        into slices is several times faster than ``torch.cat`` of expanded tensors, and a
        buffer that is reused does not page-fault again.
        """
        if not (self.lead or self.trail):
            return cols
        B, H, rows = cols.shape[:3]
        n = self.lead + self.mid + self.trail
        out = scratch[: B * H * rows * n].view(B, H, rows, n)  # (B, H, rows, n), contiguous
        if self.lead:
            out[..., : self.lead].copy_(cols[..., :1].expand(B, H, rows, self.lead))
        if self.mid:
            out[..., self.lead : self.lead + self.mid].copy_(cols)
        if self.trail:
            out[..., n - self.trail :].copy_(cols[..., -1:].expand(B, H, rows, self.trail))
        return out

    def fold(self, mass: Tensor) -> Tensor:
        """The adjoint of :meth:`spread`: sum the saturated columns into their table column."""
        if not (self.lead or self.trail):
            return mass
        if not self.mid:
            return mass.sum(-1, keepdim=True)
        mid = mass[..., self.lead : self.lead + self.mid]
        if self.lead:
            mid = mid + F.pad(mass[..., : self.lead].sum(-1, keepdim=True), (0, self.mid - 1))
        if self.trail:
            mid = mid + F.pad(mass[..., self.lead + self.mid :].sum(-1, keepdim=True), (self.mid - 1, 0))
        return mid


@dataclass(frozen=True)
class _Skew:
    """Skew geometry: pair (i, j) of a (t, tc) result has raw distance ``s + i - j``; the
    table columns are raw distances top, top - 1, ..., bottom (saturated beyond)."""

    t: int
    tc: int
    s: int
    top: int
    bottom: int

    def blocks(self, block: int) -> Iterator[_Block]:
        width = self.top - self.bottom + 1
        for i0 in range(0, self.t, block):
            i1 = min(i0 + block, self.t)
            r = i1 - i0 + self.tc - 1
            hi, lo = self.s + i1 - 1, self.s + i0 - self.tc + 1  # raw distances of columns 0 and r - 1
            lead = min(max(hi - self.top, 0), r)
            trail = min(max(self.bottom - lo, 0), r)
            mid = r - lead - trail
            if mid:
                c0 = self.top - min(hi, self.top)
                yield _Block(i0, i1, lead, mid, trail, c0, c0 + mid)
            else:
                c0 = 0 if lead else width - 1
                yield _Block(i0, i1, lead, 0, trail, c0, c0 + 1)


def saturation_bounds(canon: Callable[[Tensor], Tensor], top: int, bottom: int, limit: int = 2**40) -> tuple[int, int] | None:
    """``(lo, hi)`` with ``canon(d) == bottom`` for d <= lo and ``canon(d) == top`` for d >= hi.

    ``canon`` must be monotone non-decreasing (a clamped bucketing). Found by bisection on
    [0, limit]; None when canon has not reached ``top``/``bottom`` by +-limit.
    """
    f = lambda d: int(canon(torch.tensor([d]))[0])  # noqa: E731
    if f(limit) != top or f(-limit) != bottom:
        return None
    a, b = 0, limit  # smallest d >= 0 with f(d) == top
    while a < b:
        m = (a + b) // 2
        a, b = (a, m) if f(m) == top else (m + 1, b)
    hi = a
    a, b = -limit, 0  # largest d <= 0 with f(d) == bottom
    while a < b:
        m = (a + b + 1) // 2
        a, b = (m, b) if f(m) == bottom else (a, m - 1)
    return a, hi


def _clamp(x: int, lo: int | None, hi: int | None) -> int:
    return x if lo is None else max(lo, min(hi, x))


@dataclass
class RelativeLayout:
    """Which table rows a (q_pos, k_pos) pair set needs, and how scores map back to pairs.

    Build with :meth:`build`. ``distances`` (W,) are the canonical distances (after the
    encoding's clipping/bucketing ``canon``) whose rows the query-side scores use, in column
    order; :meth:`key_distances` is the order for key-side scores. ``index`` (B|1, Tq, Tk) is
    the column of each pair on the gather path and None on the skew path.

    The rows are passed transposed, ``(D, W)`` (shared by heads) or ``(H, D, W)``, already
    scaled: :meth:`query_pairs` and :meth:`key_pairs` do the matmul themselves, so the skew
    path can multiply one block of queries at a time.
    """

    tq: int
    tk: int
    distances: Tensor
    index: Tensor | None
    geometry: _Skew | None = None
    block: ClassVar[int] = BLOCK  # queries per block on the skew path

    @classmethod
    def build(
        cls,
        q_pos: Tensor,
        k_pos: Tensor,
        canon: Callable[[Tensor], Tensor] | None = None,
        bounds: tuple[int, int] | None = None,
    ) -> "RelativeLayout":
        """Layout for distances ``canon(q_pos_i - k_pos_j)`` (canon: elementwise, e.g. a clamp).

        ``bounds = (lo, hi)``: canon is constant for d <= lo and for d >= hi (see the module
        docstring); None for an unbounded table (then the gather path reads the distances'
        range from the data, which ``torch.compile`` cannot trace with dynamic shapes).
        """
        canon = (lambda d: d) if canon is None else canon
        lo, hi = bounds if bounds is not None else (None, None)
        tq, tk = q_pos.shape[1], k_pos.shape[1]
        device = q_pos.device
        s = uniform_offset(q_pos, k_pos)
        if s is not None:
            top, bottom = _clamp(s + tq - 1, lo, hi), _clamp(s - tk + 1, lo, hi)
            d = torch.arange(top, bottom - 1, -1, device=device)  # (W,), descending: the skew's order
            return cls(tq, tk, canon(d), None, _Skew(tq, tk, s, top, bottom))
        d = relative_positions(q_pos, k_pos)  # (B|1, Tq, Tk)
        if bounds is None:
            # No pairs (Tq or Tk = 0): one placeholder row; the results are empty anyway.
            lo, hi = (int(d.min()), int(d.max())) if d.numel() else (0, 0)
        else:
            d = d.clamp(lo, hi)
        return cls(tq, tk, canon(torch.arange(lo, hi + 1, device=device)), d - lo)

    @property
    def num_rows(self) -> int:
        return self.distances.shape[0]

    def key_distances(self) -> Tensor:
        """Row order for key-side scores (``k_j · r[d(i, j)]``): reversed on the skew path."""
        return self.distances.flip(0) if self.index is None else self.distances

    def key_order(self, cols: Tensor) -> Tensor:
        """Columns (..., W) given in :attr:`distances` order, put in :meth:`key_distances` order."""
        return cols.flip(-1) if self.index is None else cols

    def _key_geometry(self) -> _Skew:
        # From the key's side pair (j, i) has raw distance -s + j - i; the key columns are the
        # query columns reversed (see key_distances).
        g = self.geometry
        return _Skew(g.tc, g.t, -g.s, -g.bottom, -g.top)

    def query_pairs(self, x: Tensor, rows: Tensor, out: Tensor | None = None) -> Tensor:
        """``x_i · rows[:, col(i, j)]``: x (B, H, Tq, D), rows (D, W) or (H, D, W) -> (B, H, Tq, Tk).

        With ``out`` the result is added into it (in place) and ``out`` is returned.
        """
        if self.index is None:
            return self._skew_pairs(x, rows, self.geometry, out, transpose=False)
        scores = x @ rows  # (B, H, Tq, W)
        B, H = scores.shape[:2]
        idx = self.index[:, None].expand(B, H, self.tq, self.tk)  # (B, H, Tq, Tk)
        res = scores.gather(-1, idx)
        return res if out is None else out.add_(res)

    def key_pairs(self, x: Tensor, rows: Tensor, out: Tensor | None = None) -> Tensor:
        """``x_j · rows[:, col(i, j)]`` with columns in :meth:`key_distances` order:
        x (B, H, Tk, D) -> (B, H, Tq, Tk), added into ``out`` when given."""
        if self.index is None:
            if self.tq == 1:
                return self._one_query_key_pairs(x, rows, out)
            return self._skew_pairs(x, rows, self._key_geometry(), out, transpose=True)
        scores = x @ rows  # (B, H, Tk, W)
        B, H = scores.shape[:2]
        idx = self.index.transpose(1, 2)[:, None].expand(B, H, self.tk, self.tq)  # (B, H, Tk, Tq)
        res = scores.gather(-1, idx).transpose(-1, -2)
        return res if out is None else out.add_(res)

    def _one_query_key_pairs(self, x: Tensor, rows: Tensor, out: Tensor | None) -> Tensor:
        """:meth:`key_pairs` for one query (a decoding step): each key needs one column.

        The skew would multiply every block of 128 keys by 128 columns to keep one diagonal;
        here key j reads its column directly, O(Tk·D) per head. Pair (0, j) has raw distance
        s - j, clamped to the table's [bottom, top]; in key order column c is distance bottom + c.
        """
        g = self.geometry
        j = torch.arange(self.tk, device=x.device)
        col = (g.s - j).clamp(g.bottom, g.top) - g.bottom  # (Tk,)
        r = rows.index_select(-1, col).transpose(-1, -2)  # (Tk, D) or (H, Tk, D)
        res = (x * r).sum(-1, dtype=torch.promote_types(x.dtype, rows.dtype))[..., None, :]  # (B, H, 1, Tk)
        return res if out is None else out.add_(res)

    def _skew_pairs(self, x: Tensor, rows: Tensor, g: _Skew, out: Tensor | None, transpose: bool) -> Tensor:
        B, H = x.shape[:2]
        dtype = torch.promote_types(x.dtype, rows.dtype)
        accumulate = out is not None
        if out is None:
            out = x.new_empty(B, H, self.tq, self.tk, dtype=dtype)  # (B, H, Tq, Tk)
        # A narrow table (clipped, W < T): all scores at once, (B, H, T, W), then sliced per
        # block. A wide one (unclipped, W ~ 2T): one block's columns at a time.
        narrow = 2 * rows.shape[-1] < g.t + g.tc
        scores = x @ rows if narrow else None  # (B, H, T, W)
        rows = rows.contiguous()
        block = min(self.block, g.t)
        scratch = x.new_empty(B * H * block * (block + g.tc - 1), dtype=dtype)
        for blk in g.blocks(self.block):
            if narrow:
                cols = scores[..., blk.i0 : blk.i1, blk.c0 : blk.c1]  # (B, H, rows, c1 - c0)
            else:
                cols = x[..., blk.i0 : blk.i1, :] @ rows[..., blk.c0 : blk.c1]
            pairs = skew(blk.spread(cols, scratch), g.tc)  # (B, H, rows, tc)
            if transpose:  # key blocks are columns of the output
                dst, pairs = out[..., blk.i0 : blk.i1], pairs.transpose(-1, -2)  # (B, H, Tq, rows)
            else:
                dst = out[..., blk.i0 : blk.i1, :]  # (B, H, rows, Tk)
            if accumulate:
                dst.add_(pairs)
            else:
                dst.copy_(pairs)
        return out

    def query_output(self, probs: Tensor, rows: Tensor) -> Tensor:
        """``sum_j probs_ij · rows[col(i, j)]``: probs (B, H, Tq, Tk), rows (W, D) -> (B, H, Tq, D).

        The adjoint of :meth:`query_pairs` (Shaw's value term): per query, the probability
        mass of each table row, times the rows.
        """
        B, H = probs.shape[:2]
        if self.index is not None:
            idx = self.index[:, None].expand(B, H, self.tq, self.tk)  # (B, H, Tq, Tk)
            mass = probs.new_zeros(B, H, self.tq, self.num_rows).scatter_add(-1, idx, probs)  # (B, H, Tq, W)
            return mass @ rows
        g = self.geometry
        out = probs.new_empty(B, H, self.tq, rows.shape[-1], dtype=torch.promote_types(probs.dtype, rows.dtype))
        for blk in g.blocks(self.block):
            p = probs[..., blk.i0 : blk.i1, :]  # (B, H, rows, Tk)
            mass = blk.fold(unskew(p, p.shape[-2] + g.tc - 1))  # (B, H, rows, c1 - c0)
            out[..., blk.i0 : blk.i1, :] = mass @ rows[blk.c0 : blk.c1]
        return out
