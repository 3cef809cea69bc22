"""Content-independent relative biases: T5, ALiBi, KERPLE, FIRE.

Every bias is checked against a slow reference written here as loops over (b, h, i, j)
that spell out the paper's formula, in float64, forward and backward; plus golden values
worked out by hand, property tests, parity with transformers, and bad inputs.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import posenc
from posenc import ModelConfig, SequenceInfo, Transformer, build
from posenc.relative.alibi import alibi_bias, alibi_slopes
from posenc.relative.t5 import t5_relative_position_bucket

from helpers import tiny_model

# Arbitrary positions: an offset row, a row with gaps (packing/padding/cache), Tq != Tk, and
# keys after queries (bidirectional use).
Q_POS = torch.tensor([[5, 6, 7, 8], [0, 3, 9, 20]])
K_POS = torch.tensor([[0, 1, 2, 3, 9, 300], [1, 2, 3, 4, 5, 160]])
H = 3

# From the registry: every encoding with a content-independent bias; those with learned
# parameters; those whose bias depends on q_pos - k_pos alone (a Toeplitz BiasTerm).
_BUILT = {n: build(n, d_model=16, num_heads=4) for n in posenc.list_encodings()}
BIAS = [n for n, e in _BUILT.items() if e.has_bias]
LEARNED_BIAS = [n for n in BIAS if any(True for _ in _BUILT[n].parameters())]
TOEPLITZ = [n for n in BIAS if _BUILT[n].logit_bias().toeplitz]


def _bias64(name: str, **config) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    enc = build(name, d_model=H * 4, num_heads=H, **config).double()
    with torch.no_grad():  # non-trivial values
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return enc, enc.score_bias(Q_POS, K_POS)


def _check_against_reference(enc, bias, ref_fn):
    """Forward to 1e-10 and gradients w.r.t. every parameter, against ``ref_fn(b, h, i, j)``."""
    B, Tq, Tk = Q_POS.shape[0], Q_POS.shape[1], K_POS.shape[1]
    assert bias.dtype == torch.float64 and bias.shape[1:] == (H, Tq, Tk)
    ref = torch.stack(
        [
            torch.stack(
                [
                    torch.stack([torch.stack([ref_fn(b, h, i, j) for j in range(Tk)]) for i in range(Tq)])
                    for h in range(H)
                ]
            )
            for b in range(B)
        ]
    )  # (B, H, Tq, Tk)
    torch.testing.assert_close(bias.expand_as(ref), ref, atol=1e-10, rtol=1e-10)
    params = list(enc.parameters())
    upstream = torch.randn(ref.shape, dtype=torch.float64)
    got = torch.autograd.grad((bias * upstream).sum(), params, allow_unused=True)
    want = torch.autograd.grad((ref * upstream).sum(), params, allow_unused=True)
    for p, g, w in zip(params, got, want):
        g = torch.zeros_like(p) if g is None else g
        w = torch.zeros_like(p) if w is None else w
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------------------------- T5 ---


def exact_bucket(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket re-derived in pure Python with exact arithmetic (rel = key - query).

    The log bucket is floor(log(n/e) / log(D/e) * (nb - e)); the floor is decided exactly:
    k <= that value iff (n/e)^(nb-e) >= (D/e)^k, compared as Fractions.
    """
    ret = 0
    nb = num_buckets
    if bidirectional:
        nb //= 2
        ret += nb if rel > 0 else 0
        n = abs(rel)
    else:
        n = max(-rel, 0)
    e = nb // 2
    if n < e:
        return ret + n
    guess = int(math.log(n / e) / math.log(max_distance / e) * (nb - e))
    lhs = Fraction(n, e) ** (nb - e)
    k = max(guess - 1, 0)
    while Fraction(max_distance, e) ** (k + 1) <= lhs:
        k += 1
    return ret + min(e + k, nb - 1)


