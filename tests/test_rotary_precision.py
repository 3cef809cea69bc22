"""Precision of RoPE and xPos: float64 angles, float32 tables, one rounding to the model dtype.

References are computed here with mpmath (50 digits) or float64 from the paper's formula.
"""

from __future__ import annotations

import dataclasses

import mpmath
import pytest
import torch

import posenc
from posenc.rotary import rope as rope_module
from posenc.rotary import angles_cos_sin, base_inv_freq, xpos_scale
from posenc.rotary.functional import rotate_qk

mpmath.mp.dps = 50
POSITIONS = [0, 1, 4097, 65535, 500_000, 1_000_003, (1 << 20) - 1, 1 << 20]


def test_tables_within_one_float32_ulp_of_mpmath_up_to_2_pow_20():
    d, base = 64, 10000.0
    rope = posenc.build("rope", d_model=d, num_heads=1, base=base)
    pos = torch.tensor([POSITIONS])
    cos, sin = rope.cos_sin(pos)  # (1, P, d/2) float32
    for t, m in enumerate(POSITIONS):
        for j in range(d // 2):
            ang = m * mpmath.power(base, mpmath.mpf(-2 * j) / d)
            for got, ref in ((cos[0, t, j], mpmath.cos(ang)), (sin[0, t, j], mpmath.sin(ang))):
                # one float32 rounding of a value in [-1, 1]: <= 2^-25 absolute; the float64
                # angle adds <= 2^20 * 2^-53 rad. Allow one float32 ulp at 1.
                assert abs(float(got) - float(ref)) <= 2**-24, (m, j)
    # Why float64 angles: float32 angles are wrong by ~1e-2 rad at these positions.
    ang32 = pos.float()[..., None] * base_inv_freq(d, base).float()
    assert float((ang32.cos() - cos).abs().max()) > 1e-3


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of bfloat16 numbers at |x| (8 significant bits)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(2.0**-126)))
    return 2.0 ** (e - 7)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_bf16_module_under_autocast_within_one_ulp(layout, name):
    D, H = 32, 2
    extra = {"scale_base": 1e6} if name == "xpos" else {}  # keep xPos' scale finite at 2^20
    enc = posenc.build(name, d_model=H * D, num_heads=H, layout=layout, rotary_dim=24, **extra)
    enc_fp32 = posenc.build(name, d_model=H * D, num_heads=H, layout=layout, rotary_dim=24, **extra)
    enc = enc.to(torch.bfloat16)  # must not round the frequencies
    assert enc.inv_freq.dtype == torch.float64 and torch.equal(enc.inv_freq, enc_fp32.inv_freq)
    lin = torch.nn.Linear(16, H * D)
    x = torch.randn(2, len(POSITIONS), 16)
    pos = torch.tensor([POSITIONS, POSITIONS[::-1]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = lin(x).view(2, -1, H, D).transpose(1, 2)  # (B, H, T, D) bfloat16
        assert q.dtype == torch.bfloat16
        rq, rk = enc.rotate(q, q, pos, pos)
    assert rq.dtype == torch.bfloat16
    # float64 reference from the formula, on the same bf16 inputs
    r = 24
    theta = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = pos.double()[..., None] * theta  # (B, T, r/2)
    idx = [(j, j + r // 2) if layout == "half" else (2 * j, 2 * j + 1) for j in range(r // 2)]
    for out, sign in ((rq, 1.0), (rk, -1.0)):
        qd = q.double()
        a, b = qd[..., [i for i, _ in idx]], qd[..., [j for _, j in idx]]
        c, s = ang.cos()[:, None], ang.sin()[:, None]
        scale = xpos_scale(pos, r, 1e6 * sign)[:, None] if name == "xpos" else 1.0
        ref = qd.clone()
        ref[..., [i for i, _ in idx]] = (a * c - b * s) * scale
        ref[..., [j for _, j in idx]] = (b * c + a * s) * scale
        err = (out.double() - ref).abs()
        assert bool((err <= bf16_ulp(ref)).all()), float((err / bf16_ulp(ref)).max())
        assert torch.equal(out[..., r:], q[..., r:])
    # and bit for bit what the float32 module gives
    fq, _ = enc_fp32.rotate(q, q, pos, pos)
    assert torch.equal(fq, rq)


def test_table_grows_and_never_reads_past_its_end(monkeypatch):
    rope = posenc.build("rope", d_model=32, num_heads=2)
    c1, _ = rope.cos_sin(torch.tensor([[3, 100]]))
    (table,) = rope._cache.values()
    assert table.positions == 128  # next power of two above 100
    c2, s2 = rope.cos_sin(torch.tensor([[3, 100, 5000]]))
    (table,) = rope._cache.values()
    assert table.positions == 8192
    ref_c, ref_s = angles_cos_sin(torch.tensor([[3, 100, 5000]]), rope.inv_freq)
    assert torch.equal(c2, ref_c) and torch.equal(s2, ref_s)
    # past the table cap, angles are computed per token (no giant table, same values)
    monkeypatch.setattr(rope_module, "MAX_TABLE_POSITIONS", 4096)
    c3, s3 = rope.cos_sin(torch.tensor([[3, 100, 5000, 123456]]))
    ref_c, ref_s = angles_cos_sin(torch.tensor([[3, 100, 5000, 123456]]), rope.inv_freq)
    assert torch.equal(c3, ref_c) and torch.equal(s3, ref_s)


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_rolled_rows_read_from_the_table_equal_the_rolled_rows_built_per_forward(name):
    # A decoding step looks its rolled tables ([cos | cos], [-sin | sin]) up in the cached
    # table instead of building them from its cos/sin rows: the same bits, batch rows too.
    enc = posenc.build(name, d_model=64, num_heads=2)
    pos = torch.tensor([[5, 700, 3], [9, 0, 1023]])
    state = enc.prepare(pos, pos)
    looked_up = state.tables.rolled_pairs()
    built = dataclasses.replace(state.tables, rolled=None, _pairs=None).rolled_pairs()
    assert state.tables.rolled is not None and len(state.tables.rolled) == (4 if name == "xpos" else 2)
    assert (looked_up[0] is looked_up[2]) == (name == "rope")  # RoPE's keys at the query positions: q's pair
    for a, b in zip(looked_up, built, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    # and the rotation through them equals the eager kernel's
    q, k = torch.randn(2, 2, 3, 32), torch.randn(2, 2, 3, 32)
    with torch.no_grad():
        fast = enc.rotate(q, k, pos, pos, state=state)
        slow = rotate_qk(q, k, state.tables, kernel="eager")
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_cache_is_keyed_on_scaling():
    rope = posenc.build("rope", d_model=32, num_heads=2)
    pos = torch.arange(50)[None]
    plain = rope.cos_sin(pos)
    rope.set_scaling("linear", factor=2.0)
    scaled = rope.cos_sin(pos)
    ref = angles_cos_sin(pos, base_inv_freq(16, 10000.0) / 2)
    assert torch.equal(scaled[0], ref[0]) and not torch.equal(scaled[0], plain[0])
    rope.set_scaling("default")
    assert torch.equal(rope.cos_sin(pos)[0], plain[0])
