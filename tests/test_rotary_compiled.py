"""The torch.compile'd rotary kernel against the eager one and a float64 reference.

Compilation takes seconds per shape on CPU, so this file compiles few shapes.
"""

from __future__ import annotations

import pytest
import torch

from posenc.rotary import functional
from posenc.rotary import angles_cos_sin, apply_rotary, base_inv_freq

pytestmark = pytest.mark.compile


def reference(x, pos, r, layout):
    theta = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = pos.double()[..., None] * theta
    c, s = ang.cos()[:, None], ang.sin()[:, None]
    xd = x.double()
    i = torch.arange(r // 2)
    a_idx, b_idx = (i, i + r // 2) if layout == "half" else (2 * i, 2 * i + 1)
    out = xd.clone()
    a, b = xd[..., a_idx], xd[..., b_idx]
    out[..., a_idx], out[..., b_idx] = a * c - b * s, b * c + a * s
    return out


@pytest.mark.parametrize(
    "layout,dtype,r,grad",
    [("half", torch.bfloat16, 48, False), ("interleaved", torch.float32, 64, False), ("half", torch.float32, 64, True)],
)
def test_compiled_matches_eager_and_reference(layout, dtype, r, grad):
    B, H, T, D = 2, 3, 33, 64
    x = torch.randn(B, H, T, D).to(dtype).requires_grad_(grad)
    pos = torch.randint(0, 1 << 20, (B, T))
    cos, sin = angles_cos_sin(pos, base_inv_freq(r, 10000.0))
    fast = apply_rotary(x, cos, sin, layout, kernel="compiled")
    assert not functional._compile_failed  # else the eager fallback ran and this test is vacuous
    slow = apply_rotary(x, cos, sin, layout, kernel="eager")
    assert fast.dtype == dtype
    tol = dict(atol=2e-6, rtol=2e-6) if dtype == torch.float32 else dict(atol=0, rtol=0)
    # bf16: both round float32 math once; float32: fused multiply-adds may differ in the last bit
    torch.testing.assert_close(fast, slow, **tol)
    ref_tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2**-8)
    torch.testing.assert_close(fast.double(), reference(x.detach(), pos, r, layout), **ref_tol)
    assert torch.equal(fast[..., r:], x[..., r:])
    if grad:
        g = torch.randn_like(fast)
        (gf,) = torch.autograd.grad(fast, x, g)
        (gs,) = torch.autograd.grad(slow, x, g)
        torch.testing.assert_close(gf, gs, atol=2e-6, rtol=2e-6)