def test_t5_bucket_hand_worked_values():
    # Bidirectional, 32 buckets, max_distance 128: 16 buckets a side, exact range [0, 8),
    # bucket 8 + floor(8 * log(n/8) / log(16)) = 8 + floor(2 * log2(n / 8)) beyond.
    bidir = {
        0: 0, -1: 1, -7: 7,  # exact range, last exact bucket
        -8: 8,  # first log bucket (log(1) = 0)
        -11: 8, -12: 9,  # 2*log2(11/8) = 0.92, 2*log2(12/8) = 1.17
        -16: 10,  # 2*log2(2) = 2 exactly
        -90: 14, -91: 15,  # 2*log2(90/8) = 6.98, 2*log2(91/8) = 7.01
        -128: 15, -129: 15, -10**6: 15,  # max_distance and beyond: capped at 15
        1: 17, 7: 23, 8: 24, 16: 26, 128: 31, 10**6: 31,  # keys after the query: + 16
    }
    for rel, want in bidir.items():
        assert int(t5_relative_position_bucket(torch.tensor(rel), True, 32, 128)) == want, rel
    # Causal, 32 buckets: exact range [0, 16); 16 + floor(16 * log(n/16) / log(8)) beyond.
    causal = {
        5: 0, 1: 0,  # future keys share bucket 0
        0: 0, -15: 15, -16: 16,
        -32: 21,  # 16/3 = 5.33
        -112: 30, -113: 31,  # 16*log2(7)/3 = 14.97; 16*log2(113/16)/3 = 15.01
        -128: 31, -5000: 31,
    }
    for rel, want in causal.items():
        assert int(t5_relative_position_bucket(torch.tensor(rel), False, 32, 128)) == want, rel


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 256), (16, 40), (8, 20), (33, 100)])
def test_t5_bucket_matches_exact_rederivation(num_buckets, max_distance, bidirectional):
    rel = torch.arange(-700, 701)
    got = t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance).tolist()
    want = [exact_bucket(r, bidirectional, num_buckets, max_distance) for r in rel.tolist()]
    assert got == want


