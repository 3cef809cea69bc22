"""The Triton RoPE kernel against posenc's eager reference: under Triton's CPU interpreter,
or compiled on a CUDA GPU.

Not collected by a plain ``pytest`` run (the name does not start with ``test_``):
``tests/test_rotary_triton.py`` runs this file in a subprocess with ``TRITON_INTERPRET=1``, so
the variable is set before triton is first imported and never leaks into other test files.
By hand: ``TRITON_INTERPRET=1 python -m pytest tests/rotary_triton_cases.py`` (CPU), or
``python -m pytest tests/rotary_triton_cases.py`` on a machine with CUDA (the real kernel).

Tolerances are one rounding of the exact result: the reference is the float64 rotation of
the same input by the same float32 cos/sin; the kernel's float32 arithmetic adds ~1e-7
relative before the one rounding. float16: half an ulp. bfloat16: half an ulp on a GPU, one
ulp under the interpreter, which (triton 3.8) truncates float32 -> bfloat16.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():  # pragma: no cover - a guard against misuse
    raise RuntimeError("run with TRITON_INTERPRET=1 (tests/test_rotary_triton.py does) or on a CUDA machine")
DEVICE = torch.device("cpu" if INTERPRET else "cuda")
pytest.importorskip("triton")

import posenc  # noqa: E402
from posenc.positions import SequenceInfo  # noqa: E402
from posenc.rotary import triton_rope as TR  # noqa: E402
from posenc.rotary.angles import angles_cos_sin  # noqa: E402
from posenc.rotary.functional import apply_rotary, apply_rotary_qk  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Allowed error in ulps of the exact result: fp16 rounds to nearest; the interpreter truncates bf16.
ULPS = {torch.float16: 0.5, torch.bfloat16: 1.0 if INTERPRET else 0.5}


# Tensors are made on the CPU (seeded generators, exact integer lists) and moved to DEVICE.
def _arange(*a, **kw):
    return torch.arange(*a, **kw).to(DEVICE)


def _tensor(data):
    return torch.tensor(data).to(DEVICE)


def _randn(*shape):
    return torch.randn(*shape).to(DEVICE)


def _randint(lo, hi, shape, generator=None):
    return torch.randint(lo, hi, shape, generator=generator).to(DEVICE)


def _inv_freq(r: int, base: float = 10000.0) -> torch.Tensor:
    return base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)  # (r/2,) float64


def _ulp(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at |y| (float64), normal range."""
    fi = torch.finfo(dtype)
    e = torch.floor(torch.log2(y.abs().clamp_min(fi.tiny)))
    return torch.exp2(e) * fi.eps


def _assert_one_rounding(out: torch.Tensor, exact: torch.Tensor, x_scale: float) -> None:
    """``out`` (any dtype) within one rounding of ``exact`` (float64), plus float32 arithmetic."""
    assert out.shape == exact.shape and out.dtype != torch.float64
    arith = 8 * torch.finfo(torch.float32).eps * x_scale  # a few float32 roundings of |a cos| + |b sin|
    if out.dtype == torch.float32:
        bound = torch.full_like(exact, arith)
    else:
        bound = ULPS[out.dtype] * _ulp(exact, out.dtype) + arith
    err = (out.double() - exact).abs()
    bad = err > bound
    assert not bad.any(), f"{int(bad.sum())} elements off by up to {err.max().item():.3g} (bound {bound.max().item():.3g})"


