"""rope: the encoding built from the registry against RoFormer's rotation written out pair by pair
(Su et al. 2021, eq. 12-15: pair j at position m turned by m·base^(-2j/r)), in both layouts, with
partial rotary_dim, separate query and key positions, and with the per-forward state; the
logits depend on q_pos - k_pos alone; bad configs named. (The kernels and the rotation plan
behind it: test_rotary_reference.py and the other test_rotary_*.py.)"""

from __future__ import annotations

import math

import pytest
import torch

import posenc

H, D = 2, 8
F64 = torch.float64
# Angles are float64, the cos/sin tables float32 (posenc.rotary.angles): a float64 input is
# rotated to float32's precision of the tables, whatever the position.
TOL = dict(atol=1e-6, rtol=1e-6)


def _slow_rotate(x: torch.Tensor, pos: torch.Tensor, r: int, base: float, layout: str) -> torch.Tensor:
    """x (B, H, T, D) at positions pos (B, T), one pair of one token at a time, in Python floats."""
    out = x.clone()
    B, _, T, _ = x.shape
    for b in range(B):
        for h in range(x.shape[1]):
            for t in range(T):
                m = int(pos[b, t])
                for j in range(r // 2):
                    p, q = (j, j + r // 2) if layout == "half" else (2 * j, 2 * j + 1)
                    ang = m * base ** (-2.0 * j / r)
                    a, c = float(x[b, h, t, p]), float(x[b, h, t, q])
                    out[b, h, t, p] = a * math.cos(ang) - c * math.sin(ang)
                    out[b, h, t, q] = c * math.cos(ang) + a * math.sin(ang)
    return out


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_rope_rotates_as_roformer(layout, rotary_dim):
    enc = posenc.build("rope", d_model=H * D, num_heads=H, base=500.0, layout=layout, rotary_dim=rotary_dim)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, 3, D, generator=g, dtype=F64)
    k = torch.randn(2, H, 5, D, generator=g, dtype=F64)
    q_pos = torch.tensor([[4, 5, 6], [100, 2000, 2001]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 99, 1000, 2001]])
    r = D if rotary_dim is None else rotary_dim
    q2, k2 = enc.rotate(q, k, q_pos, k_pos)
    torch.testing.assert_close(q2, _slow_rotate(q, q_pos, r, 500.0, layout), **TOL)
    torch.testing.assert_close(k2, _slow_rotate(k, k_pos, r, 500.0, layout), **TOL)
    if r < D:
        assert torch.equal(q2[..., r:], q[..., r:])  # the pass-through channels, bit for bit


def test_the_prepared_state_rotates_keys_at_the_query_positions():
    enc = posenc.build("rope", d_model=H * D, num_heads=H)
    pos = torch.tensor([[3, 4, 5, 9]])
    q, k = torch.randn(1, H, 4, D, dtype=F64), torch.randn(1, H, 4, D, dtype=F64)
    q2, k2 = enc.rotate(q, k, pos, pos, enc.prepare(pos, pos))
    torch.testing.assert_close(q2, _slow_rotate(q, pos, D, 10000.0, "half"), **TOL)
    torch.testing.assert_close(k2, _slow_rotate(k, pos, D, 10000.0, "half"), **TOL)


def test_logits_depend_on_the_distance_alone():
    enc = posenc.build("rope", d_model=H * D, num_heads=H)
    q, k = torch.randn(1, H, 1, D, dtype=F64), torch.randn(1, H, 1, D, dtype=F64)
    logits = []
    for shift in (0, 17, 123456):
        q2, k2 = enc.rotate(q, k, torch.tensor([[shift + 9]]), torch.tensor([[shift + 2]]))
        logits.append((q2 * k2).sum(-1))
    torch.testing.assert_close(logits[1], logits[0], **TOL)
    torch.testing.assert_close(logits[2], logits[0], **TOL)


@pytest.mark.parametrize(
    "config,error,match",
    [
        (dict(base=1.0), ValueError, "base"),
        (dict(rotary_dim=3), ValueError, "rotary_dim"),
        (dict(rotary_dim=2 * D), ValueError, "rotary_dim"),
        (dict(layout="neox"), ValueError, "layout"),
    ],
)
def test_bad_config_is_named(config, error, match):
    with pytest.raises(error, match=match):
        posenc.build("rope", d_model=H * D, num_heads=H, **config)
