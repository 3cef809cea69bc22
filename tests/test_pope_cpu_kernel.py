"""PoPE's polar turn in the fused CPU kernel (csrc/pope_cpu.cpp, posenc.rotary.pope._fused):
the forward against ATen's softplus and products, the backward against autograd through the
plain formula in float64, the phase bias's gradient taken in the turn, and the routing (the
kernel only where it applies, the ATen ops everywhere else)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import kernel_then_none
from posenc.rotary import pope as P

F64 = torch.float64


def _aten_turn(x, c, s):
    mu = F.softplus(x)
    return torch.cat((mu * c, mu * s), -1)


def _inputs(B, H, T, D, *, table_b=None, table_h=1, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H, D, generator=g).transpose(1, 2) * scale  # a projection's view: not contiguous
    a = torch.rand(table_b or B, table_h, T, D, generator=g, dtype=F64) * 40
    return x, a


@pytest.mark.parametrize("D", [1, 6, 16, 17, 64, 100])
@pytest.mark.parametrize("tables", [(None, 1), (1, 1), (None, "H")])
def test_forward_is_atens_softplus_and_products(cpu_kernel, D, tables):
    """Every width (vector tails included), tables of one row or one per batch row, per head or
    shared: the ATen ops' values (same exp and log1p; the same bits on this machine), with x
    past softplus's threshold, far below zero (softplus a subnormal, or 0), inf and NaN."""
    B, H, T = 2, 3, 5
    tb, th = tables
    x, a = _inputs(B, H, T, D, table_b=tb, table_h=H if th == "H" else 1, seed=D)
    x = x.contiguous()
    x.view(-1)[:6] = torch.tensor([25.0, 1e30, -95.0, -200.0, math.inf, math.nan])[: x.numel()][:6]
    c, s = a.cos().float(), a.sin().float()
    got, want = cpu_kernel.polar_turn(x, c, s), _aten_turn(x, c, s)
    assert got.shape == (B, H, T, 2 * D) and got.dtype == torch.float32 and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-38, equal_nan=True)


def _reference(x, a, delta, g):
    """Autograd through softplus(x) [cos(a - delta) | sin(a - delta)] in float64."""
    x = x.detach().double().requires_grad_()
    delta = delta.detach().double().requires_grad_()
    phase = a - delta[:, None, :]
    out = _aten_turn(x, phase.cos(), phase.sin())
    dx, dd = torch.autograd.grad(out, (x, delta), g.double())
    return out.detach(), dx, dd


@pytest.mark.parametrize("D,T", [(8, 3), (20, 300), (64, 513)])
def test_backward_and_phase_bias_gradient_against_float64_autograd(cpu_kernel, D, T):
    """polar_embed with the kernel: x's gradient (the slope's series below mu = 1/4 and its exp
    form above, mu = 0, a magnitude whose square would overflow float32) and the phase bias's,
    summed over batch and positions in the kernel, against float64 autograd of the formula."""
    B, H = 2, 3
    x, a = _inputs(B, H, T, D, seed=T)
    x = x.contiguous()
    x.view(-1)[:5] = torch.tensor([-200.0, -3.0, -1.2, 30.0, 1e20])  # mu = 0, 0.05, 0.26, 30, 1e20
    g = torch.randn(B, H, T, 2 * D, generator=torch.Generator().manual_seed(1))
    delta = -torch.rand(H, D, generator=torch.Generator().manual_seed(2)) * 6
    xx, dd = x.clone().requires_grad_(), delta.clone().requires_grad_()
    out = P.polar_embed(xx, a.cos(), a.sin(), dd)
    out.backward(g)
    want_out, want_dx, want_dd = _reference(x, a, delta, g)
    torch.testing.assert_close(out.double(), want_out, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(xx.grad.double(), want_dx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dd.grad.double(), want_dd, rtol=1e-5, atol=1e-5 * want_dd.abs().max().item())


def test_backward_tables_gradient_and_no_bias(cpu_kernel):
    """Tables that need a gradient get g_c mu and g_s mu (summed over the dims they were
    broadcast along), as ATen's backward gives them; no phase bias: none asked."""
    B, H, T, D = 2, 3, 7, 12
    x, a = _inputs(B, H, T, D, seed=5)
    c, s = a.cos().float().requires_grad_(), a.sin().float().requires_grad_()
    g = torch.randn(B, H, T, 2 * D, generator=torch.Generator().manual_seed(6))
    grads = []
    for route in (P._fused, lambda *t: None):
        saved, P._fused = P._fused, route
        try:
            xx = x.detach().clone().requires_grad_()
            grads.append(torch.autograd.grad(P.polar_turn(xx, c, s), (xx, c, s), g))
        finally:
            P._fused = saved
    for kernel, aten in zip(*grads):
        torch.testing.assert_close(kernel, aten, rtol=1e-5, atol=1e-6)
    assert grads[0][1].shape == c.shape


def test_phase_bias_gradient_is_the_same_for_any_number_of_threads(cpu_kernel):
    """The sum over positions is taken per block of 256 rows, then over blocks in order: the
    same bits with 1 and 2 threads."""
    B, H, T, D = 2, 4, 700, 32
    x, a = _inputs(B, H, T, D, seed=7)
    out = cpu_kernel.polar_turn(x.contiguous(), a.cos().float(), a.sin().float())
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(8))
    threads = torch.get_num_threads()
    got = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got.append(cpu_kernel.polar_turn_backward(out, g, False, True))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(got[0][3], got[1][3]) and torch.equal(got[0][0], got[1][0])
    assert got[0][1] is None and got[0][2] is None