def _exact(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Slow reference: an explicit loop over pairs, float64, from RoFormer's formula."""
    h = cos.shape[-1]
    xd = x.double()
    out = xd.clone()
    c, s = cos.double()[:, None], sin.double()[:, None]  # (B|1, 1, T, h)
    for j in range(h):
        ia, ib = (j, j + h) if layout == "half" else (2 * j, 2 * j + 1)
        a, b = xd[..., ia], xd[..., ib]
        out[..., ia] = a * c[..., j] - b * s[..., j]
        out[..., ib] = b * c[..., j] + a * s[..., j]
    return out


def _inputs(B, H, Hkv, Tq, Tk, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g).to(DEVICE, dtype)
    k = torch.randn(B, Hkv, Tk, D, generator=g).to(DEVICE, dtype)
    return q, k


# ---- forward ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("r", [8, 6])  # full rotary (D = 8), partial with a non-power-of-two half
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T", [1, 7, 33])
def test_forward_matches_exact(layout, r, dtype, T):
    B, H, Hkv, D = 2, 3, 1, 8  # GQA: one k head
    q, k = _inputs(B, H, Hkv, T, T + 2, D, dtype)
    q_pos = _randint(0, 4096, (B, T), generator=torch.Generator().manual_seed(1))
    k_pos = _arange(5, 5 + T + 2)[None]  # (1, Tk): broadcast over the batch
    cq, sq = angles_cos_sin(q_pos, _inv_freq(r))
    ck, sk = angles_cos_sin(k_pos, _inv_freq(r))
    oq, ok = apply_rotary_qk(q, k, cq, sq, ck, sk, layout, kernel="triton")
    assert oq.dtype == dtype and ok.dtype == dtype
    _assert_one_rounding(oq, _exact(q, cq, sq, layout), 4.0)
    _assert_one_rounding(ok, _exact(k, ck, sk, layout), 4.0)
    # pass-through channels bit for bit
    assert torch.equal(oq[..., r:], q[..., r:]) and torch.equal(ok[..., r:], k[..., r:])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_forward_fp32_equals_eager_closely(layout):
    q, k = _inputs(2, 2, 2, 9, 9, 16, torch.float32)
    pos = _arange(9).expand(2, 9)
    c, s = angles_cos_sin(pos, _inv_freq(12))
    got = apply_rotary_qk(q, k, c, s, c, s, layout, kernel="triton")
    want = apply_rotary_qk(q, k, c, s, c, s, layout, kernel="eager")
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, rtol=0, atol=1e-6)


def test_packed_documents_and_left_padding_positions():
    # Two documents packed in one row (positions restart) and a left-padded row.
    packed = SequenceInfo.from_cu_seqlens([0, 5, 12]).positions.to(DEVICE)  # (1, 12)
    assert packed[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]
    mask = _tensor([[False, False, True, True, True, True, True, True, True, True, True, True]])
    padded = SequenceInfo.from_padding_mask(mask).positions.to(DEVICE)  # (1, 12)
    pos = torch.cat([packed, padded.clamp_min(0)])  # (2, 12)
    q, k = _inputs(2, 2, 2, 12, 12, 8, torch.float16)
    c, s = angles_cos_sin(pos, _inv_freq(8))
    oq, ok = apply_rotary_qk(q, k, c, s, c, s, "half", kernel="triton")
    _assert_one_rounding(oq, _exact(q, c, s, "half"), 4.0)
    _assert_one_rounding(ok, _exact(k, c, s, "half"), 4.0)


def test_kv_cache_decode_step_matches_full_sequence():
    # Decoding: one new token at offset 10 gives the row of the full 11-token rotation.
    q, k = _inputs(1, 2, 1, 11, 11, 8, torch.bfloat16)
    inv = _inv_freq(8)
    full = _arange(11)[None]
    c, s = angles_cos_sin(full, inv)
    fq, fk = apply_rotary_qk(q, k, c, s, c, s, "interleaved", kernel="triton")
    step = SequenceInfo.from_offset(1, 1, offset=10).positions.to(DEVICE)  # (1, 1) = [[10]]
    c1, s1 = angles_cos_sin(step, inv)
    sq_, sk_ = apply_rotary_qk(q[:, :, 10:], k[:, :, 10:], c1, s1, c1, s1, "interleaved", kernel="triton")
    assert torch.equal(sq_, fq[:, :, 10:]) and torch.equal(sk_, fk[:, :, 10:])


def test_table_and_in_kernel_angles_give_the_per_token_result():
    # Positions up to 2^20: the in-kernel float64 angles give the table's float32 cos/sin exactly.
    q, k = _inputs(2, 2, 1, 5, 6, 8, torch.float32)
    q_pos = _tensor([[0, 1, 2, 3, 4], [1 << 20, (1 << 20) + 1, 999_999, 7, 3]])
    k_pos = _tensor([[9, 8, 7, 6, 5, 4]])
    inv, factor = _inv_freq(6), 0.1 * math.log(4.0) + 1.0  # YaRN's factor at 4x: not a float32
    cq, sq = angles_cos_sin(q_pos, inv, factor)
    ck, sk = angles_cos_sin(k_pos, inv, factor)
    want = TR.rotary_qk(q, k, cq, sq, ck, sk, "half")
    got = TR.rotary_qk_angles(q, k, inv, q_pos, k_pos, factor, "half")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    P = (1 << 20) + 2
    table = angles_cos_sin(_arange(P), inv, factor)  # (P, 3) float32 x 2
    got = TR.rotary_qk_table(q, k, *table, q_pos, k_pos, "half")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_in_kernel_angles_take_any_integer_position():
    # Documented: no range check (no host sync); a negative position rotates by its negative angle.
    q, k = _inputs(1, 2, 1, 3, 3, 8, torch.float32)
    pos = _tensor([[-5, 0, 7]])
    c, s = angles_cos_sin(pos, _inv_freq(8))
    got = TR.rotary_qk_angles(q, k, _inv_freq(8), pos, pos)
    want = TR.rotary_qk(q, k, c, s, c, s)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_table_positions_out_of_range_are_an_error():
    q, k = _inputs(1, 1, 1, 3, 3, 4, torch.float32)
    table = angles_cos_sin(_arange(8), _inv_freq(4))
    with pytest.raises(ValueError, match=r"q_pos must be in \[0, 7\], got values in \[0, 8\]"):
        TR.rotary_qk_table(q, k, *table, _tensor([[0, 1, 8]]), _tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match="k_pos must be in"):
        TR.rotary_qk_table(q, k, *table, _tensor([[0, 1, 2]]), _tensor([[0, -1, 2]]))


