"""alibi: the slopes against their closed form, golden values and transformers' BLOOM slopes;
the bias against a slow loop over (b, h, i, j), Toeplitz and unbounded; slopes stay float32 in
a bfloat16 model; bad input named."""

from __future__ import annotations

import pytest
import torch

from posenc import build
from posenc.relative.alibi import alibi_bias, alibi_slopes

from bias_reference import H, K_POS, Q_POS


def closed_form_slopes(n: int) -> list[float]:
    """The official rule written out: n = 2^k: 2^(-8i/n), i = 1..n. Otherwise p = 2^floor(log2 n):
    2^(-8i/p) for i = 1..p, then the odd-indexed slopes of 2p heads, 2^(-8(2i-1)/(2p)), i = 1..n-p."""
    p = 1
    while 2 * p <= n:
        p *= 2
    return [2.0 ** (-8 * i / p) for i in range(1, p + 1)] + [
        2.0 ** (-8 * (2 * i - 1) / (2 * p)) for i in range(1, n - p + 1)
    ]


def test_alibi_slopes_golden():
    # By hand: n=1: [2^-8]; n=2: [2^-4, 2^-8]; n=3: those, then 4 heads' first odd slope 2^-2;
    # n=8: 1/2 ... 1/256.
    assert alibi_slopes(1) == [2**-8]
    assert alibi_slopes(2) == [2**-4, 2**-8]
    assert alibi_slopes(3) == [2**-4, 2**-8, 2**-2]
    assert alibi_slopes(8) == [2.0**-i for i in range(1, 9)]
    for n in range(1, 17):
        got = alibi_slopes(n)
        assert len(got) == n
        assert got == pytest.approx(closed_form_slopes(n), rel=1e-14), n


def test_alibi_slopes_match_transformers():
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    for n in range(1, 33):
        theirs = bloom._get_alibi_slopes(n, torch.device("cpu")).double()
        torch.testing.assert_close(torch.tensor(alibi_slopes(n), dtype=torch.float64), theirs, rtol=1e-6, atol=0)


@pytest.mark.parametrize("symmetric", [True, False])
def test_alibi_against_reference(symmetric):
    slopes = torch.tensor(alibi_slopes(H), dtype=torch.float64)
    bias = alibi_bias(Q_POS, K_POS, slopes, symmetric)

    def ref(b, h, i, j):
        d = int(Q_POS[b, i]) - int(K_POS[b, j])
        return torch.tensor(-slopes[h].item() * (abs(d) if symmetric else d), dtype=torch.float64)

    B, Tq, Tk = 2, 4, 6
    want = torch.stack([torch.stack([torch.stack([torch.stack([ref(b, h, i, j) for j in range(Tk)])
                        for i in range(Tq)]) for h in range(H)]) for b in range(B)])
    torch.testing.assert_close(bias, want, atol=1e-10, rtol=1e-10)
    # The module: float32, same values.
    enc = build("alibi", d_model=12, num_heads=H, symmetric=symmetric)
    got = enc.score_bias(Q_POS, K_POS)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


def test_alibi_toeplitz_and_unbounded():
    enc = build("alibi", d_model=32, num_heads=4)
    pos = torch.arange(50)[None]
    bias = enc.score_bias(pos, pos)[0]  # (H, T, T)
    for k in range(-49, 50):  # constant along every diagonal: depends on i - j only
        diag = torch.diagonal(bias, offset=k, dim1=-2, dim2=-1)
        assert (diag == diag[:, :1]).all()
    shifted = enc.score_bias(pos + 12345, pos + 12345)[0]  # and not on the absolute position
    assert torch.equal(shifted, bias)
    # Unbounded: exactly linear in the distance, at any distance.
    q = torch.tensor([[2_000_000]])
    far = enc.score_bias(q, torch.tensor([[0, 1_000_000, 1_999_999]]))[0, :, 0]  # (H, 3)
    m = torch.tensor(alibi_slopes(4))
    torch.testing.assert_close(far, -m[:, None] * torch.tensor([2e6, 1e6, 1.0]), rtol=1e-6, atol=0)


def test_alibi_slopes_survive_a_bfloat16_model():
    enc = build("alibi", d_model=48, num_heads=6).to(torch.bfloat16)
    pos = torch.arange(9)[None]
    want = alibi_bias(pos, pos, torch.tensor(alibi_slopes(6)))
    assert torch.equal(enc.score_bias(pos, pos), want)


def test_alibi_rejects_bad_input():
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="num_heads"):
        alibi_slopes(4.0)
    with pytest.raises(TypeError, match="symmetric"):
        build("alibi", d_model=16, num_heads=4, symmetric="yes")
