"""pope: polar embedding against a slow loop over the paper's complex formula and against
x-transformers' ``polar_pos_emb`` attention on the same weights; its logits are relative and
its magnitudes content-only."""

from __future__ import annotations

import cmath
import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc import Attention, SequenceInfo
from posenc.rotary.pope import PolarEmbedding

F64 = torch.float64


def _pope(**config) -> PolarEmbedding:
    torch.manual_seed(0)
    return posenc.build("pope", d_model=16, num_heads=2, bias_init="uniform", **config)


def _slow_logit(enc: PolarEmbedding, qv: torch.Tensor, kv: torch.Tensor, h: int, m: int, n: int) -> float:
    """Re sum_c softplus(q_c) softplus(k_c) e^{i((m - n) theta_c - delta_c)}, channel by channel."""
    D = qv.shape[0]
    total = 0j
    for c in range(D):
        theta = enc.config.base ** (-c / D)
        delta = min(max(float(enc.phase_bias.detach()[h, c]), -2 * math.pi), 0.0)
        mu_q, mu_k = math.log1p(math.exp(float(qv[c]))), math.log1p(math.exp(float(kv[c])))
        total += mu_q * mu_k * cmath.exp(1j * ((m - n) * theta - delta))
    return total.real


def test_logits_equal_slow_loop_over_the_formula():
    enc = _pope().to(F64)
    with torch.no_grad():
        enc.phase_bias[0, :3] = torch.tensor([1.0, -7.0, -3.0])  # past both ends of the clamp
    torch.manual_seed(1)
    q, k = torch.randn(1, 2, 5, 8, dtype=F64), torch.randn(1, 1, 6, 8, dtype=F64)  # grouped-query keys
    q_pos, k_pos = torch.tensor([[3, 4, 9, 10, 200]]), torch.tensor([[0, 1, 2, 3, 9, 200]])
    rq, rk = enc.rotate(q, k, q_pos, k_pos)
    assert rq.shape == (1, 2, 5, 16) and rk.shape == (1, 1, 6, 16)
    got = rq @ rk.transpose(-1, -2)  # (1, 2, 5, 6)
    want = torch.tensor([[[_slow_logit(enc, q[0, h, i], k[0, 0, j], h, int(q_pos[0, i]), int(k_pos[0, j]))
                           for j in range(6)] for i in range(5)] for h in range(2)], dtype=F64)
    torch.testing.assert_close(got[0], want, atol=1e-10, rtol=1e-10)


def test_logits_depend_on_the_distance_only():
    enc = _pope()
    torch.manual_seed(2)
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    near = [enc.rotate(q, k, torch.arange(4)[None] + s, torch.arange(4)[None] + s) for s in (0, 1000)]
    logits = [a @ b.transpose(-1, -2) for a, b in near]
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)


def test_magnitudes_are_content_and_phases_position():
    """|q_c| in the embedding is softplus(q_c) at every position; the phase is m theta_c - delta_c
    whatever the content."""
    enc = _pope()
    q = torch.randn(1, 2, 3, 8)
    for pos in (torch.tensor([[0, 1, 2]]), torch.tensor([[50, 7, 1000]])):
        rq, _ = enc.rotate(q, q[:, :1], pos, pos)
        re, im = rq.chunk(2, dim=-1)
        torch.testing.assert_close(torch.hypot(re, im), torch.nn.functional.softplus(q))
        phase = torch.atan2(im, re)
        want = pos[:, None, :, None] * enc.inv_freq() - enc.delta().to(F64)[None, :, None, :]
        torch.testing.assert_close(torch.remainder(phase.to(F64) - want + math.pi, 2 * math.pi) - math.pi,
                                   torch.zeros_like(want), atol=2e-3, rtol=0)


