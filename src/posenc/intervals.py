"""Confidence intervals for the real-model measurements: a proportion's (accuracy over a few
prompts) and a perplexity's over the tokens of a window.

* :func:`wilson`: the Wilson score interval of k successes in n trials (Wilson 1927). Unlike
  the normal approximation it stays inside [0, 1] and is not degenerate at 0/n or n/n, which is
  where a handful of passkey prompts lands most often.
* :func:`block_bootstrap_ppl`: the perplexity exp(mean NLL) of a token sequence and its
  percentile interval under the non-overlapping block bootstrap (Künsch 1989; Efron &
  Tibshirani 1993, ch. 8.6): the sequence is cut into blocks of ``block``
  consecutive tokens, blocks are drawn with replacement, and the statistic is recomputed. Blocks,
  not tokens, because neighbouring tokens' losses are correlated (a hard identifier costs several
  tokens): a token-level bootstrap would make the interval too narrow.

Both are deterministic for a given seed; they use torch only (no scipy).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .config import check_int, check_range

__all__ = ["Z95", "block_bootstrap_ppl", "wilson"]

#: the standard normal quantile of a two-sided 95 % interval
Z95 = 1.959963984540054


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (low, high) of ``successes`` out of ``trials`` (z: 1.96 for 95 %)."""
    check_int("trials", trials, minimum=1)
    check_int("successes", successes, minimum=0, maximum=trials)
    check_range("z", z, 0.0)
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))  # rounding: 0/n ends at 0, n/n at 1


def block_bootstrap_ppl(nll: Tensor, block: int = 256, reps: int = 1000, seed: int = 0,
                        confidence: float = 0.95) -> tuple[float, float, float]:
    """(perplexity, low, high) of per-token negative log-likelihoods ``nll`` (1-D, nats): the
    perplexity exp(mean) and the percentile interval of exp(mean) over ``reps`` resamples of
    whole blocks of ``block`` tokens (a shorter last block is kept as it is, weighted by its
    length). NaN losses (a diverged row) give NaN everywhere."""
    if nll.dim() != 1 or nll.numel() == 0:
        raise ValueError(f"nll must be a non-empty 1-D tensor of per-token losses, got shape {tuple(nll.shape)}")
    check_int("block", block, minimum=1)
    check_int("reps", reps, minimum=1)
    check_range("confidence", confidence, 0.0, 1.0)
    x = nll.detach().to(torch.float64).cpu()
    ppl = x.mean().exp().item()  # inf past ~709.8 nats (math.exp raises OverflowError): NaN below
    if not math.isfinite(ppl):
        return float("nan"), float("nan"), float("nan")
    sums = torch.stack([c.sum() for c in x.split(block)])  # (blocks,)
    sizes = torch.tensor([c.numel() for c in x.split(block)], dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(len(sums), (reps, len(sums)), generator=g)  # (reps, blocks)
    stats = (sums[pick].sum(1) / sizes[pick].sum(1)).exp()  # (reps,)
    tail = (1.0 - confidence) / 2
    low, high = torch.quantile(stats, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    return ppl, low, high
