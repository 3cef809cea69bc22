"""clipped (CoPE, a RoPE scaling entry): the last n pairs' frequencies times a half cosine from 1
to 0; checked against slow loops written from the paper's rule (Li et al. 2026, arXiv:2602.05258)
and from the authors' code (hrlics/CoPE, modeling_cope.py: linspace(0, pi, n) in float32)."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.rotary import SCALINGS, rope_frequencies, to_hf

F64 = torch.float64


def _slow_weights(half: int, n: int) -> list[float]:
    """Pair by pair: 1 before the last n pairs; across them (1 + cos(pi j / (n - 1))) / 2."""
    n = min(n, half)
    out = []
    for i in range(half):
        j = i - (half - n)
        if j < 0:
            out.append(1.0)
        elif n == 1:
            out.append(1.0)  # linspace(0, pi, 1) is [0]: the one pair keeps its frequency
        else:
            out.append(0.5 * (1.0 + math.cos(math.pi * j / (n - 1))))
    return out


def _slow_rotate(x: torch.Tensor, pos: torch.Tensor, base: float, weights: list[float]) -> torch.Tensor:
    """Half layout, pair by pair: pair i = (x_i, x_{i + d/2}) turns by m theta_i w_i."""
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        theta = base ** (-2 * i / d) * weights[i]
        for b in range(x.shape[0]):
            for t in range(x.shape[2]):
                a = float(pos[b, t]) * theta
                c, s = math.cos(a), math.sin(a)
                x1, x2 = x[b, :, t, i], x[b, :, t, i + d // 2]
                out[b, :, t, i] = x1 * c - x2 * s
                out[b, :, t, i + d // 2] = x1 * s + x2 * c
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 5, 16, 40])
def test_frequencies_equal_the_slow_taper(n):
    inv, factor = rope_frequencies("clipped", 32, 10000.0, clipped_pairs=n)
    base = rope_frequencies("default", 32, 10000.0)[0]
    want = torch.tensor([b * w for b, w in zip(base.tolist(), _slow_weights(16, n))], dtype=F64)
    torch.testing.assert_close(inv, want, atol=0, rtol=1e-15)
    assert factor == 1.0
    if n >= 2:
        assert inv[-1] == 0 and inv[16 - min(n, 16)] == base[16 - min(n, 16)]  # 1 at the top, 0 at the end


def test_llama3_8b_as_the_authors_ran_it():
    """clip_low_n = 20 of Llama-3-8B's 64 pairs (base 500000): their float32 mask to float32's precision."""
    inv, _ = rope_frequencies("clipped", 128, 500000.0, clipped_pairs=20)
    base = rope_frequencies("default", 128, 500000.0)[0]
    theirs = 0.5 * (1.0 + torch.cos(torch.linspace(0.0, math.pi, steps=20, dtype=torch.float32)))
    torch.testing.assert_close((inv[44:] / base[44:]).float(), theirs, atol=1e-6, rtol=0)
    assert torch.equal(inv[:44], base[:44])


@pytest.mark.parametrize("L,base,d", [(65536, 500000.0, 128), (512, 10000.0, 64), (64, 10000.0, 8), (10**9, 10000.0, 64)])
def test_trained_length_tapers_the_pairs_whose_period_exceeds_it(L, base, d):
    inv, _ = rope_frequencies("clipped", d, base, original_max_position_embeddings=L)
    plain = rope_frequencies("default", d, base)[0]
    n = sum(1 for i in range(d // 2) if 2 * math.pi / base ** (-2 * i / d) > L)
    want = torch.tensor([b * w for b, w in zip(plain.tolist(), _slow_weights(d // 2, n))], dtype=F64)
    torch.testing.assert_close(inv, want, atol=0, rtol=1e-15)
    if (L, base, d) == (65536, 500000.0, 128):
        assert n == 18  # the docstring's count for Llama 3 at 64k (the authors fixed 20 by hand)


@pytest.mark.parametrize("kw", [{"clipped_pairs": 6}, {"original_max_position_embeddings": 256}])
def test_rotation_equals_slow_pairwise_loop(kw):
    rope = posenc.build("rope", d_model=64, num_heads=2, scaling="clipped", **kw)
    n = kw.get("clipped_pairs") or sum(1 for i in range(16) if 2 * math.pi * 10000.0 ** (2 * i / 32) > 256)
    assert n > 1
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 5, 32, dtype=F64), torch.randn(2, 2, 5, 32, dtype=F64)
    pos = torch.tensor([[0, 1, 7, 300, 5000], [2, 3, 4, 5, 6]])
    rq, rk = rope.rotate(q, k, pos, pos)
    w = _slow_weights(16, n)
    torch.testing.assert_close(rq, _slow_rotate(q, pos, 10000.0, w), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rk, _slow_rotate(k, pos, 10000.0, w), atol=1e-6, rtol=1e-6)


def test_the_last_pair_is_position_independent_and_the_logit_relative():
    rope = posenc.build("rope", d_model=32, num_heads=1, scaling="clipped", clipped_pairs=4)
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, 32, dtype=F64), torch.randn(1, 1, 1, 32, dtype=F64)

    def logits(m: int, n: int) -> tuple[float, float]:
        rq, rk = rope.rotate(q, k, torch.tensor([[m]]), torch.tensor([[n]]))
        prod = (rq * rk)[0, 0, 0]
        return float(prod[[15, 31]].sum()), float(prod.sum())

    frozen_a, full_a = logits(3, 1)
    frozen_b, full_b = logits(100003, 100001)
    assert frozen_a == pytest.approx(float((q * k)[0, 0, 0, [15, 31]].sum()), abs=1e-12)
    assert frozen_a == pytest.approx(frozen_b, abs=1e-12)
    assert full_a == pytest.approx(full_b, abs=1e-4)  # float32 cos/sin tables


def test_entry_has_its_paper_no_hf_spelling_and_no_training_free_rule():
    entry = SCALINGS["clipped"]
    assert "CoPE" in entry.source and entry.extension is None and entry.hf is None
    assert entry.at_factor(4.0, 512, 64, illustrate=True) == {"original_max_position_embeddings": 512}
    assert "clipped" not in posenc.rotary.list_scalings(extends=True)
    rope = posenc.build("rope", d_model=32, num_heads=2, scaling="clipped", clipped_pairs=3)
    with pytest.raises(ValueError, match="rope type 'clipped' has no transformers spelling"):
        to_hf(rope)


@pytest.mark.parametrize("kw,match", [
    ({}, r"^rope type 'clipped' takes exactly one of clipped_pairs .* got clipped_pairs=None, "
         r"original_max_position_embeddings=None$"),
    ({"clipped_pairs": 4, "original_max_position_embeddings": 64}, r"takes exactly one of clipped_pairs"),
    ({"clipped_pairs": -1}, r"^clipped_pairs must be >= 0, got -1$"),
    ({"original_max_position_embeddings": 0}, r"^original_max_position_embeddings must be >= 1, got 0$"),
    ({"clipped_pairs": 4, "base": 0.5}, r"^base must be > 1 for rope type 'clipped' .*got 0.5$"),
])
def test_bad_configs_are_one_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        posenc.build("rope", d_model=32, num_heads=2, scaling="clipped", **kw)
