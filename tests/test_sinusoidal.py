"""Sinusoidal encoding (Vaswani et al. 2017): golden values, the rotation property, fusions, errors."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import SequenceInfo, build
from posenc.absolute import sinusoidal_table
from posenc.absolute.sinusoidal import SinusoidalConfig


def test_golden_values_d4_by_hand():
    # D = 4, base 10000: inverse frequencies 10000^(-0/4) = 1 and 10000^(-2/4) = 0.01, so
    # PE(p) = [sin p, cos p, sin 0.01p, cos 0.01p] (interleaved), [sin p, sin 0.01p, cos p, cos 0.01p] (half).
    pos = torch.arange(4)
    inter = [[math.sin(p), math.cos(p), math.sin(0.01 * p), math.cos(0.01 * p)] for p in range(4)]
    half = [[math.sin(p), math.sin(0.01 * p), math.cos(p), math.cos(0.01 * p)] for p in range(4)]
    torch.testing.assert_close(sinusoidal_table(pos, 4, 10000.0, "interleaved"), torch.tensor(inter), atol=1e-7, rtol=0)
    torch.testing.assert_close(sinusoidal_table(pos, 4, 10000.0, "half"), torch.tensor(half), atol=1e-7, rtol=0)
    # PE(1) spelled out, as in the brief.
    assert sinusoidal_table(torch.tensor([1]), 4)[0].tolist() == pytest.approx(
        [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], abs=1e-7
    )


def _rotation(k: int, dim: int, base: float) -> torch.Tensor:
    """T(k): block-diagonal 2x2 rotations mapping (sin a, cos a) to (sin(a + kw), cos(a + kw))."""
    T = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        b = k * base ** (-2.0 * i / dim)
        # sin(a+b) = cos b sin a + sin b cos a;  cos(a+b) = -sin b sin a + cos b cos a
        T[2 * i, 2 * i], T[2 * i, 2 * i + 1] = math.cos(b), math.sin(b)
        T[2 * i + 1, 2 * i], T[2 * i + 1, 2 * i + 1] = -math.sin(b), math.cos(b)
    return T


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_shift_is_a_linear_map_independent_of_p(base):
    dim = 16
    pe = sinusoidal_table(torch.arange(300), dim, base).double()
    for k in (1, 3, 17, 100):
        T = _rotation(k, dim, base)
        for p in range(0, 200, 7):
            torch.testing.assert_close(pe[p + k], T @ pe[p], atol=2e-6, rtol=0)


def test_dot_products():
    dim = 32
    pe = sinusoidal_table(torch.arange(256), dim).double()  # (256, 32)
    torch.testing.assert_close((pe * pe).sum(-1), torch.full((256,), dim / 2, dtype=torch.float64), atol=1e-5, rtol=0)
    gram = pe @ pe.T  # (256, 256): must be Toeplitz, PE(p).PE(q) = g(p - q)
    for s in (1, 5, 40):
        torch.testing.assert_close(gram[s:, s:], gram[:-s, :-s], atol=1e-5, rtol=0)


def test_fusions_and_learnable_scale():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    seq = SequenceInfo.from_offset(2, 6, offset=3)
    pe = sinusoidal_table(seq.positions, 8)  # (2, 6, 8)
    add = build("sinusoidal", d_model=8, num_heads=2)
    torch.testing.assert_close(add.embed(x, seq), x + pe)
    mul = build("sinusoidal", d_model=8, num_heads=2, fusion="mul")
    torch.testing.assert_close(mul.embed(x, seq), x * pe)
    cat = build("sinusoidal", d_model=8, num_heads=2, fusion="concat", dim=4)
    ref = torch.cat([x, sinusoidal_table(seq.positions, 4)], -1) @ cat.proj.weight.T  # (2, 6, 8)
    torch.testing.assert_close(cat.embed(x, seq), ref)
    scaled = build("sinusoidal", d_model=8, num_heads=2, learnable_scale=True)
    with torch.no_grad():
        scaled.scale.fill_(0.25)
    out = scaled.embed(x, seq)
    torch.testing.assert_close(out, x + 0.25 * pe)
    out.sum().backward()
    assert scaled.scale.grad is not None and torch.isclose(scaled.scale.grad, pe.sum())


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="dim"):
        SinusoidalConfig(dim=3)
    with pytest.raises(ValueError, match="d_model"):
        build("sinusoidal", d_model=7, num_heads=1)
    with pytest.raises(ValueError, match="dim must equal d_model"):
        build("sinusoidal", d_model=8, num_heads=2, dim=4)  # add needs dim == d_model
    for base in (0.0, -1.0):
        with pytest.raises(ValueError, match="base"):
            SinusoidalConfig(base=base)
    with pytest.raises(ValueError, match="base"):
        SinusoidalConfig(base=float("nan"))
    with pytest.raises(ValueError, match="layout"):
        SinusoidalConfig(layout="diagonal")
    with pytest.raises(ValueError, match="fusion"):
        SinusoidalConfig(fusion="max")
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_table(torch.arange(3), 5)
    with pytest.raises(ValueError, match="layout"):
        sinusoidal_table(torch.arange(3), 4, layout="nope")


def test_layouts_are_spelled_as_rotary_and_the_old_spelling_names_the_new():
    # One vocabulary for both families: "half" and "interleaved" (issue 11).
    from posenc.rotary import LAYOUTS as ROTARY_LAYOUTS

    from posenc.absolute.sinusoidal import LAYOUTS

    assert set(LAYOUTS) == set(ROTARY_LAYOUTS) == {"half", "interleaved"}
    msg = r"layout must be one of 'interleaved', 'half'; got 'halves' \(spelled 'half' now\)"
    with pytest.raises(ValueError, match=msg):
        build("sinusoidal", d_model=8, num_heads=2, layout="halves")
    with pytest.raises(ValueError, match=msg):
        sinusoidal_table(torch.arange(3), 4, layout="halves")
    with pytest.raises(ValueError, match=r"layout must be one of 'half', 'interleaved'; got 'halves' \(spelled 'half' now\)"):
        build("rope", d_model=8, num_heads=2, layout="halves")