def test_parity_with_x_transformers_attention():
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(3)
    peer = xt.Attention(16, heads=2, dim_head=8, causal=True)
    polar = xt.PolarEmbedding(8, 2)  # its bias_uniform_init=True fails (an in-place op on a leaf)
    with torch.no_grad():
        polar.learned_bias.uniform_(-2 * math.pi, 0.0)
    enc = posenc.build("pope", d_model=16, num_heads=2)
    mine = Attention(16, 2, pe=enc, causal=True, impl="eager")
    ps = peer.state_dict()
    mine.load_state_dict({"q_proj.weight": ps["to_q.weight"], "k_proj.weight": ps["to_k.weight"],
                          "v_proj.weight": ps["to_v.weight"], "o_proj.weight": ps["to_out.weight"],
                          "pe.phase_bias": polar.learned_bias.detach()[:, 0]})
    x = torch.randn(2, 9, 16)
    want = peer(x, polar_pos_emb=polar(torch.arange(9)))
    torch.testing.assert_close(mine(x, SequenceInfo.from_offset(2, 9)), want, atol=1e-5, rtol=1e-5)


def test_phase_bias_stays_float32_under_bfloat16():
    enc = _pope().to(torch.bfloat16)
    assert enc.phase_bias.dtype == torch.float32
    q = torch.randn(1, 2, 3, 8, dtype=torch.bfloat16)
    rq, rk = enc.rotate(q, q, torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 2]]))
    assert rq.dtype == rk.dtype == torch.bfloat16


@pytest.mark.parametrize("key,value,error,match", [
    ("base", 1.0, ValueError, r"^base must be > 1"),
    ("base", 0.0, ValueError, r"^base must be > 0, got 0.0$"),
    ("base", float("inf"), ValueError, "base"),
    ("bias_init", "normal", ValueError, r"^bias_init must be one of 'zeros', 'uniform'; got 'normal'$"),
])
def test_config_refuses_bad_values_by_name(key, value, error, match):
    with pytest.raises(error, match=match):
        posenc.build("pope", d_model=16, num_heads=2, **{key: value})


def test_positions_past_float64_integers_are_refused_as_ropes():
    """Positions up to 2**53 - 1 rotate; 2**53 is refused for q and k alike, with RoPE's
    message, and so are negative positions."""
    enc = _pope()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 1, 8, generator=g, dtype=F64), torch.randn(1, 2, 1, 8, generator=g, dtype=F64)
    near = torch.tensor([[2**53 - 1]])
    assert all(t.isfinite().all() for t in enc.rotate(q, k, near, near))
    far = torch.tensor([[2**53]])
    for q_pos, k_pos in ((far, near), (near, far)):
        with pytest.raises(ValueError, match=r"^positions must be <= 9007199254740991 \(2\*\*53 - 1.*got 9007199254740992$"):
            enc.rotate(q, k, q_pos, k_pos)
    with pytest.raises(ValueError, match=r"^positions must be >= 0, got -1$"):
        enc.rotate(q, k, near, torch.tensor([[-1]]))


def test_prepared_state_equals_rotating_without_it():
    """prepare()'s angles (made and checked once per forward) serve q and the new keys."""
    enc = _pope()
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    with_state = enc.rotate(q, k, pos, pos, enc.prepare(pos, pos))
    for a, b in zip(with_state, enc.rotate(q, k, pos, pos)):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"state is prepare\(\)'s, for keys at the 5 query positions, but k has 4"):
        enc.rotate(q, k[:, :, :4], pos, pos[:, :4], enc.prepare(pos, pos))


