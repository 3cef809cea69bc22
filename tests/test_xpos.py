"""xPos (Sun et al. 2022): RoPE times zeta_j^(m/scale_base) on q and zeta_j^(-n/scale_base) on k."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import ModelConfig, SequenceInfo
from posenc.rotary.xpos import xpos_max_position, xpos_scale


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
    with pytest.raises(ValueError, match=r"positions must be <= 35694 for xPos with scale_base=512.*"
                                         r"torch.float32.*got position 100000\. Use scale_base >= 1435"):
        xpos.rotate(q, q, torch.tensor([[100000]]), torch.tensor([[100000]]))
    with pytest.raises(ValueError, match="scale_base must be > 0"):
        posenc.build("xpos", d_model=16, num_heads=1, scale_base=0.0)


@pytest.mark.parametrize("dtype, limit", [(torch.float16, 3966), (torch.bfloat16, 35694), (torch.float32, 35694),
                                          (torch.float64, 35694)])
def test_max_position_is_the_last_with_normal_scales(dtype, limit):
    # By hand: floor(512 * min(ln max, -ln tiny) / ln(1.4 / 0.4)); float16: tiny = 2^-14 binds,
    # 512 * 9.7041 / 1.25276 = 3966.0; float32/bfloat16: tiny = 2^-126, 512 * 87.337 / 1.25276 = 35694.
    # float64 inputs are rotated with float32 cos/sin, so float32's range applies.
    assert xpos_max_position(512.0, 0.4, dtype) == limit
    fi = torch.finfo(torch.float32 if dtype == torch.float64 else dtype)
    at, past = xpos_scale(torch.tensor([[limit, limit + 1]]), 8, 512.0)[0, :, 0].tolist()  # zeta_0^(n/512)
    assert fi.tiny <= at and 1 / at <= fi.max
    assert past < fi.tiny  # q's scale is subnormal one position later


def _lm(dtype):
    torch.manual_seed(0)
    model = posenc.Transformer(ModelConfig(encoding="xpos", d_model=64, n_head=4, n_layer=2)).eval()
    return model.to(dtype)


def test_float16_model_is_finite_or_a_clear_error():
    # Issue 10: a float16 xPos model gave NaN logits from about position 4600 on, without error.
    ref, half = _lm(torch.float64), _lm(torch.float16)
    tokens = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for offset in (0, 2000, 3950):  # last position 3965 <= 3966
            seq = SequenceInfo.from_offset(1, 16, offset)
            got, want = half(tokens, seq), ref(tokens, seq)
            assert torch.isfinite(got).all()
            # float16 logits against the float64 model: a few float16 ulps of the logit scale.
            torch.testing.assert_close(got.double(), want, atol=0.05 * float(want.abs().max()), rtol=0)
        for offset in (3952, 4600, 5000, 40000):  # last position 3967 and beyond
            with pytest.raises(ValueError, match=r"positions must be <= 3966 for xPos.*torch.float16.*Use scale_base >="):
                half(tokens, SequenceInfo.from_offset(1, 16, offset))


def test_bfloat16_model_is_finite_at_long_positions():
    model = _lm(torch.bfloat16)
    tokens = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.isfinite(model(tokens, SequenceInfo.from_offset(1, 8, 30000)).float()).all()
        with pytest.raises(ValueError, match=r"positions must be <= 35694 .*torch.bfloat16"):
            model(tokens, SequenceInfo.from_offset(1, 8, 35690))


def test_float16_key_overflow_below_the_limit_is_an_error():
    # At n = 3900 k's scale is zeta_0^(-3900/512) = e^(9.54) ~ 13 900: a key entry of 10 would
    # be 139 000 > 65504 (inf), so the rotation refuses instead of returning inf.
    xpos = posenc.build("xpos", d_model=8, num_heads=1)
    q, pos = torch.ones(1, 1, 1, 8, dtype=torch.float16), torch.tensor([[3900]])
    rq, rk = xpos.rotate(q, q, pos, pos)
    assert torch.isfinite(rk).all()
    with pytest.raises(ValueError, match=r"xPos rotated keys overflow torch.float16 .* at positions up to 3900"):
        xpos.rotate(q, 10 * q, pos, pos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_prepared_state_and_small_step_equal_a_standalone_call(dtype, spy, no_cpu_kernel):
    """prepare() computes q's and k's scaled tables once per forward; a decoding-sized step
    without autograd rotates with the three-op rolled form: the same bits as the eager
    kernel, and the scores match the complex reference; with autograd the plan takes the
    functional form."""
    from posenc.rotary import functional
    from posenc.rotary.functional import Rotation, rotation_plan

    H, D = 2, 16
    enc = posenc.build("xpos", d_model=H * D, num_heads=H, scale_base=64.0)
    pos = torch.tensor([[40, 41]])
    q, k = torch.randn(1, H, 2, D, dtype=torch.float64).to(dtype), torch.randn(1, H, 2, D, dtype=torch.float64).to(dtype)
    taken = spy(functional, "rotate_half_rolled")
    with torch.no_grad():
        state = enc.prepare(pos, pos)
        assert rotation_plan("auto", "half", q, k, state.tables).way is Rotation.ROLLED
        fast = enc.rotate(q, k, pos, pos, state=state)
        assert taken == [1, 1]  # q, then k
        alone = functional.WAYS[Rotation.EAGER](q, k, state.tables, "half")  # the eager kernel itself
    assert taken == [1, 1]
    for a, b in zip(fast, alone):
        assert a.dtype == dtype and torch.equal(a, b)
    if dtype == torch.float64:  # scores against the complex reference (half layout: pairs j, j + D/2)
        inter = lambda x: torch.stack([x[..., : D // 2], x[..., D // 2 :]], -1).flatten(-2)
        for i in range(2):
            for j in range(2):
                want = reference_scores(inter(q[0, :, i]), inter(k[0, :, j]), 40 + i, 40 + j, D, 64.0)
                torch.testing.assert_close((fast[0][0, :, i] * fast[1][0, :, j]).sum(-1), want, atol=1e-5, rtol=1e-6)
    q.requires_grad_()
    assert rotation_plan("auto", "half", q, k, enc.prepare(pos, pos).tables).way is Rotation.FUNCTIONAL  # autograd
    with torch.no_grad():
        with pytest.raises(ValueError, match="positions must be >= 0"):
            enc.prepare(torch.tensor([[-1, 0]]), torch.tensor([[-1, 0]]))
