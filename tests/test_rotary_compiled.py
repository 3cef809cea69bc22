"""The rotary family under torch.compile, and the compiled kernel, against slow references.

* the compiled kernel (q and k in one graph) against the eager kernel and the RoFormer R_m
  matrix, forward and backward, both layouts, partial rotary, float32 and bfloat16;
* ``kernel="auto"``: compiled above the size threshold, eager below, eager when compiling fails;
* RoPE with every scaling type (and xPos) inside ``torch.compile(fullgraph=True,
  dynamic=True)``: the eager result, lengths crossing the trained length of length-dependent
  types, and the eager table cache left untouched.

Compilation takes seconds per graph on CPU, so this file compiles few graphs.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import posenc
from posenc.rotary.scaling import SCALINGS
from posenc.rotary import ROPE_SCALINGS, angles_cos_sin, apply_rotary, apply_rotary_qk, base_inv_freq, functional, kernels
from test_rotary_reference import reference_matrix

pytestmark = pytest.mark.compile

# Parameters that make each scaling type non-trivial at lengths 9..100 (trained length 16).
def scaling_params(name: str) -> dict:
    """Each scaling as the registry sets it for a model trained on 16 tokens at 4x (its own rule;
    LongRoPE's per-pair factors from its illustration), so a new scaling is tested here at once."""
    return SCALINGS[name].at_factor(4.0, 16, rotary_dim=8, illustrate=True)


@pytest.mark.parametrize(
    "layout,dtype,r,grad",
    [
        ("half", torch.bfloat16, 64, False),
        ("half", torch.float32, 48, True),
        ("interleaved", torch.float32, 32, True),
    ],
)
def test_compiled_qk_kernel_matches_eager_and_R_m_reference(layout, dtype, r, grad):
    torch._dynamo.reset()
    B, H, Hkv, D = 2, 3, 1, 64
    q = torch.randn(B, H, 7, D).to(dtype).requires_grad_(grad)
    k = torch.randn(B, Hkv, 11, D).to(dtype).requires_grad_(grad)
    q_pos, k_pos = torch.randint(0, 1 << 20, (B, 7)), torch.randint(0, 1 << 20, (B, 11))
    inv = base_inv_freq(r, 10000.0)
    cs = (*angles_cos_sin(q_pos, inv), *angles_cos_sin(k_pos, inv))
    fast = apply_rotary_qk(q, k, *cs, layout, kernel="compiled")
    assert not kernels.compile_failed()  # else the eager fallback ran and this test is vacuous
    slow = apply_rotary_qk(q, k, *cs, layout, kernel="eager")
    for f, s, x, pos in zip(fast, slow, (q, k), (q_pos, k_pos)):
        assert f.dtype == dtype
        # bf16: both round float32 math once; float32: fused multiply-adds may differ in the last bit
        tol = dict(atol=2e-6, rtol=2e-6) if dtype == torch.float32 else dict(atol=0, rtol=0)
        torch.testing.assert_close(f, s, **tol)
        ref_tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2**-8)
        torch.testing.assert_close(f.double(), reference_matrix(x.detach(), pos, r, 10000.0, layout), **ref_tol)
        assert torch.equal(f[..., r:], x[..., r:])  # pass-through channels, bit for bit
    if grad:
        gq, gk = torch.randn_like(fast[0]), torch.randn_like(fast[1])
        got = torch.autograd.grad(fast, (q, k), (gq, gk))
        # R_m is orthogonal: the reference gradient is R_m^T g, by autograd through the matrix form.
        for x, pos, g, dx in zip((q, k), (q_pos, k_pos), (gq, gk), got):
            xd = x.detach().double().requires_grad_()
            (want,) = torch.autograd.grad(reference_matrix(xd, pos, r, 10000.0, layout), xd, g.double())
            torch.testing.assert_close(dx.double(), want, atol=1e-5, rtol=1e-5)


