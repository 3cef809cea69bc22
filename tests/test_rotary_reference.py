"""RoPE's fast paths against slow references written here from the paper.

References (Su et al. 2021, RoFormer):
* the block-diagonal rotation matrix R_m (eq. 13-15) built entry by entry and applied by a
  matmul, float64;
* the complex form: pair j of q as a complex number times e^(i m theta_j) (eq. 12), complex128.
Both are independent of posenc's code; every kernel, layout and partial rotary is checked
against both, forward and backward (gradcheck).
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.rotary import apply_rotary, angles_cos_sin, base_inv_freq

LAYOUTS = ["half", "interleaved"]


def pair_channels(j: int, r: int, layout: str) -> tuple[int, int]:
    return (j, j + r // 2) if layout == "half" else (2 * j, 2 * j + 1)


def reference_matrix(x: torch.Tensor, pos: torch.Tensor, r: int, base: float, layout: str) -> torch.Tensor:
    """R_m x by an explicit (r x r) block-diagonal matrix per token; x (B, H, T, D), pos (B, T)."""
    B, H, T, D = x.shape
    out = x.double().clone()
    for b in range(B):
        for t in range(T):
            m = int(pos[b, t])
            R = torch.zeros(r, r, dtype=torch.float64)
            for j in range(r // 2):
                theta = base ** (-2.0 * j / r)
                c, s = math.cos(m * theta), math.sin(m * theta)
                p, q = pair_channels(j, r, layout)
                R[p, p], R[p, q], R[q, p], R[q, q] = c, -s, s, c
            out[b, :, t, :r] = x[b, :, t, :r].double() @ R.T
    return out


def reference_complex(x: torch.Tensor, pos: torch.Tensor, r: int, base: float, layout: str) -> torch.Tensor:
    """Pairs as complex numbers a + ib times e^(i m theta_j), complex128."""
    out = x.double().clone()
    theta = base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)  # (r/2,)
    ang = pos.double()[..., None] * theta
    rot = torch.polar(torch.ones_like(ang), ang)  # (B, T, r/2) complex128
    idx = [pair_channels(j, r, layout) for j in range(r // 2)]
    a = x.double()[..., [p for p, _ in idx]]
    b = x.double()[..., [q for _, q in idx]]
    z = torch.complex(a, b) * rot[:, None]  # (B, H, T, r/2)
    out[..., [p for p, _ in idx]] = z.real
    out[..., [q for _, q in idx]] = z.imag
    return out


def random_positions(B: int, T: int, high: int = 5000) -> torch.Tensor:
    return torch.randint(0, high, (B, T))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [16, 8, 2])
def test_module_matches_both_references(layout, rotary_dim):
    B, H, T, D = 2, 3, 5, 16
    rope = posenc.build("rope", d_model=H * D, num_heads=H, rotary_dim=rotary_dim, layout=layout, base=500.0)
    q, k = torch.randn(B, H, T, D, dtype=torch.float64), torch.randn(B, 1, T, D, dtype=torch.float64)
    pos = random_positions(B, T)
    rq, rk = rope.rotate(q, k, pos, pos)
    for ref in (reference_matrix, reference_complex):
        torch.testing.assert_close(rq, ref(q, pos, rotary_dim, 500.0, layout), atol=1e-6, rtol=0)
        torch.testing.assert_close(rk, ref(k, pos, rotary_dim, 500.0, layout), atol=1e-6, rtol=0)
    # partial rotary: the other channels pass through bit for bit
    assert torch.equal(rq[..., rotary_dim:], q[..., rotary_dim:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("grad", [False, True], ids=["nograd", "grad"])
def test_eager_kernel_paths_match_reference(layout, dtype, grad):
    # The half layout has an in-place path (no grad) and a functional one (grad): both checked.
    B, H, T, D, r = 2, 2, 7, 12, 8
    x = torch.randn(B, H, T, D).to(dtype).requires_grad_(grad)
    pos = random_positions(B, T)
    cos, sin = angles_cos_sin(pos, base_inv_freq(r, 10000.0))
    out = apply_rotary(x, cos, sin, layout)
    assert out.dtype == dtype
    ref = reference_complex(x.detach(), pos, r, 10000.0, layout)
    # one rounding to dtype: within half an ulp of the float32 math (+ float32 table error)
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-2, rtol=2**-8)
    torch.testing.assert_close(out.double(), ref, **tol)
    assert torch.equal(out[..., r:], x[..., r:])


def test_stride0_batch_positions_and_gqa():
    rope = posenc.build("rope", d_model=32, num_heads=4)
    q, k = torch.randn(3, 4, 6, 8), torch.randn(3, 2, 6, 8)
    pos = torch.arange(6).expand(3, 6)  # stride 0 over the batch
    rq, rk = rope.rotate(q, k, pos, pos)
    rq2, rk2 = rope.rotate(q, k, pos.contiguous(), pos.contiguous().clone())
    assert torch.equal(rq, rq2) and torch.equal(rk, rk2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scores_depend_only_on_distance(layout):
    # RoFormer's defining property: <R_m q, R_n k> = <q, R_(n-m) k>, for shifts up to 2^16.
    rope = posenc.build("rope", d_model=16, num_heads=1, layout=layout)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)
    scores = []
    for shift in (0, 1, 37, 1000, 65536):
        m, n = torch.tensor([[shift + 9]]), torch.tensor([[shift + 2]])
        rq, _ = rope.rotate(q, q, m, m)
        rk, _ = rope.rotate(k, k, n, n)
        scores.append(float((rq * rk).sum()))
    # the table is float32, so the angle error per token is ~1e-7: scores agree to ~1e-6
    assert max(scores) - min(scores) < 1e-5 * max(1.0, abs(scores[0]))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_norms_preserved(layout):
    rope = posenc.build("rope", d_model=64, num_heads=2, layout=layout, rotary_dim=24)
    q = torch.randn(2, 2, 50, 32, dtype=torch.float64)
    pos = random_positions(2, 50, 1 << 20)
    rq, _ = rope.rotate(q, q, pos, pos)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["rope", "xpos"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_gradcheck_every_path(name, layout, rotary_dim):
    rope = posenc.build(name, d_model=16, num_heads=2, layout=layout, rotary_dim=rotary_dim)
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 4, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[3, 0, 7, 100]])
    assert torch.autograd.gradcheck(lambda q, k: rope.rotate(q, k, pos, pos), (q, k))


def test_apply_rotary_rejects_mismatched_tables():
    x = torch.randn(1, 1, 4, 8)
    cos, sin = angles_cos_sin(torch.arange(3)[None], base_inv_freq(8, 10000.0))
    with pytest.raises(ValueError, match="do not fit"):
        apply_rotary(x, cos, sin)
    cos, sin = angles_cos_sin(torch.arange(4)[None], base_inv_freq(10, 10000.0))
    with pytest.raises(ValueError, match="do not fit"):
        apply_rotary(x, cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_small_step_rolled_form_is_the_eager_kernel_bit_for_bit(dtype, spy, no_cpu_kernel):
    """A small step on CPU without autograd (a decoding step) rotates by
    x·[cos | cos] + roll(x, D/2)·[-sin | sin] (three ops): the same bits as the eager kernel,
    within one rounding of the complex-number reference; with grad enabled, or more than
    SMALL_STEP positions, or partial rotary, or the interleaved layout, the plan takes another way."""
    from posenc.rotary import functional
    from posenc.rotary.functional import Rotation, rotation_plan

    H, D = 4, 16
    rope = posenc.build("rope", d_model=H * D, num_heads=H, base=500.0)
    pos = torch.tensor([[37, 38, 39]])
    q, k = torch.randn(2, H, 3, D).to(dtype), torch.randn(2, 2, 3, D).to(dtype)
    taken = spy(functional, "rotate_half_rolled")
    with torch.no_grad():
        state = rope.prepare(pos, pos)
        assert rotation_plan("auto", "half", q, k, state.tables).way is Rotation.ROLLED
        rq, rk = rope.rotate(q, k, pos, pos, state=state)
        assert taken == [1, 1] and rq.dtype == dtype  # q, then k
        eq, ek = functional.WAYS[Rotation.EAGER](q, k, state.tables, "half")  # the eager kernel itself
    assert taken == [1, 1]
    assert torch.equal(rq, eq) and torch.equal(rk, ek)
    tol = dict(atol=1e-2, rtol=2**-8) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=0)
    torch.testing.assert_close(rq.double(), reference_complex(q, pos, D, 500.0, "half"), **tol)

    way = lambda enc, q, k, p: rotation_plan(enc.config.kernel, enc.config.layout, q, k, enc.prepare(p, p).tables).way  # noqa: E731
    assert way(rope, q.clone().requires_grad_(), k, pos) is Rotation.FUNCTIONAL  # autograd records
    with torch.no_grad():
        long = torch.arange(functional.SMALL_STEP + 1)[None]
        ql = torch.randn(1, H, long.shape[1], D).to(dtype)
        assert way(rope, ql, ql, long) is Rotation.EAGER
        partial = posenc.build("rope", d_model=H * D, num_heads=H, rotary_dim=8)
        interleaved = posenc.build("rope", d_model=H * D, num_heads=H, layout="interleaved")
        assert way(partial, q, k, pos) is Rotation.EAGER and way(interleaved, q, k, pos) is Rotation.EAGER


def test_the_way_kept_on_a_forwards_tables_follows_what_it_depends_on(spy, monkeypatch, no_cpu_kernel):
    """QKTables.way decides once per kind of call and keeps it: one forward's tables reused
    under no_grad, then under autograd, then with other shapes take the way each call needs
    (the kept ROLLED way would write nothing autograd can differentiate, or not fit), and a
    call that does not fit is refused every time, not only the first."""
    from posenc.rotary import functional
    from posenc.rotary.functional import Rotation

    H, D = 2, 16
    rope = posenc.build("rope", d_model=H * D, num_heads=H)
    pos = torch.tensor([[7, 8]])
    state = rope.prepare(pos, pos)
    q, k = torch.randn(1, H, 2, D), torch.randn(1, H, 2, D)
    rolled = spy(functional, "rotate_half_rolled")
    with torch.no_grad():
        a = rope.rotate(q, k, pos, pos, state=state)
        assert state.tables.way("auto", "half", q, k) is Rotation.ROLLED and rolled == [1, 1]
    qg = q.clone().requires_grad_()
    b = rope.rotate(qg, k, pos, pos, state=state)  # the same tables, autograd recording
    assert state.tables.way("auto", "half", qg, k) is Rotation.FUNCTIONAL and rolled == [1, 1]
    b[0].sum().backward()
    assert qg.grad is not None
    torch.testing.assert_close(b[0].detach(), a[0], atol=1e-6, rtol=0)  # other ops, one rounding apart
    with torch.no_grad():
        long = torch.randn(1, H, functional.SMALL_STEP + 1, D)  # keys of another length than the tables'
        with pytest.raises(ValueError, match="do not fit k"):
            state.tables.way("auto", "half", q, long)
        # another kind of call on new tables (the next step's) is planned anew, kept across tables
        fresh = rope.prepare(pos, pos).tables
        assert fresh.way("auto", "half", q, k) is Rotation.ROLLED
        monkeypatch.setattr(functional, "rotation_plan", None)  # kept: not planned again
        assert rope.prepare(pos, pos).tables.way("auto", "half", q, k) is Rotation.ROLLED
        for _ in range(2):
            with pytest.raises(ValueError, match="do not fit q"):
                rope.rotate(torch.randn(1, H, 2, D - 2), k, pos, pos, state=state)
        with pytest.raises(ValueError, match="kernel must be one of"):
            state.tables.way("fast", "half", q, k)


def test_a_prepared_state_rotates_keys_at_the_query_positions_only():
    """``state`` describes the keys of self-attention; keys of another length are refused with
    it, and without it a call at other key positions equals the per-position rotation."""
    rope = posenc.build("rope", d_model=32, num_heads=2)
    q_pos, k_pos = torch.tensor([[5, 6]]), torch.tensor([[0, 1, 2]])
    q, k = torch.randn(1, 2, 2, 16), torch.randn(1, 2, 3, 16)
    with pytest.raises(ValueError, match=r"state is prepare\(\)'s, for keys at the 2 query positions, but k has 3"):
        rope.rotate(q, k, q_pos, k_pos, state=rope.prepare(q_pos, k_pos))
    rq, rk = rope.rotate(q, k, q_pos, k_pos)
    torch.testing.assert_close(rk, rope.rotate(k, k, k_pos, k_pos)[0], atol=0, rtol=0)
    torch.testing.assert_close(rq, rope.rotate(q, q, q_pos, q_pos)[0], atol=0, rtol=0)


