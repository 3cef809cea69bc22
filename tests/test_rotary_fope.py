"""fope (FoPE, Hua et al. 2025): checked against a slow loop written from vLLM 0.33.0's
FourierRotaryEmbedding (the frequency selection, one cos / sin coefficient set per KV head,
the padding of the dropped frequencies with 1, the neox application, the grouping of query
heads), and against RoPE where FoPE reduces to it."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.rotary.fope import fope_kept_frequencies

F64 = torch.float64


def _vllm_slow(x, pos, cos_coef, sin_coef, base, L, num_inv_freq=None):
    """vLLM's computation, element by element. x (B, Hx, T, D), pos (B, T); coefficients
    (c, F, F): head h of x uses set h // (Hx / c)."""
    B, Hx, T, D = x.shape
    c = cos_coef.shape[0]
    kept = []
    for i in range(D // 2):
        theta = 1.0 / base ** (2 * i / D)
        if (i < num_inv_freq) if num_inv_freq is not None else theta > 2 * math.pi / L:
            kept.append(theta)
    F = len(kept)
    assert cos_coef.shape[1:] == (F, F)
    out = torch.empty_like(x)
    for b in range(B):
        for t in range(T):
            m = int(pos[b, t])
            for h in range(Hx):
                g = h // (Hx // c)
                cs, sn = [], []
                for d in range(D // 2):
                    if d < F:  # a Fourier series over the kept frequencies
                        cs.append(sum(float(cos_coef[g, i, d]) * math.cos(m * kept[i]) for i in range(F)))
                        sn.append(sum(float(sin_coef[g, i, d]) * math.sin(m * kept[i]) for i in range(F)))
                    else:  # F.pad(..., value=1)
                        cs.append(1.0)
                        sn.append(1.0)
                cs, sn = cs + cs, sn + sn  # torch.cat((cos, cos), -1)
                v = x[b, h, t].tolist()
                rot = [-v[j + D // 2] for j in range(D // 2)] + [v[j] for j in range(D // 2)]  # rotate_neox
                out[b, h, t] = torch.tensor([v[j] * cs[j] + rot[j] * sn[j] for j in range(D)], dtype=x.dtype)
    return out


def _fope(H=4, D=16, **kw):
    enc = posenc.build("fope", d_model=H * D, num_heads=H, **kw).double()
    torch.manual_seed(3)
    with torch.no_grad():  # coefficients far from the identity, so the mixing is seen
        enc.cos_coef.normal_()
        enc.sin_coef.normal_()
    return enc


@pytest.mark.parametrize("kw", [
    {"coef_heads": 2, "max_position_embeddings": 200},  # vLLM: one set per KV head, the cut at L
    {"coef_heads": 1, "max_position_embeddings": 10**6},  # every frequency kept
    {"coef_heads": 2, "num_inv_freq": 3},
])
def test_rotation_equals_vllms_computation_as_a_slow_loop(kw):
    enc = _fope(**kw)
    q, k = torch.randn(2, 4, 5, 16, dtype=F64), torch.randn(2, 2, 5, 16, dtype=F64)
    pos = torch.tensor([[0, 1, 7, 300, 5000], [2, 3, 4, 5, 6]])
    rq, rk = enc.rotate(q, k, pos, pos)
    args = (enc.cos_coef.detach(), enc.sin_coef.detach(), 10000.0, kw.get("max_position_embeddings", 2048),
            kw.get("num_inv_freq"))
    torch.testing.assert_close(rq, _vllm_slow(q, pos, *args), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(rk, _vllm_slow(k, pos, *args), atol=1e-10, rtol=1e-10)
    # prepare()'s state (self-attention) gives the same, and keys at other positions take theirs
    rq2, rk2 = enc.rotate(q, k, pos, pos, enc.prepare(pos, pos))
    torch.testing.assert_close((rq2, rk2), (rq, rk), atol=0, rtol=0)
    kpos = pos + 11
    _, rk3 = enc.rotate(q, k, pos, kpos)
    torch.testing.assert_close(rk3, _vllm_slow(k, kpos, *args), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("L,base,D,want", [(2048, 10000.0, 16, 6), (200, 10000.0, 16, 4), (10**6, 10000.0, 16, 8),
                                            (4096, 500000.0, 128, 32)])
def test_kept_frequencies_are_those_with_a_period_shorter_than_L(L, base, D, want):
    kept = fope_kept_frequencies(D, base, L)
    assert kept.numel() == want
    assert all(2 * math.pi / t < L for t in kept.tolist())
    nxt = base ** (-2 * want / D)
    assert want == D // 2 or 2 * math.pi / nxt >= L  # the first dropped one: a period of L or more
    assert fope_kept_frequencies(D, base, L, num_inv_freq=2).tolist() == kept[:2].tolist()


def test_identity_coefficients_with_every_frequency_kept_are_rope():
    enc = posenc.build("fope", d_model=64, num_heads=4, init_gain=0.0, num_inv_freq=8).double()
    rope = posenc.build("rope", d_model=64, num_heads=4).double()
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 6, 16, dtype=F64), torch.randn(2, 2, 6, 16, dtype=F64)
    pos = torch.tensor([[0, 5, 9, 100, 1000, 4095], [1, 2, 3, 4, 5, 6]])
    for a, b in zip(enc.rotate(q, k, pos, pos), rope.rotate(q, k, pos, pos)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)  # RoPE's cos/sin tables are float32


def test_dropped_pairs_are_fixed_and_double_their_logit():
    """Dropped frequencies: C = S = 1 at every position, so the pair's logit is 2 q.k, whatever m, n."""
    enc = _fope(max_position_embeddings=200)
    F = enc.num_kept
    assert 0 < F < 8
    torch.manual_seed(1)
    q, k = torch.randn(1, 4, 1, 16, dtype=F64), torch.randn(1, 2, 1, 16, dtype=F64)
    dropped = list(range(F, 8)) + [i + 8 for i in range(F, 8)]

    def pair_logit(m: int, n: int) -> float:
        with torch.no_grad():
            rq, rk = enc.rotate(q, k, torch.tensor([[m]]), torch.tensor([[n]]))
        return float((rq[0, 0, 0] * rk[0, 0, 0])[dropped].sum())

    plain = float((q[0, 0, 0] * k[0, 0, 0])[dropped].sum())
    for m, n in [(0, 0), (3, 1), (5000, 7), (7, 5000)]:
        assert pair_logit(m, n) == pytest.approx(2 * plain, abs=1e-12)


def test_learned_coefficients_break_relativity():
    """The claim registered: with mixing coefficients q'.k' depends on m and n, not m - n alone."""
    enc = _fope(max_position_embeddings=10**6)
    q, k = torch.randn(1, 4, 1, 16, dtype=F64), torch.randn(1, 2, 1, 16, dtype=F64)

    def logit(m: int, n: int) -> float:
        with torch.no_grad():
            rq, rk = enc.rotate(q, k, torch.tensor([[m]]), torch.tensor([[n]]))
        return float((rq[0, 0, 0] * rk[0, 0, 0]).sum())

    assert abs(logit(5, 2) - logit(105, 102)) > 1e-3


def test_coefficients_learn_and_stay_float32_under_bf16():
    model = posenc.Transformer(posenc.ModelConfig(vocab_size=32, d_model=32, n_layer=2, n_head=4, n_kv_head=2,
                                                  encoding="fope", encoding_config={"coef_heads": 2}))
    enc = model.encodings[0]
    assert enc.cos_coef.shape == (2, enc.num_kept, enc.num_kept)
    model(torch.randint(0, 32, (2, 9))).sum().backward()
    assert enc.cos_coef.grad.abs().sum() > 0 and enc.sin_coef.grad.abs().sum() > 0
    model.to(torch.bfloat16)
    assert enc.cos_coef.dtype == torch.float32 and enc.sin_coef.dtype == torch.float32


@pytest.mark.parametrize("kw,exc,match", [
    ({"base": 1.0}, ValueError, r"^base must be > 1 .*got 1.0$"),
    ({"max_position_embeddings": 0}, ValueError, r"^max_position_embeddings must be >= 1, got 0$"),
    ({"num_inv_freq": 0}, ValueError, r"^num_inv_freq must be >= 1, got 0$"),
    ({"num_inv_freq": 9}, ValueError, r"^num_inv_freq must be <= head_dim / 2 \(8\), got 9$"),
    ({"coef_heads": 3}, ValueError, r"^coef_heads must divide num_heads \(4\), got 3$"),
    ({"init_gain": -0.1}, ValueError, r"^init_gain must be"),
    ({"coef_heads": 1.5}, TypeError, r"^coef_heads must be an int"),
])
def test_bad_configs_are_one_clear_error(kw, exc, match):
    with pytest.raises(exc, match=match):
        posenc.build("fope", d_model=64, num_heads=4, **kw)


def test_key_heads_the_coefficient_sets_do_not_divide_are_refused():
    enc = posenc.build("fope", d_model=64, num_heads=4, coef_heads=4)
    q, k, pos = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16), torch.arange(3)[None]
    with pytest.raises(ValueError, match=r"^coef_heads \(4\) must divide the heads of k, got 2$"):
        enc.rotate(q, k, pos, pos)


@pytest.mark.parametrize("kw", [dict(), dict(coef_heads=2, num_inv_freq=3)])
def test_prepared_tables_are_the_rolled_form_of_tables(kw):
    """prepare writes C and the rolled S straight into two tensors (the kept frequencies, then 1
    for the dropped ones, in each half); the same numbers as tables() laid out by pads and
    concatenations, then rolled (rolled's sign moved onto the first half of S)."""
    enc = posenc.build("fope", d_model=32, num_heads=4, **kw)
    with torch.no_grad():
        enc.cos_coef.normal_()
        enc.sin_coef.normal_()
    pos = torch.tensor([[0, 3, 17, 900]])
    state = enc.prepare(pos, pos)
    cos, sin = enc.rolled(*enc.tables(pos))
    assert torch.equal(state.cos, cos) and torch.equal(state.sin, sin)
    h = enc.dims.head_dim // 2
    if enc.num_kept < h:  # the dropped frequencies: C = 1, rolled S = -1 then 1
        assert (cos[..., enc.num_kept:h] == 1).all() and (sin[..., enc.num_kept:h] == -1).all()
        assert (sin[..., h + enc.num_kept:] == 1).all()
