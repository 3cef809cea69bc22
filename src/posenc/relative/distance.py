"""Content-dependent relative terms without a (T, T, D) tensor: skew and gather.

Shapes: B batch, H heads, Tq queries, Tk keys, D head dim, R rows of a distance table.

A content-dependent relative term has the form ``x_i · r[f(q_pos_i - k_pos_j)]``: a query
(or key) vector against the table row of the pair's (clipped, bucketed) distance. Spelling
it out builds a (Tq, Tk, D) tensor of rows (HF BERT's ``relative_key``). Instead:

1. multiply x by the R rows of the distances that occur: (B, H, T, D) @ (D, R) -> (B, H, T, R);
2. move each (i, distance) score to its (i, j) pair:

   * **skew** (Huang et al. 2018, Music Transformer; Dai et al. 2019's ``_rel_shift``) when
     every row is contiguous (``q_pos = a + arange(Tq)``, ``k_pos = c + arange(Tk)``, the same
     ``a - c`` for every batch row): the pair (i, j) has distance ``s + i - j``, so with the
     R = Tq + Tk - 1 distances in descending order the (Tq, Tk) result is a strided *view* of
     the (Tq, R) scores — no index tensor, no copy;
   * **gather** otherwise (packed documents, padding, per-row KV-cache offsets): the column of
     each pair's actual distance, from a (B, Tq, Tk) index.

Memory is O(B·H·T·R + B·T²), never O(T²·D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..positions import relative_positions

__all__ = ["RelativeLayout", "skew", "unskew", "uniform_offset"]


def uniform_offset(q_pos: Tensor, k_pos: Tensor) -> int | None:
    """``s`` when ``q_pos_i - k_pos_j == s + i - j`` for every batch row, else None.

    q_pos (B, Tq), k_pos (B or 1, Tk). True for plain batches, cross-attention between two
    contiguous ranges and KV-cache decoding with one offset for the batch.
    """
    if torch.compiler.is_compiling() or q_pos.shape[1] == 0 or k_pos.shape[1] == 0:
        return None
    ok = torch.ones((), dtype=torch.bool, device=q_pos.device)
    for pos in (q_pos, k_pos):
        if pos.shape[1] > 1:
            ok = ok & (pos.diff(dim=1) == 1).all()
    off = q_pos[:, 0] - k_pos[:, 0]  # (B,)
    ok = ok & (off == off[0]).all()
    return int(off[0]) if bool(ok) else None


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


@dataclass
class RelativeLayout:
    """Which table rows a (q_pos, k_pos) pair set needs, and how scores map back to pairs.

    Build with :meth:`build`. ``distances`` (R,) are the canonical distances (after the
    encoding's clipping/bucketing ``canon``) whose rows the query-side scores use, in column
    order; ``index`` (B|1, Tq, Tk) is the column of each pair on the gather path and None on
    the skew path.
    """

    tq: int
    tk: int
    distances: Tensor
    index: Tensor | None

    @classmethod
    def build(cls, q_pos: Tensor, k_pos: Tensor, canon: Callable[[Tensor], Tensor] | None = None) -> "RelativeLayout":
        """Layout for distances ``canon(q_pos_i - k_pos_j)`` (canon: elementwise, e.g. a clamp)."""
        canon = (lambda d: d) if canon is None else canon
        tq, tk = q_pos.shape[1], k_pos.shape[1]
        s = uniform_offset(q_pos, k_pos)
        if s is not None:
            # Descending distances s + Tq - 1, ..., s - (Tk - 1): the skew's column order.
            d = s + torch.arange(tq - 1, -tk, -1, device=q_pos.device)  # (Tq + Tk - 1,)
            return cls(tq, tk, canon(d), None)
        d = canon(relative_positions(q_pos, k_pos))  # (B|1, Tq, Tk)
        lo, hi = int(d.min()), int(d.max())
        return cls(tq, tk, torch.arange(lo, hi + 1, device=q_pos.device), d - lo)

    @property
    def num_rows(self) -> int:
        return self.distances.shape[0]

    def key_distances(self) -> Tensor:
        """Row order for key-side scores (``k_j · r[d(i, j)]``): reversed on the skew path."""
        return self.distances.flip(0) if self.index is None else self.distances

    def query_pairs(self, scores: Tensor) -> Tensor:
        """scores (B, H, Tq, R) against rows of ``distances`` -> (B, H, Tq, Tk)."""
        if self.index is None:
            return skew(scores, self.tk)
        B, H = scores.shape[:2]
        idx = self.index[:, None].expand(B, H, self.tq, self.tk)  # (B, H, Tq, Tk)
        return scores.gather(-1, idx)

    def key_pairs(self, scores: Tensor) -> Tensor:
        """scores (B, H, Tk, R) against rows of ``key_distances()`` -> (B, H, Tq, Tk)."""
        if self.index is None:
            # From the key's side the index difference is j - i: a skew of (Tk, Tq).
            return skew(scores, self.tq).transpose(-1, -2)
        B, H = scores.shape[:2]
        idx = self.index.transpose(1, 2)[:, None].expand(B, H, self.tk, self.tq)  # (B, H, Tk, Tq)
        return scores.gather(-1, idx).transpose(-1, -2)

    def query_buckets(self, probs: Tensor) -> Tensor:
        """probs (B, H, Tq, Tk) -> (B, H, Tq, R): per query, the sum of probs per table column."""
        if self.index is None:
            return unskew(probs, self.num_rows)
        B, H = probs.shape[:2]
        idx = self.index[:, None].expand(B, H, self.tq, self.tk)  # (B, H, Tq, Tk)
        return probs.new_zeros(B, H, self.tq, self.num_rows).scatter_add(-1, idx, probs)
