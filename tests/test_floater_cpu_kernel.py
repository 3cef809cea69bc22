"""FLOATER's RK4 solve in the fused CPU kernel (csrc/floater_cpu.cpp, floater._KernelSolve): its
states and its backward (the discrete adjoint) against autograd through the Python rk4, the
codes of a FloaterEncoding with and without the kernel, and what it refuses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import posenc
from helpers import kernel_then_none
from posenc.absolute.floater import rk4

F64 = torch.float64


def _weights(C, Hd, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(C, generator=g, dtype=dtype), torch.randn(Hd, C + 1, generator=g, dtype=dtype) / 3,
            torch.randn(Hd, generator=g, dtype=dtype) * 0.3, torch.randn(C, Hd, generator=g, dtype=dtype) / 2,
            torch.randn(C, generator=g, dtype=dtype) * 0.3)


@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("start", [0, 7])
def test_solve_and_adjoint_equal_autograd_through_rk4(cpu_kernel, dtype, tol, start):
    """Every step's state, and the gradients of y0 and every weight (W1's time column
    included) from a gradient on every state, against autograd through rk4 with the same
    dynamics W2 tanh(W1 [p, t] + b1) + b2 (a start past step 0 continues a solve)."""
    C, Hd, N, dt = 20, 6, 40, 0.13
    y0, w1, b1, w2, b2 = (t.requires_grad_() for t in _weights(C, Hd, dtype))

    def h(p, t):
        return F.linear(torch.tanh(F.linear(p, w1[:, :C], b1 + t * w1[:, C])), w2, b2)

    want = rk4(h, y0, dt, N, start_step=start)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    want_grads = torch.autograd.grad(want, (y0, w1, b1, w2, b2), g)
    states, stages, acts = cpu_kernel.floater_rk4(y0.detach(), w1.detach(), b1.detach(), w2.detach(), b2.detach(), dt, N, start)
    assert states.shape == (N, C) and stages.shape == (N, 4, C) and acts.shape == (N, 4, Hd)
    torch.testing.assert_close(states, want.detach(), rtol=tol, atol=tol)
    grads = cpu_kernel.floater_rk4_backward(g, stages, acts, y0.detach(), w1.detach(), b1.detach(), w2.detach(), b2.detach(),
                                     dt, start)
    for got, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, w, rtol=tol, atol=tol * w.abs().max().item())


@pytest.mark.parametrize("steps_per_position", [1, 3])
def test_codes_and_gradients_with_and_without_the_kernel(cpu_kernel, steps_per_position, monkeypatch):
    """A FloaterEncoding's codes (recorded every steps_per_position steps) and the gradients of
    its parameters, the kernel's against rk4's autograd, in float64; and a continued solve
    (decoding) equals the one-pass codes."""
    enc = posenc.build("floater", d_model=16, num_heads=2, steps_per_position=steps_per_position, hidden=5).double()
    with torch.no_grad():
        enc.p0.normal_()
    runs = []
    for _ in kernel_then_none(monkeypatch):
        enc.zero_grad()
        codes = enc.codes(30)
        codes.pow(2).sum().backward()
        runs.append((codes.detach(), [p.grad.clone() for p in enc.parameters()]))
        with torch.no_grad():
            head = enc.codes(12)
            tail = enc.codes(30, start=head[-1], first=12)
        torch.testing.assert_close(torch.cat([head, tail]), codes.detach(), rtol=1e-12, atol=1e-12)
    (k_codes, k_grads), (r_codes, r_grads) = runs
    assert k_codes.shape == (30, 16)
    torch.testing.assert_close(k_codes, r_codes, rtol=1e-12, atol=1e-12)
    for a, b in zip(k_grads, r_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_no_step_and_one_position(cpu_kernel):
    """One position: p0 alone, no step taken."""
    enc = posenc.build("floater", d_model=8, num_heads=2)
    assert torch.equal(enc.codes(1), enc.p0.detach()[None])
    states, stages, _ = cpu_kernel.floater_rk4(*(t.detach() for t in _weights(8, 3, torch.float32)), 0.1, 0, 0)
    assert states.shape == (0, 8) and stages.shape == (0, 4, 8)


def test_second_derivatives_are_rk4s(cpu_kernel, monkeypatch):
    """create_graph through the kernel: its backward replays the solve as PyTorch ops, so a
    second derivative equals rk4's."""
    enc = posenc.build("floater", d_model=8, num_heads=2, hidden=4).double()
    runs = []
    for _ in kernel_then_none(monkeypatch):
        codes = enc.codes(6)
        (g,) = torch.autograd.grad(codes.square().sum(), enc.w1, create_graph=True)
        runs.append(torch.autograd.grad(g.square().sum(), (enc.w1, enc.w2, enc.p0)))
    for a, b in zip(*runs, strict=True):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_bad_inputs_are_refused_by_the_kernel(cpu_kernel):
    y0, w1, b1, w2, b2 = _weights(8, 3, torch.float32)
    with pytest.raises(RuntimeError, match="w1 \\(Hd, C \\+ 1\\)"):
        cpu_kernel.floater_rk4(y0, w1[:, :8], b1, w2, b2, 0.1, 4, 0)
    with pytest.raises(RuntimeError, match="y0's dtype"):
        cpu_kernel.floater_rk4(y0, w1.double(), b1, w2, b2, 0.1, 4, 0)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        cpu_kernel.floater_rk4(y0.half(), w1.half(), b1.half(), w2.half(), b2.half(), 0.1, 4, 0)
    states, stages, acts = cpu_kernel.floater_rk4(y0, w1, b1, w2, b2, 0.1, 4, 0)
    with pytest.raises(RuntimeError, match="of one solve"):
        cpu_kernel.floater_rk4_backward(states[:3], stages, acts, y0, w1, b1, w2, b2, 0.1, 0)