def test_empty_positions(cpu_kernel):
    """No positions: an empty output, and a zero phase-bias gradient of (H, D)."""
    x = torch.zeros(2, 3, 0, 8)
    c = torch.zeros(2, 1, 0, 8)
    out = cpu_kernel.polar_turn(x, c, c)
    assert out.shape == (2, 3, 0, 16)
    dx, _, _, dbias = cpu_kernel.polar_turn_backward(out, out, False, True)
    assert dx.shape == (2, 3, 0, 8) and torch.equal(dbias, torch.zeros(3, 8))


def test_routing_takes_the_kernel_only_where_it_applies(cpu_kernel):
    """_fused: float32 CPU, 4-D, contiguous last dims, tables (B|1, H|1, T, D); anything else
    (float64, bfloat16, a strided last dim, 3-D, tables of other positions) the ATen ops."""
    x = torch.randn(2, 3, 5, 8)
    c = torch.randn(2, 1, 5, 8)
    assert P._fused(x, c, c) is cpu_kernel
    assert P._fused(x, torch.randn(1, 3, 5, 8), c) is cpu_kernel
    assert P._fused(x.double(), c.double(), c.double()) is None
    assert P._fused(x.bfloat16(), c, c) is None
    assert P._fused(torch.randn(2, 3, 5, 16)[..., ::2], c, c) is None
    assert P._fused(x[0], c[0], c[0]) is None
    assert P._fused(x, torch.randn(2, 1, 4, 8), c) is None
    assert P._fused(x, torch.randn(2, 2, 5, 8), c) is None


def test_without_the_kernel_the_aten_ops_give_the_same_model(cpu_kernel, monkeypatch):
    """A PoPE model's forward, and its gradients (q, k, the phase bias), with the kernel and
    with it not built: the same outputs, gradients within float32 roundings."""
    from posenc.model import Transformer
    from posenc.model_config import ModelConfig

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=40, d_model=32, n_layer=2, n_head=4, encoding="pope",
                                    encoding_config={"bias_init": "uniform"}))
    tokens = torch.randint(0, 40, (2, 37))
    runs = []
    for _ in kernel_then_none(monkeypatch):
        model.zero_grad()
        out = model(tokens)
        out.square().mean().backward()
        runs.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=1e-5, atol=1e-6)
    for a, b in zip(runs[0][1], runs[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    bias = model.encodings[0].phase_bias
    assert bias.grad is not None and bias.grad.abs().sum() > 0


def test_a_double_backward_equals_the_aten_ops(cpu_kernel):
    """create_graph=True: the turn's backward is built from ATen ops (differentiable; the
    kernel's is not), so a second derivative exists, and it equals the one with no kernel."""
    x, a = _inputs(1, 2, 4, 6, seed=9)
    c, s = a.cos().float(), a.sin().float()
    delta = (-torch.rand(2, 6) * 3).requires_grad_()
    results = []
    for route in (P._fused, lambda *t: None):
        saved, P._fused = P._fused, route
        try:
            xx = x.detach().clone().requires_grad_()
            out = P.polar_turn(xx, c, s, delta)
            (gx,) = torch.autograd.grad(out.square().sum(), xx, create_graph=True)
            results.append(torch.autograd.grad(gx.sum(), xx)[0])
        finally:
            P._fused = saved
    torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-6)


def test_bad_inputs_are_refused_by_the_kernel_itself(cpu_kernel):
    """Called directly with what it cannot read, the kernel raises (never reads past a table)."""
    x = torch.randn(2, 3, 5, 8)
    with pytest.raises(RuntimeError, match="float32"):
        cpu_kernel.polar_turn(x.double(), x.double(), x.double())
    with pytest.raises(RuntimeError, match="must fit x"):
        cpu_kernel.polar_turn(x, torch.randn(2, 1, 4, 8), torch.randn(2, 1, 4, 8))
    with pytest.raises(RuntimeError, match="4-D"):
        cpu_kernel.polar_turn(x[0], x[0], x[0])
    with pytest.raises(RuntimeError, match="contiguous"):
        cpu_kernel.polar_turn_backward(torch.randn(2, 3, 16, 5).transpose(2, 3), torch.randn(2, 3, 5, 16), False, False)
    with pytest.raises(RuntimeError, match="grad must have out's shape"):
        cpu_kernel.polar_turn_backward(torch.randn(2, 3, 5, 16), torch.randn(2, 3, 4, 16), False, False)
