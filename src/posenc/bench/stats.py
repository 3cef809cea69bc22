"""Statistics over seeds: mean ± std, reciprocal ranks, bootstrap intervals of the MRR.

The unit of the ranking is a **cell**: one (task, seed). Within a cell every encoding has one
score (its beyond-L metric of that seed's run), the encodings are ranked (ties share the best
rank) and each gets ``1 / rank``. An encoding's mean reciprocal rank (MRR) is the mean of its
reciprocal ranks over the cells; with one seed this is Kazemnejad et al. (2023, Fig. 3)'s
ranking over tasks.

Intervals are percentile bootstrap intervals (Efron & Tibshirani 1993, ch. 13): a replicate
draws as many cells as there are, with replacement, from all (task, seed) cells, and
recomputes every encoding's MRR over the drawn cells. The replicates are *paired*: every
encoding is scored on the same drawn cells, so the interval of a difference of two MRRs
accounts for the cells both were ranked in. A difference is called significant when its
interval excludes 0. The resampling is seeded (``seed``), so the same results always give
the same intervals.

With few cells (3 tasks × 3 seeds = 9) the intervals are coarse and the reciprocal ranks take
few values: read them as "clearly apart" or "not", not as exact coverage.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import torch

from ..config import check_int, check_range

__all__ = ["mean_std", "reciprocal_ranks", "bootstrap_indices", "MRRInterval", "PairDifference",
           "bootstrap_mrr", "bootstrap_mean", "DEFAULT_RESAMPLES", "DEFAULT_CONFIDENCE", "DEFAULT_BOOTSTRAP_SEED"]

DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP_SEED = 0


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1) over seeds; std 0.0 for one value.

    NaN (both) when ``xs`` is empty or any value is NaN: a missing value (a RoPE-scaling
    variant has no within-L point) or a diverged run makes the cell undefined rather than
    silently averaged over the seeds that have it. (``statistics.stdev`` itself raises an
    AttributeError on NaN, from its exact-fraction arithmetic.)
    """
    if not xs or any(math.isnan(x) for x in xs):
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def reciprocal_ranks(scores: Mapping[str, float], *, lower_is_better: bool) -> dict[str, float]:
    """``1 / rank`` of each encoding in one cell; ties share the best rank; NaN ranks last."""
    sign = 1.0 if lower_is_better else -1.0
    key = {e: (sign * v if not math.isnan(v) else math.inf) for e, v in scores.items()}
    return {e: 1.0 / (1 + sum(k < key[e] for k in key.values())) for e in scores}


def bootstrap_indices(n_cells: int, resamples: int, seed: int) -> torch.Tensor:
    """(resamples, n_cells) int64 cell indices drawn with replacement from a seeded CPU generator."""
    check_int("n_cells", n_cells, minimum=1)
    check_int("resamples", resamples, minimum=1)
    check_int("seed", seed, minimum=0)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_cells, (resamples, n_cells), generator=g)


@dataclass(frozen=True)
class MRRInterval:
    """An encoding's MRR over all cells and its bootstrap interval."""

    encoding: str
    mrr: float
    low: float
    high: float

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PairDifference:
    """MRR(first) - MRR(second), paired over cells, with its bootstrap interval."""

    first: str
    second: str
    diff: float
    low: float
    high: float

    @property
    def significant(self) -> bool:
        """The interval excludes 0."""
        return self.low > 0 or self.high < 0

    def to_json(self) -> dict:
        return dict(asdict(self), significant=self.significant)


def bootstrap_mrr(
    rr: Mapping[str, Sequence[float]],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> tuple[list[MRRInterval], list[PairDifference]]:
    """Bootstrap intervals of each encoding's MRR and of every pairwise difference.

    Args:
        rr: encoding -> its reciprocal rank in each cell, the cells in the same order for
            every encoding (a paired design: cell i is the same (task, seed) for all).
        resamples: bootstrap replicates.
        confidence: the interval's level, in (0, 1); the bounds are the (1 - c) / 2 and
            (1 + c) / 2 quantiles of the replicates (linear interpolation, as ``torch.quantile``).
        seed: the resampling generator's seed.

    Returns:
        the intervals, best MRR first, and the differences of every pair (first is the
        encoding with the higher MRR, in that order).
    """
    if not isinstance(rr, Mapping) or not rr:
        raise ValueError(f"rr must be a non-empty mapping encoding -> reciprocal ranks, got {rr!r}")
    lengths = {e: len(v) for e, v in rr.items()}
    if len(set(lengths.values())) != 1 or 0 in lengths.values():
        raise ValueError(f"rr: every encoding needs one reciprocal rank per cell (the same number, >= 1), got {lengths}")
    check_int("resamples", resamples, minimum=1)
    check_int("seed", seed, minimum=0)
    check_range("confidence", confidence, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    names = list(rr)
    table = torch.tensor([list(rr[e]) for e in names], dtype=torch.float64)  # (E, cells)
    bad = [e for e, row in zip(names, table) if not torch.isfinite(row).all()]
    if bad:
        raise ValueError(f"rr: reciprocal ranks must be finite numbers in (0, 1]; {bad[0]!r} has {list(rr[bad[0]])}")
    idx = bootstrap_indices(table.shape[1], resamples, seed)  # (R, cells)
    reps = table[:, idx].mean(dim=2)  # (E, R): each encoding's MRR on the same drawn cells
    point = table.mean(dim=1)  # (E,)
    q = torch.tensor([(1 - confidence) / 2, (1 + confidence) / 2], dtype=torch.float64)
    bounds = torch.quantile(reps, q, dim=1)  # (2, E)
    order = sorted(range(len(names)), key=lambda i: (-float(point[i]), names[i]))
    intervals = [MRRInterval(names[i], float(point[i]), float(bounds[0, i]), float(bounds[1, i])) for i in order]
    pairs = []
    for a_pos, i in enumerate(order):
        for j in order[a_pos + 1:]:
            lo, hi = torch.quantile(reps[i] - reps[j], q).tolist()
            pairs.append(PairDifference(names[i], names[j], float(point[i] - point[j]), lo, hi))
    return intervals, pairs



def bootstrap_mean(
    values: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` (one per cell, e.g. paired differences of two
    encodings' scores in each (task, seed) cell) and its percentile bootstrap interval, resampling
    the cells as :func:`bootstrap_mrr` does (the same generator, so the same cells are drawn)."""
    xs = torch.tensor(list(values), dtype=torch.float64)
    if xs.dim() != 1 or not len(xs):
        raise ValueError(f"values must be a non-empty sequence of numbers, got {values!r}")
    if not torch.isfinite(xs).all():
        raise ValueError(f"values must be finite, got {list(values)}")
    check_range("confidence", confidence, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    reps = xs[bootstrap_indices(len(xs), resamples, seed)].mean(dim=1)  # (R,)
    q = torch.tensor([(1 - confidence) / 2, (1 + confidence) / 2], dtype=torch.float64)
    low, high = torch.quantile(reps, q).tolist()
    return float(xs.mean()), low, high