def test_strided_views_of_a_fused_qkv_projection():
    B, T, H, D = 2, 5, 2, 8
    qkv = _randn(B, T, 3, H, D)
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)  # (B, H, T, D), not contiguous
    assert not q.is_contiguous()
    c, s = angles_cos_sin(_arange(T)[None], _inv_freq(8))
    got = apply_rotary_qk(q, k, c, s, c, s, "half", kernel="triton")
    want = apply_rotary_qk(q.contiguous(), k.contiguous(), c, s, c, s, "half", kernel="eager")
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, rtol=0, atol=1e-6)


def test_apply_rotary_single_tensor():
    x, _ = _inputs(2, 3, 1, 7, 7, 10, torch.float16)
    c, s = angles_cos_sin(_arange(7)[None], _inv_freq(6))
    out = apply_rotary(x, c, s, "interleaved", kernel="triton")
    _assert_one_rounding(out, _exact(x, c, s, "interleaved"), 4.0)


# ---- backward -----------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("r", [8, 6])
def test_backward_matches_eager(layout, r):
    q, k = _inputs(2, 2, 1, 7, 9, 8, torch.float32)
    q.requires_grad_(True), k.requires_grad_(True)
    cq, sq = angles_cos_sin(_randint(0, 100, (2, 7)), _inv_freq(r))
    ck, sk = angles_cos_sin(_arange(9)[None], _inv_freq(r))
    gq, gk = _randn(2, 2, 7, 8), _randn(2, 1, 9, 8)
    out = apply_rotary_qk(q, k, cq, sq, ck, sk, layout, kernel="triton")
    got = torch.autograd.grad(out, (q, k), (gq, gk))
    out = apply_rotary_qk(q, k, cq, sq, ck, sk, layout, kernel="eager")
    want = torch.autograd.grad(out, (q, k), (gq, gk))
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, rtol=0, atol=1e-6)
    # the rotation is orthogonal: the gradient of |R x|^2 / 2 is x itself (pass-through too)
    out = apply_rotary_qk(q, k, cq, sq, ck, sk, layout, kernel="triton")
    gq2, gk2 = torch.autograd.grad(out, (q, k), out)
    torch.testing.assert_close(gq2, q.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(gk2, k.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("src", ["table", "angles"])
def test_backward_of_position_sources(src):
    q, k = _inputs(1, 2, 2, 6, 6, 8, torch.float32)
    q.requires_grad_(True), k.requires_grad_(True)
    pos = _tensor([[3, 1, 4, 1, 5, 9]])
    inv = _inv_freq(8)
    if src == "table":
        out = TR.rotary_qk_table(q, k, *angles_cos_sin(_arange(16), inv), pos, pos, "interleaved")
    else:
        out = TR.rotary_qk_angles(q, k, inv, pos, pos, 1.0, "interleaved")
    g = (_randn(1, 2, 6, 8), _randn(1, 2, 6, 8))
    got = torch.autograd.grad(out, (q, k), g)
    c, s = angles_cos_sin(pos, inv)
    want = torch.autograd.grad(apply_rotary_qk(q, k, c, s, c, s, "interleaved", kernel="eager"), (q, k), g)
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_backward_low_precision_is_one_rounding(dtype):
    q, k = _inputs(1, 2, 1, 5, 5, 8, dtype)
    q.requires_grad_(True), k.requires_grad_(True)
    c, s = angles_cos_sin(_arange(5)[None], _inv_freq(8))
    gq, gk = _randn(1, 2, 5, 8).to(dtype), _randn(1, 1, 5, 8).to(dtype)
    dq, dk = torch.autograd.grad(apply_rotary_qk(q, k, c, s, c, s, "half", kernel="triton"), (q, k), (gq, gk))
    assert dq.dtype == dtype
    _assert_one_rounding(dq, _exact(gq, c, -s, "half"), 4.0)  # R(-theta) g
    _assert_one_rounding(dk, _exact(gk, c, -s, "half"), 4.0)


# ---- through the modules: scalings and xPos -----------------------------------------------
@pytest.mark.parametrize(
    "name,cfg",
    [
        ("rope", dict(scaling="yarn", factor=4.0, original_max_position_embeddings=16, rotary_dim=6)),
        ("rope", dict(scaling="llama3", factor=8.0, original_max_position_embeddings=16, layout="interleaved")),
        ("xpos", dict(scale_base=64.0)),
    ],
)
def test_modules_with_triton_kernel_match_eager(name, cfg):
    q, k = _inputs(2, 2, 2, 7, 7, 8, torch.float32)
    pos = _tensor([[0, 1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45, 46]])
    fast = posenc.build(name, d_model=16, num_heads=2, kernel="triton", **cfg)
    slow = posenc.build(name, d_model=16, num_heads=2, kernel="eager", **cfg)
    qf, kf = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    qs, ks = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    of, os_ = fast.rotate(qf, kf, pos, pos), slow.rotate(qs, ks, pos, pos)
    for a, b in zip(of, os_):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    g = (torch.randn_like(q), torch.randn_like(k))
    # xPos: q scaled by s, k by 1/s; the backward is s R^T g (resp. R^T g / s), checked against eager.
    for a, b in zip(torch.autograd.grad(of, (qf, kf), g), torch.autograd.grad(os_, (qs, ks), g)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# ---- in place -----------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_inplace_equals_out_of_place(layout, dtype):
    q, k = _inputs(2, 2, 1, 7, 7, 10, dtype)
    c, s = angles_cos_sin(_arange(3, 10)[None], _inv_freq(6))
    want = apply_rotary_qk(q, k, c, s, c, s, layout, kernel="triton")
    q2, k2 = q.clone(), k.clone()
    with torch.inference_mode():
        q3, k3 = apply_rotary_qk(q2, k2, c, s, c, s, layout, kernel="triton", inplace=True)
    assert q3 is q2 and k3 is k2
    assert torch.equal(q2, want[0]) and torch.equal(k2, want[1])


def test_inplace_with_grad_is_an_error():
    q, k = _inputs(1, 1, 1, 3, 3, 4, torch.float32)
    q.requires_grad_(True)
    c, s = angles_cos_sin(_arange(3)[None], _inv_freq(4))
    with pytest.raises(ValueError, match="inplace=True is for inference"):
        apply_rotary_qk(q, k, c, s, c, s, kernel="triton", inplace=True)


def test_unsupported_inputs_are_errors():
    q, k = _inputs(1, 1, 1, 3, 3, 4, torch.float32)
    c, s = angles_cos_sin(_arange(3)[None], _inv_freq(4))
    with pytest.raises(TypeError, match="q must be float32, float16 or bfloat16 for the triton kernel, got torch.float64"):
        apply_rotary_qk(q.double(), k.double(), c, s, c, s, kernel="triton")
    with pytest.raises(TypeError, match="q and k must have one dtype"):
        apply_rotary_qk(q, k.half(), c, s, c, s, kernel="triton")
    with pytest.raises(ValueError, match="no gradient to cos/sin"):
        apply_rotary_qk(q, k, c.requires_grad_(True), s, c, s, kernel="triton")


# ---- `posenc speed rope`'s Triton rows (CUDA-only there; here through the interpreter) ------
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
def test_speed_rope_rows_compute_the_rotation(grad):
    from posenc.speed import rope as speed

    with torch.inference_mode(not grad):
        fns = speed._candidates(2, 2, 8, 8, torch.float32, str(DEVICE), grad)
        rows = [n for n in ("posenc-triton-table", "posenc-triton-angles", "posenc-inplace") if n in fns]
        assert rows == (["posenc-triton-table", "posenc-triton-angles"] + ([] if grad else ["posenc-inplace"]))
        ref = fns["posenc-eager"]
        if grad:
            g = lambda out: tuple(torch.ones_like(o) * 0.5 + o.detach() for o in out)  # noqa: E731
            ref = speed._with_backward(ref, g)
            fns = {n: speed._with_backward(fns[n], g) for n in rows}
        want = ref()
        for n in rows:
            got = fns[n]()
            assert len(got) == 2
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=n)
