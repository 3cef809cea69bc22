"""FLOATER: the RK4 solver's order against a closed form, the codes against an explicit solve."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import SequenceInfo, build
from posenc.absolute import rk4


def test_rk4_is_fourth_order_on_a_linear_ode():
    # dp/dt = A p has the closed form p(t) = expm(A t) p0.
    torch.manual_seed(0)
    A = torch.randn(4, 4, dtype=torch.float64)
    p0 = torch.randn(4, dtype=torch.float64)
    exact = torch.linalg.matrix_exp(A * 1.0) @ p0
    errs = []
    for n in (10, 20, 40):
        p1 = rk4(lambda p, t: A @ p, p0, 1.0 / n, n)[-1]
        errs.append((p1 - exact).norm().item())
    for coarse, fine in zip(errs, errs[1:]):
        assert 14.0 < coarse / fine < 18.0  # halving the step divides the error by 2^4


def test_rk4_time_dependent_and_recording():
    # dp/dt = cos t, p(0) = 0 -> p(t) = sin t; records after every 2nd step of 0.01.
    out = rk4(lambda p, t: torch.full_like(p, math.cos(t)), torch.zeros(1, dtype=torch.float64), 0.01, 100, record_every=2)
    assert out.shape == (50, 1)
    expect = torch.tensor([[math.sin(0.02 * (i + 1))] for i in range(50)], dtype=torch.float64)
    torch.testing.assert_close(out, expect, atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="record_every"):
        rk4(lambda p, t: p, torch.zeros(1), 0.1, 5, record_every=2)


def _enc(**cfg):
    torch.manual_seed(0)
    enc = build("floater", d_model=6, num_heads=2, hidden=7, **cfg).double()
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return enc


def _reference_codes(enc, n, steps):
    """RK4 on h(p, t) = W2 tanh(W1 [p, t] + b1) + b2, one scalar time at a time, float64 loops."""
    W1, b1, W2, b2 = (t.detach().double() for t in (enc.w1, enc.b1, enc.w2, enc.b2))

    def h(p, t):
        return W2 @ torch.tanh(W1 @ torch.cat([p, torch.tensor([t], dtype=torch.float64)]) + b1) + b2

    dt = enc.config.delta / steps
    p = torch.zeros(6, dtype=torch.float64) if enc.p0 is None else enc.p0.detach().double()
    codes, k = [p], 0
    for _ in range(1, n):
        for _ in range(steps):
            t = k * dt
            k1 = h(p, t)
            k2 = h(p + dt / 2 * k1, t + dt / 2)
            k3 = h(p + dt / 2 * k2, t + dt / 2)
            k4 = h(p + dt * k3, t + dt)
            p = p + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            k += 1
        codes.append(p)
    return torch.stack(codes)


@pytest.mark.parametrize("learn_p0", [True, False])
def test_codes_match_explicit_solve_and_are_gathered(learn_p0):
    enc = _enc(delta=0.25, steps_per_position=3, learn_p0=learn_p0)
    ref = _reference_codes(enc, 9, 3)  # (9, C)
    seq = SequenceInfo.from_cu_seqlens([0, 5, 9, 12])  # positions 0..4, 0..3, 0..2
    x = torch.randn(1, 12, 6, dtype=torch.float64)
    out = enc.embed(x, seq)
    torch.testing.assert_close(out, x + ref[seq.positions], atol=1e-12, rtol=0)
    big = enc.embed(torch.zeros(1, 9, 6, dtype=torch.float64), SequenceInfo.from_offset(1, 9))
    torch.testing.assert_close(big[0], ref, atol=1e-12, rtol=0)
    if not learn_p0:
        assert torch.equal(out[0, 0], x[0, 0])  # p(0) = 0


def test_more_steps_converge_at_fourth_order():
    encs = {s: _enc(steps_per_position=s) for s in (1, 2, 64)}
    with torch.no_grad():
        codes = {s: e.codes(30) for s, e in encs.items()}
    err1 = (codes[1] - codes[64]).abs().max()
    err2 = (codes[2] - codes[64]).abs().max()
    assert 12.0 < err1 / err2 < 20.0


def test_decoding_state_continues_the_solve_exactly():
    enc = _enc()
    x = torch.randn(2, 11, 6, dtype=torch.float64)
    with torch.no_grad():
        full = enc.embed(x, SequenceInfo.from_offset(2, 11))
        state: dict = {}
        parts = [enc.embed(x[:, :3], SequenceInfo.from_offset(2, 3), state)]
        for t in range(3, 11):
            parts.append(enc.embed(x[:, t : t + 1], SequenceInfo.from_offset(2, 1, offset=t), state))
        assert state["codes"].count == 11 and state["codes"].table.shape[0] == 11
    assert torch.equal(torch.cat(parts, 1), full)


def test_gradients_flow_through_the_solver():
    enc = _enc()
    out = enc.embed(torch.zeros(1, 5, 6, dtype=torch.float64), SequenceInfo.from_offset(1, 5))
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


def test_bad_inputs():
    for bad in (0.0, -0.1):
        with pytest.raises(ValueError, match="delta"):
            build("floater", d_model=6, num_heads=2, delta=bad)
    with pytest.raises(ValueError, match="steps_per_position"):
        build("floater", d_model=6, num_heads=2, steps_per_position=0)
    with pytest.raises(ValueError, match="hidden"):
        build("floater", d_model=6, num_heads=2, hidden=0)
    with pytest.raises(TypeError, match="learn_p0"):
        build("floater", d_model=6, num_heads=2, learn_p0=1)
    enc = _enc(max_position=4)
    with pytest.raises(ValueError, match=r"positions must be in \[0, 3\] for floater \(max_position=4"):
        enc.embed(torch.zeros(1, 2, 6, dtype=torch.float64), SequenceInfo(torch.tensor([[3, 4]])))