def test_auto_kernel_compiles_above_threshold_only(monkeypatch):
    calls = []
    real = kernels._compiled_kernel
    monkeypatch.setattr(kernels, "_compiled_kernel", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(functional, "AUTO_COMPILE_MIN_NUMEL", 1000)
    cos, sin = angles_cos_sin(torch.arange(4)[None], base_inv_freq(8, 10000.0))
    small, big = torch.randn(1, 2, 4, 8), torch.randn(1, 40, 4, 8)  # 64 and 1280 elements
    eager = apply_rotary(small, cos, sin, kernel="eager")
    assert torch.equal(apply_rotary(small, cos, sin, kernel="auto"), eager) and calls == []
    apply_rotary(big, cos, sin, kernel="auto")
    assert calls == [("half",)]  # one graph for x and an empty k
    monkeypatch.setattr(functional, "AUTO_COMPILE_MIN_NUMEL", None)  # None: never compile
    apply_rotary(big, cos, sin, kernel="auto")
    assert len(calls) == 1


def test_compile_failure_falls_back_to_eager_with_a_warning(monkeypatch):
    def broken(*args):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(kernels, "_compile_failed", False)
    monkeypatch.setattr(kernels, "_compiled_kernel", lambda *a: None if kernels.compile_failed() else broken)
    x = torch.randn(1, 2, 4, 8)
    cos, sin = angles_cos_sin(torch.arange(4)[None], base_inv_freq(8, 10000.0))
    with pytest.warns(UserWarning, match="compiled rotary kernel unavailable"):
        out = apply_rotary(x, cos, sin, kernel="compiled")
    assert torch.equal(out, apply_rotary(x, cos, sin, kernel="eager"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once; later calls go straight to eager
        apply_rotary(x, cos, sin, kernel="compiled")


def _table_state(enc) -> dict:
    return {key: (id(table.packed), table.packed._version, table.packed.data_ptr()) for key, table in enc._cache.items()}


# Graph breaks, host syncs and state mutation are Dynamo's and AOTAutograd's business:
# "aot_eager" traces exactly what Inductor would get, without seconds of C++ compilation per
# graph; one length-dependent case (and tests/test_compile.py's model) goes through Inductor.
@pytest.mark.parametrize(
    "name,scaling,backend",
    [("rope", s, "aot_eager") for s in ROPE_SCALINGS]
    + [("rope", "dynamic", "inductor"), ("xpos", "default", "aot_eager"), ("xpos", "dynamic", "aot_eager")],
)
def test_rotate_compiles_fullgraph_dynamic_for_every_scaling(name, scaling, backend):
    torch._dynamo.reset()
    H, D = 2, 16
    enc = posenc.build(name, d_model=H * D, num_heads=H, rotary_dim=8, scaling=scaling, **scaling_params(scaling))

    def step(q, k, q_pos, k_pos):
        return enc.rotate(q, k, q_pos, k_pos)

    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=backend)
    cases = []
    for T in (9, 40, 100):  # below and above the trained length 16; 100 is past a 64-row table
        k_pos = torch.arange(T).expand(2, T)  # as SequenceInfo.from_offset makes them (stride 0)
        cases.append((T, k_pos, k_pos))  # self-attention: q_pos is k_pos
        if enc.config.scaling_config.length_dependent:  # n = max(q_pos, k_pos) + 1 must see the keys
            cases.append((T, k_pos[:, -3:], k_pos))  # the last 3 queries (KV-cache step)
    with torch.no_grad():
        for T, q_pos, k_pos in cases:
            q, k = torch.randn(2, H, q_pos.shape[1], D), torch.randn(2, 1, T, D)
            want = step(q, k, q_pos, k_pos)  # eager: may grow its table or add a frequency set ...
            before = _table_state(enc)
            got = compiled(q, k, q_pos, k_pos)
            assert _table_state(enc) == before  # ... the compiled graph never touches the cache
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
