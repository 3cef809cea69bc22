"""Complex-order embeddings against an explicit complex128 evaluation of r exp(i(omega pos + theta))."""

from __future__ import annotations

import cmath

import pytest
import torch

from posenc import SequenceInfo, build


def _enc(**cfg):
    torch.manual_seed(0)
    enc = build("complex_order", d_model=8, num_heads=2, **cfg).double()
    with torch.no_grad():
        enc.theta.normal_()
        enc.omega.mul_(1 + 0.1 * torch.randn_like(enc.omega))
        if enc.omega_proj is not None:
            enc.omega_proj.normal_(std=0.3)
    return enc


def _reference(enc, x, positions):
    """Per token and complex dimension k: r e^{i(omega_k pos + theta_k + phi)}, r e^{i phi} = x_2k + i x_2k+1."""
    B, T, C = x.shape
    out = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for k in range(C // 2):
                z0 = complex(x[b, t, 2 * k].item(), x[b, t, 2 * k + 1].item())
                r, phi = abs(z0), cmath.phase(z0)
                omega = enc.omega[k].item()
                if enc.omega_proj is not None:
                    omega += (enc.omega_proj[k].double() @ x[b, t].double()).item()
                f = r * cmath.exp(1j * (omega * positions[b, t].item() + enc.theta[k].item() + phi))
                out[b, t, 2 * k], out[b, t, 2 * k + 1] = f.real, f.imag
    return out


@pytest.mark.parametrize("word_dependent", [False, True])
def test_matches_complex_reference(word_dependent):
    enc = _enc(word_dependent=word_dependent)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    seq = SequenceInfo.from_offset(2, 5, offset=torch.tensor([0, 1000]))
    torch.testing.assert_close(enc.embed(x, seq), _reference(enc, x, seq.positions), atol=1e-10, rtol=0)


def test_offset_transform_is_independent_of_position():
    # The paper's Property 1: moving a word by n multiplies dimension k by e^{i omega_k n}, whatever pos.
    enc = _enc()
    x = torch.randn(1, 1, 8, dtype=torch.float64).expand(1, 40, 8)
    out = enc.embed(x, SequenceInfo.from_offset(1, 40))[0]  # (40, 8)
    z = torch.view_as_complex(out.reshape(40, 4, 2).contiguous())  # (40, 4)
    n = 7
    shift = torch.exp(1j * enc.omega.detach().double() * n)  # (4,)
    torch.testing.assert_close(z[n:], z[:-n] * shift)
    torch.testing.assert_close(z.abs(), z[:1].abs().expand(40, 4))  # amplitudes stay those of x


def test_low_precision_keeps_float64_angles():
    enc = build("complex_order", d_model=8, num_heads=2).to(torch.bfloat16)
    x = torch.randn(1, 3, 8).to(torch.bfloat16)
    out = enc.embed(x, SequenceInfo.from_offset(1, 3, offset=100000))
    assert out.dtype == torch.bfloat16
    ref = _reference(enc.double(), x.double(), torch.tensor([[100000, 100001, 100002]]))
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


def test_bad_inputs():
    with pytest.raises(ValueError, match="d_model"):
        build("complex_order", d_model=9, num_heads=3)
    for bad in (0.0, -2.0, float("nan")):
        with pytest.raises(ValueError, match="base"):
            build("complex_order", d_model=8, num_heads=2, base=bad)
    with pytest.raises(TypeError, match="word_dependent"):
        build("complex_order", d_model=8, num_heads=2, word_dependent="yes")
