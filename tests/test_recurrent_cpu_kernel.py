"""The recurrent encoding's GRU steps in the fused CPU kernel (csrc/gru_cpu.cpp,
recurrent.kernel_scan): states and gradients against autograd through gru_scan (restarts,
padding, a carried state), the encoding with and without the kernel, and what it refuses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from posenc import SequenceInfo, build
from posenc.absolute.recurrent import gru_scan, kernel_scan
from helpers import kernel_then_none

F64 = torch.float64


@pytest.mark.parametrize("dtype,tol", [(F64, 1e-13), (torch.float32, 2e-6)])
def test_steps_and_gradients_equal_autograd_through_gru_scan(cpu_kernel, dtype, tol):
    """Restarts and padding at random places, a carried h0: the states and the gradients of x,
    h0 and all four GRU weights, kernel_scan against autograd through gru_scan."""
    torch.manual_seed(0)
    B, T, C, Hd = 3, 23, 10, 6
    gru = nn.GRU(C, Hd, batch_first=True).to(dtype)
    x = torch.randn(B, T, C, dtype=dtype, requires_grad=True)
    h0 = torch.randn(B, Hd, dtype=dtype, requires_grad=True)
    reset, valid = torch.rand(B, T) < 0.15, torch.rand(B, T) > 0.2
    reset[0, 0], valid[1, -1] = True, False
    inputs = (x, h0, *gru.parameters())
    outs = []
    for scan in (lambda: kernel_scan(cpu_kernel, gru, x, h0, reset, valid), lambda: gru_scan(gru, x, h0, reset, valid)):
        states = scan()
        g = torch.randn(states.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
        outs.append((states.detach(), torch.autograd.grad(states, inputs, g)))
    (got, got_grads), (want, want_grads) = outs
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(1.0, b.abs().max().item()))


@pytest.mark.parametrize("case", ["plain", "packed", "padded"])
def test_the_encoding_with_and_without_the_kernel(cpu_kernel, case, monkeypatch):
    """RecurrentEncoding.embed and its gradients, with the kernel and with it not built (nn.GRU
    for a plain batch, gru_scan otherwise), in float64."""
    torch.manual_seed(0)
    enc = build("recurrent", d_model=8, num_heads=2, hidden=5).double()
    x = torch.randn(2, 11, 8, dtype=F64)
    seq = {"plain": SequenceInfo.from_offset(2, 11),
           "packed": SequenceInfo.from_cu_seqlens([0, 4, 11, 15, 22]),
           "padded": SequenceInfo.from_offset(2, 11)}[case]
    if case == "packed":
        x = x.view(1, 22, 8)
    if case == "padded":
        valid = torch.ones(2, 11, dtype=torch.bool)
        valid[0, :3] = False
        seq = SequenceInfo(positions=seq.positions, valid=valid)
    runs = []
    for _ in kernel_then_none(monkeypatch):
        enc.zero_grad()
        xx = x.clone().requires_grad_()
        out = enc.embed(xx, seq)
        out.square().sum().backward()
        runs.append((out.detach(), xx.grad, [p.grad.clone() for p in enc.parameters()]))
    (a_out, a_dx, a_grads), (b_out, b_dx, b_grads) = runs
    torch.testing.assert_close(a_out, b_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a_dx, b_dx, rtol=1e-11, atol=1e-11)
    for a, b in zip(a_grads, b_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


def test_second_derivatives_are_gru_scans(cpu_kernel, monkeypatch):
    """create_graph through the kernel: its backward replays the steps as PyTorch ops, so a
    second derivative (a gradient penalty) equals the one without the kernel."""
    torch.manual_seed(0)
    enc = build("recurrent", d_model=8, num_heads=2, hidden=5).double()
    x0 = torch.randn(2, 6, 8, dtype=F64)
    runs = []
    for _ in kernel_then_none(monkeypatch):
        x = x0.clone().requires_grad_()
        out = enc.embed(x, SequenceInfo.from_offset(2, 6))
        (g,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
        runs.append(torch.autograd.grad(g.square().sum(), (enc.proj.weight, enc.gru.weight_hh_l0)))
    for a, b in zip(*runs, strict=True):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_bad_inputs_are_refused_by_the_kernel(cpu_kernel):
    B, T, Hd = 2, 5, 4
    gi, h0 = torch.randn(B, T, 3 * Hd), torch.zeros(B, Hd)
    w, b = torch.randn(3 * Hd, Hd), torch.zeros(3 * Hd)
    mask = torch.zeros(B, T, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="gi \\(B, T, 3 Hd\\)"):
        cpu_kernel.gru_recurrence(gi[..., :-1], h0, w, b, mask, mask)
    with pytest.raises(RuntimeError, match="reset and valid: \\(B, T\\) bool"):
        cpu_kernel.gru_recurrence(gi, h0, w, b, mask.float(), mask)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        cpu_kernel.gru_recurrence(gi.half(), h0.half(), w.half(), b.half(), mask, mask)
    states, h_in, gates = cpu_kernel.gru_recurrence(gi, h0, w, b, mask, ~mask)
    with pytest.raises(RuntimeError, match="of one forward"):
        cpu_kernel.gru_recurrence_backward(states[:, :3], h_in, gates, w, mask, ~mask)