def test_t5_bucket_matches_transformers():
    T5Attention = pytest.importorskip("transformers.models.t5.modeling_t5").T5Attention
    rel = torch.arange(-3000, 3001)
    for nb in range(4, 70, 3):
        for md in range(nb // 2 + 1, 400, 23):
            for bidirectional in (True, False):
                ours = t5_relative_position_bucket(rel, bidirectional, nb, md)
                theirs = T5Attention._relative_position_bucket(rel, bidirectional, nb, md)
                assert torch.equal(ours, theirs), (nb, md, bidirectional)


def test_t5_keeps_t5s_float32_rounding_at_exact_boundaries():
    # nb=48 causal, max_distance=81, n=54: log(54/24)/log(81/24)*24 = 2/3 * 24 = 16 exactly,
    # so exact math gives bucket 40; float32 (Mesh TF T5, transformers) gives 39. Checkpoints
    # were trained with 39: we keep T5's semantics.
    assert exact_bucket(-54, False, 48, 81) == 40
    assert int(t5_relative_position_bucket(torch.tensor(-54), False, 48, 81)) == 39


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_against_reference(bidirectional):
    enc, bias = _bias64("t5", num_buckets=16, max_distance=40, bidirectional=bidirectional)

    def ref(b, h, i, j):
        rel = int(K_POS[b, j]) - int(Q_POS[b, i])
        return enc.table[exact_bucket(rel, bidirectional, 16, 40), h]

    _check_against_reference(enc, bias, ref)


def test_t5_constant_beyond_max_distance():
    enc = build("t5", d_model=16, num_heads=4, max_distance=128)
    q = torch.full((1, 1), 5000)
    k = 5000 + torch.arange(-2000, 2001)[None]
    bias = enc.score_bias(q, k)[0, :, 0]  # (H, Tk)
    d = (k - q)[0]
    for side in (d <= -128, d >= 128):
        assert (bias[:, side] == bias[:, side][:, :1]).all()
    assert not (bias[:, d.abs() < 128] == bias[:, :1]).all()  # and not constant before


def test_t5_matches_transformers_compute_bias():
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    cfg = pytest.importorskip("transformers").T5Config(
        d_model=16, d_kv=4, num_heads=4, relative_attention_num_buckets=32, relative_attention_max_distance=128
    )
    for bidirectional in (True, False):
        cfg.is_decoder = not bidirectional
        theirs = t5.T5Attention(cfg, has_relative_attention_bias=True)
        ours = build("t5", d_model=16, num_heads=4, bidirectional=bidirectional)
        with torch.no_grad():
            ours.table.copy_(theirs.relative_attention_bias.weight)
        want = theirs.compute_bias(7, 300)  # queries 0..6, keys 0..299
        got = ours.score_bias(torch.arange(7)[None], torch.arange(300)[None])
        torch.testing.assert_close(got, want, atol=0, rtol=0)


# ------------------------------------------------------------------------------- ALiBi ---


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


# ------------------------------------------------------------------------------ KERPLE ---


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_against_reference(variant):
    enc, bias = _bias64("kerple", variant=variant)

    def ref(b, h, i, j):
        d = abs(int(Q_POS[b, i]) - int(K_POS[b, j]))
        r1, r2 = enc.r1[h], enc.r2[h]
        if variant == "log":
            return -r1 * torch.log(1 + r2 * d)
        return -r1 * d**r2 if d > 0 else r1 * 0.0

    _check_against_reference(enc, bias, ref)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_parameters_clamped_to_kernel_range(variant):
    enc = build("kerple", d_model=8, num_heads=2, variant=variant).double()
    with torch.no_grad():
        enc.r1.copy_(torch.tensor([-1.0, 0.5]))
        enc.r2.copy_(torch.tensor([-3.0, 7.0]))
    r1, r2 = enc.kernel_parameters()
    hi = 2.0 if variant == "power" else 7.0
    assert r1.tolist() == [0.01, 0.5] and r2.tolist() == [0.01, hi]
    # The clamp's gradient passes straight through: a parameter past the floor is not frozen.
    (r1.sum() + r2.sum()).backward()
    assert enc.r1.grad.tolist() == [1.0, 1.0] and enc.r2.grad.tolist() == [1.0, 1.0]


# -------------------------------------------------------------------------------- FIRE ---


def test_fire_against_reference():
    enc, bias = _bias64("fire", mlp_width=5, init_L=6.0)

    def ref(b, h, i, j):
        qi, kj = int(Q_POS[b, i]), int(K_POS[b, j])
        c = enc.c.abs()
        L = (enc.L_multiplier * 6.0).abs()
        x = torch.log(1 + c * abs(qi - kj)) / (torch.log(1 + c * torch.maximum(torch.tensor(float(qi), dtype=torch.float64), L)) + 1e-6)
        out = enc.fc2.bias[h]
        for k in range(5):
            out = out + enc.fc2.weight[h, k] * torch.relu(enc.fc1.weight[k, 0] * x + enc.fc1.bias[k])
        return out

    _check_against_reference(enc, bias, ref)


def test_fire_piecewise_linear_mlp_matches_the_mlp_everywhere():
    # score_bias evaluates f_theta as slopes/intercepts per piece between the units' knots.
    # Compare with the MLP written out, on a grid holding every knot exactly, points beside
    # them, and far outside; units with w1 < 0, w1 = 0 (b1 > 0 and b1 < 0) included.
    torch.manual_seed(1)
    enc = build("fire", d_model=12, num_heads=3, mlp_width=7).double()
    with torch.no_grad():
        enc.fc1.weight[2, 0] = 0.0
        enc.fc1.bias[2] = 0.4
        enc.fc1.weight[3, 0] = 0.0
        enc.fc1.bias[3] = -0.2
        enc.fc1.weight[4, 0] = -abs(enc.fc1.weight[4, 0])
    w1, b1 = enc.fc1.weight[:, 0], enc.fc1.bias
    knots = torch.stack([-b1[k] / w1[k] for k in range(7) if w1[k] != 0])
    x = torch.cat([knots, knots - 1e-3, knots + 1e-3, torch.linspace(-5, 5, 101, dtype=torch.float64)])
    want = torch.stack(
        [
            torch.stack([enc.fc2.bias[h] + sum(enc.fc2.weight[h, k] * torch.relu(w1[k] * xi + b1[k]) for k in range(7))
                         for h in range(3)])
            for xi in x
        ]
    )  # (N, H)
    sorted_knots, slopes, intercepts = enc.mlp_pieces(torch.float64)
    piece = torch.searchsorted(sorted_knots, x)
    got = slopes[piece] * x[:, None] + intercepts[piece]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_fire_contiguous_positions_past_the_threshold_against_reference():
    # The model's default positions (one shared row), queries on both sides of L = 6.
    enc = build("fire", d_model=12, num_heads=3, mlp_width=5, init_L=6.0).double()
    pos = torch.arange(13)[None]
    bias = enc.score_bias(pos, pos)[0]  # (H, T, T)
    c, L = enc.c.abs(), (enc.L_multiplier * 6.0).abs()
    for i in range(13):
        for j in range(13):
            x = torch.log1p(c * abs(i - j)) / (torch.log1p(c * torch.clamp(L, min=float(i))) + 1e-6)
            want = enc.mlp(x)  # (H,): the MLP itself, on this one input
            torch.testing.assert_close(bias[:, i, j], want, atol=1e-12, rtol=1e-12)


def _layouts(pos: torch.Tensor) -> dict[str, torch.Tensor]:
    """``pos`` (B, T) in three non-contiguous layouts with the same values."""
    return {
        "transposed": pos.t().contiguous().t(),
        "strided": torch.stack([pos, pos], -1)[..., 0],
        "expanded": pos[:1].expand_as(pos) if bool((pos == pos[:1]).all()) else pos.t().contiguous().t(),
    }


@pytest.mark.parametrize("side", ["query", "key", "both"])
@pytest.mark.parametrize("layout", ["transposed", "strided", "expanded"])
def test_fire_pairs_take_positions_in_any_layout(layout, side):
    """FIRE's per-pair bias (forward and every parameter's gradient) with query and/or key
    positions given as a non-contiguous tensor equals the result for contiguous ones (its
    forward and backward called ``.view`` on the normalised distances, which follow the
    positions' strides)."""
    torch.manual_seed(0)
    enc = build("fire", d_model=12, num_heads=3, init_L=3.0).double()
    q_pos = torch.tensor([[0, 3, 4, 5, 6, 11], [2, 5, 5, 9, 20, 21]])
    k_pos = torch.tensor([[0, 1, 5, 6, 7, 8], [0, 2, 3, 4, 5, 6]])
    if layout == "expanded":  # equal rows, so that the batch can be a stride-0 expand
        q_pos, k_pos = q_pos[:1].repeat(2, 1), k_pos[:1].repeat(2, 1)
    q_odd = _layouts(q_pos)[layout] if side in ("query", "both") else q_pos
    k_odd = _layouts(k_pos)[layout] if side in ("key", "both") else k_pos
    assert not (q_odd.is_contiguous() and k_odd.is_contiguous())
    params = list(enc.parameters())
    want = enc.logit_bias().all_pairs(q_pos, k_pos)
    got = enc.logit_bias().all_pairs(q_odd, k_odd)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    w = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad((got * w).sum(), params), torch.autograd.grad((want * w).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=0)


def test_fire_non_finite_threshold_is_named():
    enc = build("fire", d_model=8, num_heads=2)
    pos = torch.arange(5)[None]
    for value in (float("nan"), float("inf"), float("-inf")):
        with torch.no_grad():
            enc.L_multiplier.fill_(value)
        with pytest.raises(ValueError, match=r"^FIRE's threshold L = \|L_multiplier \* init_L\| must be finite"):
            enc.logit_bias().dense(pos, pos)


def test_fire_pairs_function_equals_its_definition():
    # FireBias.all_pairs (one x per pair, a per-piece scatter in backward, x recomputed) against
    # BiasTerm.all_pairs on the same fn (gather per head, autograd): values and every
    # parameter's gradient, with queries before and at L (a tie of max(L, i)), keys after
    # their query, per-row positions and a unit with w1 = 0.
    from posenc.terms import BiasTerm

    torch.manual_seed(3)
    enc = build("fire", d_model=12, num_heads=3, mlp_width=6, init_L=5.0).double()
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if n != "L_multiplier":
                p.normal_()
        enc.fc1.weight[1, 0] = 0.0
    q_pos = torch.tensor([[0, 3, 4, 5, 6, 11], [2, 5, 5, 9, 20, 21]])
    k_pos = torch.tensor([[0, 1, 5, 6, 7, 8, 30], [0, 2, 3, 4, 5, 6, 22]])
    fast = enc.logit_bias().all_pairs(q_pos, k_pos)
    slow = BiasTerm.all_pairs(enc.logit_bias(), q_pos, k_pos)
    torch.testing.assert_close(fast, slow, atol=1e-13, rtol=0)
    w = torch.randn_like(slow)
    params = list(enc.parameters())
    for (n, _), a, b in zip(enc.named_parameters(), torch.autograd.grad((fast * w).sum(), params),
                            torch.autograd.grad((slow * w).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0, msg=n)


@pytest.mark.parametrize("name", LEARNED_BIAS)
@pytest.mark.parametrize("rows", ["shared", "per_row"])
def test_dense_bias_keeps_nothing_per_pair_for_backward(name, rows):
    # The bias is built once per forward and kept until the backward: what autograd saves to
    # differentiate it must not grow with Tq x Tk. FIRE recomputes its per-pair x and pieces in
    # backward; per-row positions (no Toeplitz form) are recomputed under a checkpoint.
    enc = build(name, d_model=16, num_heads=4, **({"init_L": 8.0} if name == "fire" else {}))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    T = 300
    pos = torch.arange(T)[None] if rows == "shared" else torch.stack([torch.arange(T), torch.arange(T) + 5])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        bias = enc.logit_bias().dense(pos, pos)
    assert bias.shape == (pos.shape[0], 4, T, T) and bias.requires_grad
    # Per position or per distance at most (an MLP's width times the distances), never per pair:
    # no saved tensor near B·T·T numbers, and all of them together less than one such tensor.
    per_pair = pos.shape[0] * T * T
    assert saved and max(saved) < per_pair / 16 and sum(saved) < per_pair / 4, saved


def test_fire_progressive_interpolation():
    # Past the threshold, psi(i - j) / psi(i) maps each query's visible keys onto [0, 1]: the
    # first key gets 1 and the query itself 0, at any query position.
    from posenc.relative.fire import fire_normalized_distance

    c, L = torch.tensor(0.1, dtype=torch.float64), torch.tensor(4.0, dtype=torch.float64)
    for i in (10, 1000, 100_000):
        x = fire_normalized_distance(torch.tensor([[i]]), torch.tensor([[0, i]]), c, L, eps=0.0)[0, 0]
        torch.testing.assert_close(x, torch.tensor([1.0, 0.0], dtype=torch.float64))


# -------------------------------------------------------------------- shared behaviour ---

def test_bias_encodings_are_relative_and_only_bias():
    assert {"t5", "alibi", "kerple", "fire"} <= set(BIAS)
    for name in BIAS:
        enc = build(name, d_model=16, num_heads=4)
        assert posenc.get_info(name).family == "relative", name
        assert not (enc.has_terms or enc.has_rotate or enc.has_embed), name


@pytest.mark.parametrize("name", BIAS)
def test_batch_one_bias_only_when_rows_are_provably_equal(name):
    torch.manual_seed(0)
    enc = build(name, d_model=16, num_heads=4)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    shared = SequenceInfo.from_offset(3, 7, offset=4).positions  # expanded, stride 0
    bias = enc.score_bias(shared, shared)
    assert bias.shape == (1, 4, 7, 7) and bias.dtype == torch.float32
    rows = shared.clone()  # equal rows, but not provably so: computed per row
    full = enc.score_bias(rows, rows)
    assert full.shape == (3, 4, 7, 7)
    # A bias made by a matrix product (dynamic_bias's MLP of the distance) may round its last bit
    # differently for 3 rows than for 1 (BLAS picks its blocking by size); the others are exact.
    matmul = any(isinstance(m, torch.nn.Linear) for m in enc.modules())
    tol = dict(atol=1e-6, rtol=1e-6) if matmul else dict(atol=0, rtol=0)
    torch.testing.assert_close(full, bias.expand_as(full), **tol)


def test_shared_t5_bias_computed_once_per_forward(monkeypatch):
    model = Transformer(ModelConfig(vocab_size=32, d_model=16, n_layer=3, n_head=4, encoding="t5"))
    assert len(model.encodings) == 1
    assert all(model.encoding_of(i) is model.encodings[0] for i in range(3))  # one table
    from posenc.terms import BiasTerm

    terms, dense = [], []
    original = model.encodings[0].logit_bias
    monkeypatch.setattr(model.encodings[0], "logit_bias", lambda: terms.append(1) or original())
    original_dense = BiasTerm.dense
    monkeypatch.setattr(BiasTerm, "dense", lambda self, q, k: dense.append(1) or original_dense(self, q, k))
    model(torch.randint(0, 32, (2, 9)))
    assert (len(terms), len(dense)) == (1, 1)
    model(torch.randint(0, 32, (2, 9)))
    assert (len(terms), len(dense)) == (2, 2)


def test_unshared_t5_has_a_table_per_layer():
    cfg = dict(vocab_size=32, d_model=16, n_layer=3, n_head=4, encoding="t5")
    shared = Transformer(ModelConfig(**cfg))
    separate = Transformer(ModelConfig(**cfg, share_encoding=False))
    assert len(separate.encodings) == 3
    assert separate.num_parameters(encodings_only=True) == 3 * shared.num_parameters(encodings_only=True) == 3 * 32 * 4


# --------------------------------------------------------------------------- bad input ---


@pytest.mark.parametrize(
    "config,match",
    [
        (dict(num_buckets=1), "num_buckets"),
        (dict(num_buckets=3), "num_buckets"),  # bidirectional: 1 bucket a side
        (dict(num_buckets=32, max_distance=8), "max_distance"),  # bidirectional exact range is 8
        (dict(num_buckets=32, max_distance=16, bidirectional=False), "max_distance"),  # causal: 16
        (dict(num_buckets=32.0), "num_buckets"),
        (dict(bidirectional=None), "bidirectional"),
        (dict(init_std=-1.0), "init_std"),
    ],
)
def test_t5_rejects_bad_config(config, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build("t5", d_model=16, num_heads=4, **config)


def test_t5_bucket_function_rejects_bad_arguments():
    rel = torch.arange(-3, 4)
    with pytest.raises(ValueError, match="num_buckets"):
        t5_relative_position_bucket(rel, False, 1, 128)
    with pytest.raises(ValueError, match="max_distance"):
        t5_relative_position_bucket(rel, False, 32, 16)
    assert t5_relative_position_bucket(rel, False, 32, 17).shape == rel.shape  # smallest valid


def test_alibi_rejects_bad_input():
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="num_heads"):
        alibi_slopes(4.0)
    with pytest.raises(TypeError, match="symmetric"):
        build("alibi", d_model=16, num_heads=4, symmetric="yes")


@pytest.mark.parametrize(
    "name,config,match",
    [
        ("kerple", dict(r1_init=-1.0), "r1_init"),
        ("kerple", dict(r2_init=float("nan")), "r2_init"),
        ("kerple", dict(variant="power", r2_init=2.5), "r2_init"),
        ("kerple", dict(eps=0.0), "eps"),
        ("kerple", dict(variant="cubic"), "variant"),
        ("fire", dict(init_c=-0.1), "init_c"),
        ("fire", dict(init_c=float("nan")), "init_c"),
        ("fire", dict(init_L=0.0), "init_L"),
        ("fire", dict(mlp_width=0), "mlp_width"),
        ("fire", dict(eps=-1e-6), "eps"),
    ],
)
def test_learned_biases_reject_bad_parameters(name, config, match):
    with pytest.raises(ValueError, match=match):
        build(name, d_model=16, num_heads=4, **config)


# ---- the Toeplitz path: the bias of Tq + Tk - 1 distances, expanded -----------------------------


@pytest.mark.parametrize("name", TOEPLITZ)
@pytest.mark.parametrize("tq,tk,s", [(5, 5, 0), (3, 8, 5), (6, 2, -1), (1, 9, 8)])
def test_toeplitz_path_equals_all_pairs(name, tq, tk, s):
    """Contiguous shared positions (q_pos - k_pos = s + i - j): the per-distance form equals
    the function evaluated on every pair, forward and backward (float64)."""
    torch.manual_seed(0)
    enc = build(name, d_model=16, num_heads=4).to(torch.float64)
    q_pos = (max(s, 0) + torch.arange(tq))[None]
    k_pos = (max(s, 0) - s + torch.arange(tk))[None]
    fast = enc.score_bias(q_pos, k_pos)
    assert fast.shape == (1, 4, tq, tk) and fast.is_contiguous()
    # Two real rows (not a stride-0 expand) take the all-pairs path.
    slow = enc.score_bias(q_pos.repeat(2, 1), k_pos.repeat(2, 1))[:1]
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=0)
    params = [p for p in enc.parameters()]
    if params:
        w = torch.randn(fast.shape, dtype=torch.float64)
        for a, b in zip(torch.autograd.grad((fast * w).sum(), params), torch.autograd.grad((slow * w).sum(), params)):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("padded", [False, True])
def test_bias_is_built_once_per_forward(monkeypatch, padded):
    """The dense bias (and SDPA's masked float form of it) is built once per forward, not per layer."""
    from posenc.backends import SharedBias
    from posenc.terms import BiasTerm

    model = tiny_model("alibi", n_layer=3)
    dense_calls, masked_calls = [], []
    orig_dense, orig_masked = BiasTerm.dense, SharedBias.masked

    def counting_dense(self, q_pos, k_pos):
        dense_calls.append(1)
        return orig_dense(self, q_pos, k_pos)

    def counting_masked(self, dtype):
        masked_calls.append(dtype in self._masked)
        return orig_masked(self, dtype)

    monkeypatch.setattr(BiasTerm, "dense", counting_dense)
    monkeypatch.setattr(SharedBias, "masked", counting_masked)
    tokens = torch.randint(0, 64, (2, 7))
    valid = torch.tensor([[True] * 7, [False, False] + [True] * 5])
    seq = SequenceInfo.from_padding_mask(valid) if padded else None
    with torch.no_grad():
        model(tokens, seq)
    assert len(dense_calls) == 1
    # Plain causal attention takes the CPU flash kernel with the bias as it is; a padding mask
    # folds -inf into one masked copy, built by the first layer and reused by the others.
    assert masked_calls == ([False, True, True] if padded else [])


@pytest.mark.parametrize("name", BIAS)
def test_sdpa_row_blocked_bias_equals_eager_past_one_block(name):
    # T = 300 > 256 rows: the SDPA path attends in row blocks (causal_sdpa_with_bias).
    tokens = torch.randint(0, 64, (1, 300))
    with torch.no_grad():
        eager = tiny_model(name, impl="eager", dtype=torch.float64)(tokens)
        sdpa = tiny_model(name, impl="sdpa", dtype=torch.float64)(tokens)
    torch.testing.assert_close(sdpa, eager)
