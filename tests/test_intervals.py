"""posenc.intervals: the Wilson interval against the roots of its defining quadratic (found by
bisection, not by the closed form) and against published values; the block bootstrap against a
slow loop that draws the same block indices one resample at a time, and against normal theory.

Neither statsmodels nor scipy is a dependency, so the Wilson reference is computed here by
another route: the interval is the set of p with (p_hat - p)^2 <= z^2 p (1 - p) / n (Wilson
1927), whose ends are the roots of that quadratic on either side of p_hat.
"""

from __future__ import annotations

import math

import pytest
import torch

from posenc.intervals import Z95, block_bootstrap_ppl, wilson


def wilson_by_bisection(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The two roots in [0, 1] of f(p) = (p_hat - p)^2 - z^2 p (1 - p) / n: f(p_hat) <= 0 while
    f(0), f(1) >= 0, so one root lies in [0, p_hat] and one in [p_hat, 1]."""
    p_hat = k / n

    def f(p: float) -> float:
        return (p_hat - p) ** 2 - z * z * p * (1 - p) / n

    def bisect(outside: float, inside: float) -> float:  # f(outside) >= 0 >= f(inside)
        if f(outside) == 0.0:
            return outside
        for _ in range(200):
            mid = (outside + inside) / 2
            if f(mid) > 0:
                outside = mid
            else:
                inside = mid
        return (outside + inside) / 2

    return bisect(0.0, p_hat), bisect(1.0, p_hat)


CASES = [(k, n) for n in (1, 2, 3, 5, 10, 37, 100, 1000) for k in sorted({0, 1, n // 3, n // 2, n - 1, n})]


@pytest.mark.parametrize("k,n", CASES)
def test_wilson_is_the_root_pair_of_its_quadratic(k, n):
    low, high = wilson(k, n)
    ref_low, ref_high = wilson_by_bisection(k, n)
    assert low == pytest.approx(ref_low, abs=1e-12) and high == pytest.approx(ref_high, abs=1e-12)
    assert 0.0 <= low <= k / n <= high <= 1.0


def test_wilson_cases_cover_the_edges():
    assert {(0, 1), (1, 1)} <= set(CASES) and any(k == 0 for k, n in CASES if n > 1)


@pytest.mark.parametrize("k,n,want", [
    # Newcombe 1998, "Two-sided confidence intervals for the single proportion" (Stat. Med. 17),
    # Table I, method 3 (score interval without continuity correction), 95 %
    (81, 263, (0.2553, 0.3662)),
    (15, 148, (0.0624, 0.1605)),
    (0, 20, (0.0, 0.1611)),
    (1, 29, (0.0061, 0.1718)),
])
def test_wilson_matches_published_values(k, n, want):
    low, high = wilson(k, n)
    assert (round(low, 4), round(high, 4)) == want


def test_wilson_is_not_degenerate_at_all_or_nothing():
    """0/n and n/n: one end at the bound, the other strictly inside (the normal interval would be
    [0, 0] and [1, 1]); n = 1 by hand: centre (1 + z^2/2) / (1 + z^2), half z^2/2 / (1 + z^2)."""
    z2 = Z95 ** 2
    assert wilson(1, 1) == pytest.approx((1 - z2 / (1 + z2), 1.0), abs=1e-15)
    assert wilson(0, 1) == pytest.approx((0.0, z2 / (1 + z2)), abs=1e-15)
    low, high = wilson(0, 10)
    assert low == 0.0 and 0.2775 < high < 0.2776  # 3.84 / 13.84
    low, high = wilson(10, 10)
    assert high == 1.0 and 0.7224 < low < 0.7225
    # a wider z gives a wider interval
    assert wilson(3, 10, z=2.576)[0] < wilson(3, 10)[0] and wilson(3, 10, z=2.576)[1] > wilson(3, 10)[1]


@pytest.mark.parametrize("args,error,match", [
    ((11, 10), ValueError, r"^successes must be in \[0, 10\], got 11$"),
    ((-1, 10), ValueError, r"^successes must be in \[0, 10\], got -1$"),
    ((0, 0), ValueError, r"^trials must be >= 1, got 0$"),
    ((True, 10), TypeError, r"^successes must be an int, got bool True$"),
    ((3, 10.0), TypeError, r"^trials must be an int, got float 10.0$"),
    ((3.0, 10), TypeError, r"^successes must be an int, got float 3.0$"),
    ((3, 10, -1.0), ValueError, r"^z must be in \[0.0, inf\), got -1.0$"),
    ((3, 10, float("nan")), ValueError, r"^z must be"),
])
def test_wilson_refuses_bad_inputs_naming_them(args, error, match):
    with pytest.raises(error, match=match):
        wilson(*args)


# --------------------------------------------------------------------------- block bootstrap


def slow_block_bootstrap(nll: torch.Tensor, block: int, reps: int, seed: int, confidence: float = 0.95):
    """A loop: cut into blocks (the last one shorter), draw len(blocks) block indices per resample
    from one torch.Generator seeded with ``seed`` (one resample per call), the perplexity of the
    drawn tokens, then the linear-interpolation percentiles of the sorted replicates."""
    x = [float(v) for v in nll.double()]
    blocks = [x[i : i + block] for i in range(0, len(x), block)]
    g = torch.Generator().manual_seed(seed)
    stats = []
    for _ in range(reps):
        idx = torch.randint(len(blocks), (len(blocks),), generator=g).tolist()
        drawn = [v for i in idx for v in blocks[i]]
        stats.append(math.exp(math.fsum(drawn) / len(drawn)))
    stats.sort()

    def percentile(q: float) -> float:
        pos = q * (len(stats) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(stats) - 1)
        return stats[lo] + (pos - lo) * (stats[hi] - stats[lo])

    tail = (1 - confidence) / 2
    return math.exp(math.fsum(x) / len(x)), percentile(tail), percentile(1 - tail)


def losses(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=g, dtype=torch.float64) * 4  # nats in [0, 4)


@pytest.mark.parametrize("n,block,reps,seed,conf", [(1000, 37, 200, 0, 0.95), (250, 1, 150, 5, 0.9),
                                                    (64, 64, 50, 2, 0.95), (10, 256, 30, 1, 0.5)])
def test_block_bootstrap_equals_the_slow_loop(n, block, reps, seed, conf):
    nll = losses(n, seed)
    got = block_bootstrap_ppl(nll.float(), block=block, reps=reps, seed=seed, confidence=conf)
    want = slow_block_bootstrap(nll.float(), block, reps, seed, conf)
    assert got == pytest.approx(want, rel=1e-12)


def test_point_estimate_is_exp_mean_and_inside_the_interval():
    nll = losses(3000, 1)
    ppl, low, high = block_bootstrap_ppl(nll, block=16, reps=300)
    assert ppl == pytest.approx(math.exp(float(nll.mean())), rel=1e-14)
    assert low < ppl < high
    # one block of everything: every resample is the whole sequence, the interval collapses
    assert block_bootstrap_ppl(nll, block=5000, reps=20) == pytest.approx((ppl, ppl, ppl), rel=1e-14)


def test_deterministic_per_seed_and_different_across_seeds():
    nll = losses(2000, 2)
    a = block_bootstrap_ppl(nll, block=8, reps=200, seed=3)
    assert block_bootstrap_ppl(nll, block=8, reps=200, seed=3) == a
    b = block_bootstrap_ppl(nll, block=8, reps=200, seed=4)
    assert b[0] == a[0] and b[1:] != a[1:]


def test_block_one_on_iid_data_has_the_normal_theory_width():
    """Token-level bootstrap of i.i.d. losses: exp(mean +- 1.96 sd / sqrt(n)) within 15 %."""
    n = 20_000
    nll = torch.randn(n, generator=torch.Generator().manual_seed(7), dtype=torch.float64) + 3.0
    ppl, low, high = block_bootstrap_ppl(nll, block=1, reps=2000, seed=0)
    m, se = float(nll.mean()), float(nll.std()) / math.sqrt(n)
    want = math.exp(m + Z95 * se) - math.exp(m - Z95 * se)
    assert (high - low) == pytest.approx(want, rel=0.15)


def test_correlated_losses_need_blocks():
    """Each loss repeated 64 times: blocks of 64 see 200 independent values, tokens see 12,800 and
    give an interval about sqrt(64) = 8 times too narrow."""
    base = torch.randn(200, generator=torch.Generator().manual_seed(8), dtype=torch.float64) + 3.0
    nll = base.repeat_interleave(64)
    _, lo1, hi1 = block_bootstrap_ppl(nll, block=1, reps=1000)
    _, lo64, hi64 = block_bootstrap_ppl(nll, block=64, reps=1000)
    assert (hi64 - lo64) > 4 * (hi1 - lo1)
    # and the block-64 width is the normal-theory width of the 200 independent values
    m, se = float(base.mean()), float(base.std()) / math.sqrt(200)
    assert (hi64 - lo64) == pytest.approx(math.exp(m + Z95 * se) - math.exp(m - Z95 * se), rel=0.2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_diverged_loss_gives_nan_everywhere(bad):
    nll = losses(100)
    nll[17] = bad
    out = block_bootstrap_ppl(nll, block=10, reps=20)
    assert len(out) == 3 and all(math.isnan(v) for v in out)


def test_a_huge_finite_mean_loss_gives_nan_not_an_overflow_error():
    """A mean past ln(max float) ~ 709.8 nats: exp overflows. It is a diverged row like an inf
    loss (NaN everywhere), not a crash of the whole run."""
    out = block_bootstrap_ppl(torch.full((10,), 1000.0), block=2, reps=20)
    assert len(out) == 3 and all(math.isnan(v) for v in out)


@pytest.mark.parametrize("nll,kw,error,match", [
    (torch.zeros(3, 4), {}, ValueError,
     r"^nll must be a non-empty 1-D tensor of per-token losses, got shape \(3, 4\)$"),
    (torch.zeros(()), {}, ValueError, r"got shape \(\)$"),
    (torch.zeros(0), {}, ValueError, r"got shape \(0,\)$"),
    (torch.zeros(5), dict(block=0), ValueError, r"^block must be >= 1, got 0$"),
    (torch.zeros(5), dict(block=2.0), TypeError, r"^block must be an int, got float 2.0$"),
    (torch.zeros(5), dict(reps=0), ValueError, r"^reps must be >= 1, got 0$"),
    (torch.zeros(5), dict(confidence=1.5), ValueError, r"^confidence must be in \[0.0, 1.0\], got 1.5$"),
])
def test_block_bootstrap_refuses_bad_inputs(nll, kw, error, match):
    with pytest.raises(error, match=match):
        block_bootstrap_ppl(nll, **kw)
