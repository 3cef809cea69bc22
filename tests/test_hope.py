"""hope (a RoPE scaling entry): the kept pairs rotate as RoPE's, the others not at all; checked
against a slow pair-by-pair rotation written from the paper's rule."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.rotary import SCALINGS, rope_frequencies

F64 = torch.float64


def _slow_rotate(x: torch.Tensor, pos: torch.Tensor, base: float, L: int) -> torch.Tensor:
    """Half layout, pair by pair: pair i = (x_i, x_{i + d/2}) turns by m theta_i when
    2 pi / theta_i <= L, else stays. x (B, H, T, d), pos (B, T)."""
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        if 2 * math.pi / theta > L:
            continue
        for b in range(x.shape[0]):
            for t in range(x.shape[2]):
                a = float(pos[b, t]) * theta
                c, s = math.cos(a), math.sin(a)
                x1, x2 = x[b, :, t, i], x[b, :, t, i + d // 2]
                out[b, :, t, i] = x1 * c - x2 * s
                out[b, :, t, i + d // 2] = x1 * s + x2 * c
    return out


@pytest.mark.parametrize("L", [1, 64, 512, 10**6])
def test_rotation_equals_slow_pairwise_loop(L):
    rope = posenc.build("rope", d_model=64, num_heads=2, scaling="hope", original_max_position_embeddings=L)
    torch.manual_seed(0)
    q, k = torch.randn(2, 2, 5, 32, dtype=F64), torch.randn(2, 2, 5, 32, dtype=F64)
    pos = torch.tensor([[0, 1, 7, 300, 5000], [2, 3, 4, 5, 6]])
    rq, rk = rope.rotate(q, k, pos, pos)
    torch.testing.assert_close(rq, _slow_rotate(q, pos, 10000.0, L), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rk, _slow_rotate(k, pos, 10000.0, L), atol=1e-6, rtol=1e-6)


def test_keeps_exactly_the_pairs_that_complete_a_period_within_L():
    inv, factor = rope_frequencies("hope", 64, 10000.0, original_max_position_embeddings=512)
    base = rope_frequencies("default", 64, 10000.0)[0]
    kept = (2 * math.pi / base) <= 512
    assert factor == 1.0 and 0 < int(kept.sum()) < 32
    assert torch.equal(inv[kept], base[kept]) and (inv[~kept] == 0).all()
    assert kept[: int(kept.sum())].all()  # the high frequencies: a prefix of the pairs


def test_unrotated_pairs_are_position_independent_and_the_rest_relative():
    """q·k over the zeroed pairs ignores positions; over the kept pairs it depends on m - n only."""
    rope = posenc.build("rope", d_model=32, num_heads=1, scaling="hope", original_max_position_embeddings=64)
    inv = rope.inv_freq
    zero = (inv == 0).nonzero().flatten().tolist()
    assert zero, "no pair was dropped"
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, 32, dtype=F64), torch.randn(1, 1, 1, 32, dtype=F64)
    channels = zero + [i + 16 for i in zero]

    def logits(m: int, n: int) -> tuple[float, float]:
        rq, rk = rope.rotate(q, k, torch.tensor([[m]]), torch.tensor([[n]]))
        prod = (rq * rk)[0, 0, 0]
        return float(prod[channels].sum()), float(prod.sum())

    nope_a, full_a = logits(3, 1)
    nope_b, full_b = logits(1003, 1001)
    nope_c, _ = logits(900, 2)
    assert nope_a == pytest.approx(nope_b, abs=1e-12) and nope_a == pytest.approx(nope_c, abs=1e-12)
    assert full_a == pytest.approx(full_b, abs=1e-5)  # float32 cos/sin tables


def test_entry_is_registered_with_its_paper_and_no_training_free_rule():
    entry = SCALINGS["hope"]
    assert "HoPE" in entry.source and entry.extension is None and entry.hf is None
    assert entry.at_factor(4.0, 64, rotary_dim=8, illustrate=True) == {"original_max_position_embeddings": 64}


@pytest.mark.parametrize("value,error,match", [
    (None, ValueError, r"^original_max_position_embeddings is required for rope type 'hope'"),
    (0, ValueError, r"^original_max_position_embeddings must be >= 1, got 0$"),
    (64.0, TypeError, "original_max_position_embeddings"),
])
def test_config_refuses_bad_values_by_name(value, error, match):
    cfg = {} if value is None else {"original_max_position_embeddings": value}
    with pytest.raises(error, match=match):
        posenc.build("rope", d_model=32, num_heads=2, scaling="hope", **cfg)
