"""xPos (Sun et al. 2022): RoPE times zeta_j^(m/scale_base) on q and zeta_j^(-n/scale_base) on k."""

from __future__ import annotations

import pytest
import torch

import posenc


def reference_scores(q, k, m, n, d, scale_base, gamma=0.4):
    """sum_j Re[(q_j e^{i m th_j} z_j^{m/sb}) conj(k_j e^{i n th_j} z_j^{-n/sb})], interleaved pairs."""
    j = torch.arange(0, d, 2, dtype=torch.float64)
    theta = 10000.0 ** (-j / d)
    zeta = (j / d + gamma) / (1 + gamma)
    qc = torch.complex(q[..., 0::2], q[..., 1::2]) * torch.polar(zeta ** (m / scale_base), m * theta)
    kc = torch.complex(k[..., 0::2], k[..., 1::2]) * torch.polar(zeta ** (-n / scale_base), n * theta)
    return (qc * kc.conj()).real.sum(-1)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_scores_depend_on_distance_and_match_reference(layout):
    d = 16
    xpos = posenc.build("xpos", d_model=d, num_heads=1, layout=layout, scale_base=64.0)
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    for m, n in [(5, 2), (105, 102), (3000, 2997), (2, 5), (40, 40)]:
        rq, rk = xpos.rotate(q.view(1, 1, 1, d), k.view(1, 1, 1, d), torch.tensor([[m]]), torch.tensor([[n]]))
        got = float((rq * rk).sum())
        if layout == "interleaved":
            ref = float(reference_scores(q, k, m, n, d, 64.0))
            assert got == pytest.approx(ref, rel=1e-5, abs=1e-5)
        ref0 = float(reference_scores(q, k, m - n + 10, 10, d, 64.0)) if layout == "interleaved" else None
        if ref0 is not None:
            assert got == pytest.approx(ref0, rel=1e-5, abs=1e-5)


def test_scores_match_rotary_embedding_torch():
    # lucidrains' rotary-embedding-torch (interleaved pairs, same zeta) centres positions;
    # scores depend on m - n only, so they must agree with ours.
    ret = pytest.importorskip("rotary_embedding_torch")
    d, T = 32, 20
    theirs = ret.RotaryEmbedding(dim=d, use_xpos=True, xpos_scale_base=128)
    ours = posenc.build("xpos", d_model=d, num_heads=1, layout="interleaved", scale_base=128.0)
    q, k = torch.randn(1, 1, T, d), torch.randn(1, 1, T, d)
    tq, tk = theirs.rotate_queries_and_keys(q, k)
    pos = torch.arange(T)[None]
    oq, ok = ours.rotate(q, k, pos, pos)
    torch.testing.assert_close(oq @ ok.transpose(-1, -2), tq @ tk.transpose(-1, -2), atol=1e-4, rtol=1e-4)


def test_decays_for_past_keys_and_grows_for_future_keys():
    # The bidirectional caveat documented in posenc/rotary/xpos.py.
    d = 8
    xpos = posenc.build("xpos", d_model=d, num_heads=1, scale_base=16.0)
    q = torch.ones(1, 1, 1, d)
    far_past = xpos.rotate(q, q, torch.tensor([[100]]), torch.tensor([[0]]))
    far_future = xpos.rotate(q, q, torch.tensor([[0]]), torch.tensor([[100]]))
    past_norm = far_past[0].norm() * far_past[1].norm()
    future_norm = far_future[0].norm() * far_future[1].norm()
    assert past_norm > 0 and future_norm > past_norm


def test_overflow_is_a_clear_error():
    xpos = posenc.build("xpos", d_model=16, num_heads=1)
    q = torch.randn(1, 1, 1, 16)
    with pytest.raises(ValueError, match="overflows float32 at position 100000.*scale_base"):
        xpos.rotate(q, q, torch.tensor([[100000]]), torch.tensor([[100000]]))
    with pytest.raises(ValueError, match="scale_base must be > 0"):
        posenc.build("xpos", d_model=16, num_heads=1, scale_base=0.0)