def test_polar_embed_backward_equals_autograd_of_the_formula():
    """polar_embed's backward reads mu and the phases off its output: its gradients
    (of x and of the phase bias) equal autograd's through the plain formula
    softplus(x) [cos(a - delta) | sin(a - delta)], and gradcheck passes in float64."""
    from posenc.rotary.pope import polar_embed

    torch.manual_seed(3)
    x = torch.randn(2, 3, 5, 4, dtype=F64)
    x[0, 0, 0] = torch.tensor([-800.0, -200.0, 30.0, 60.0])  # softplus underflowing to 0, tiny, past its threshold
    x.requires_grad_()
    a = torch.randn(2, 1, 5, 4, dtype=F64) * 30  # angles of every size
    delta = (-torch.rand(3, 4, dtype=F64) * 6).requires_grad_()
    g = torch.randn(2, 3, 5, 8, dtype=F64)
    for d in (delta, None):
        phase = a if d is None else a - d[:, None, :]
        mu = torch.nn.functional.softplus(x)
        want = torch.cat([mu * phase.cos(), mu * phase.sin()], -1)
        got = polar_embed(x, a.cos(), a.sin(), d)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
        inputs = (x,) if d is None else (x, d)
        torch.testing.assert_close(torch.autograd.grad(got, inputs, g), torch.autograd.grad(want, inputs, g),
                                   atol=1e-12, rtol=1e-12)
    small = (x[:1, :2, :2, :2].detach().clone().requires_grad_(), a[:1, :, :2, :2].cos(), a[:1, :, :2, :2].sin(),
             delta[:2, :2].detach().clone().requires_grad_())
    assert torch.autograd.gradcheck(polar_embed, small)


def test_polar_embed_keeps_only_its_output_for_the_backward():
    """Under autograd a PoPE rotation saves its two outputs (which attention keeps anyway) and
    nothing else of q's size (the plain formula kept five float32 tensors per call)."""
    enc = _pope()
    q = torch.randn(2, 2, 64, 8, requires_grad=True)
    k = torch.randn(2, 2, 64, 8, requires_grad=True)
    pos = torch.arange(64)[None]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        rq, rk = enc.rotate(q, k, pos, pos, enc.prepare(pos, pos))
    big = [t for t in saved if t.numel() >= q.numel()]
    assert len(big) == 2 and {t.data_ptr() for t in big} == {rq.data_ptr(), rk.data_ptr()}


def test_one_state_serves_every_layer_and_the_phase_bias_gradient_sums_over_them():
    """prepare's tables (q's phases shifted by the bias) are made once per forward and dtype
    and shared by the layers: two layers rotating with one state give the outputs and the
    gradients (of q, k and the phase bias) of the plain formula applied per layer, in float64."""
    enc = _pope().double()
    pos = torch.arange(6)[None] + 3
    q1, k1, q2, k2 = (torch.randn(1, 2, 6, 8, dtype=F64, requires_grad=True) for _ in range(4))
    state = enc.prepare(pos, pos)
    outs = [*enc.rotate(q1, k1, pos, pos, state), *enc.rotate(q2, k2, pos, pos, state)]
    assert len(state._tables) == 1  # made once, for float64 under autograd
    a = pos[:, None, :, None].double() * enc.inv_freq()  # (1, 1, T, D)
    d = enc.phase_bias.clamp(-2 * math.pi, 0.0)[:, None, :]  # (H, 1, D)
    polar = lambda x, ph: torch.cat([F.softplus(x) * ph.cos(), F.softplus(x) * ph.sin()], -1)  # noqa: E731
    want = [polar(q1, a - d), polar(k1, a), polar(q2, a - d), polar(k2, a)]
    for got, w in zip(outs, want, strict=True):
        torch.testing.assert_close(got, w, atol=1e-12, rtol=1e-12)
    gs = [torch.randn_like(o) for o in outs]
    inputs = (q1, k1, q2, k2, enc.phase_bias)
    got = torch.autograd.grad(outs, inputs, gs)
    ref = torch.autograd.grad(want, inputs, gs)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, atol=1e-11, rtol=1e-11)
    with torch.no_grad():  # a decoding step's four ops: the same numbers
        fast = enc.rotate(q1, k1, pos, pos, enc.prepare(pos, pos))
    torch.testing.assert_close(fast[0], want[0].detach(), atol=1e-12, rtol=1e-12)
