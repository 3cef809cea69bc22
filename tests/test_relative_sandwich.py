"""sandwich: the bias against a slow loop over the paper's formula (Chi et al. 2023: the inner
product of sinusoidal embeddings minus its value at distance 0, over the per-head compression
8h/H), against NeMo's construction transcribed (its relative-position layout and frequency
range, commit 000b931e), a closed form for d' = 2, and its properties: Toeplitz, symmetric,
0 on the diagonal, bounded, decaying with log-distance up to 1 / w_min and level beyond."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import Attention, SequenceInfo
from posenc.relative.sandwich import sandwich_bias, sandwich_compression, sandwich_frequencies

from bias_reference import H, K_POS, Q_POS

F64 = torch.float64


def _slow(m: int, n: int, h: int, num_heads: int, dim: int) -> float:
    """b_h(m, n) = (sum_{i=1}^{d'/2} cos(|m - n| / 10000^(2i/d')) - d'/2) / (8 (h + 1) / H)."""
    s = sum(math.cos(abs(m - n) / 10000 ** (2 * i / dim)) for i in range(1, dim // 2 + 1))
    return (s - dim / 2) / (8 * (h + 1) / num_heads)


def test_bias_equals_slow_loop_over_the_formula():
    """Positions with an offset row, gaps, Tq != Tk and keys after the queries, d' = head_dim = 4."""
    enc = posenc.build("sandwich", d_model=H * 4, num_heads=H).double()
    assert enc.dim == 4 and not list(enc.parameters())
    bias = enc.score_bias(Q_POS, K_POS)  # (1|B, H, Tq, Tk)
    B, Tq, Tk = Q_POS.shape[0], Q_POS.shape[1], K_POS.shape[1]
    want = torch.tensor([[[[_slow(int(Q_POS[b, i]), int(K_POS[b, j]), h, H, 4) for j in range(Tk)]
                           for i in range(Tq)] for h in range(H)] for b in range(B)], dtype=F64)
    assert bias.dtype == F64
    torch.testing.assert_close(bias.expand_as(want), want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("num_heads,dim", [(4, 16), (3, 6), (8, 64)])
def test_the_module_at_other_widths_equals_the_slow_loop(num_heads, dim):
    enc = posenc.build("sandwich", d_model=num_heads * 8, num_heads=num_heads, dim=dim)
    q, k = torch.tensor([[0, 7, 300, 70_000]]), torch.tensor([[0, 5, 299, 1_000_000]])
    got = enc.score_bias(q, k)[0]  # (H, 4, 4) float32
    assert got.dtype == torch.float32
    want = torch.tensor([[[_slow(int(m), int(n), h, num_heads, dim) for n in k[0]] for m in q[0]]
                         for h in range(num_heads)], dtype=F64)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-6)


def _nemo_transcribed(q_len: int, k_len: int, num_heads: int, hidden: int, bidirectional: bool) -> torch.Tensor:
    """NeMo's SandwichRelativePositionEmbedding.forward, transcribed (float64, CPU): relative
    positions |memory - context| of a square L x L table sliced [-q_len:, -k_len:], lower
    triangle only when causal; frequencies 1 / 10000^(2 i / hidden) for i = 1..hidden/2; the
    sum of cosines minus hidden/2 over (h * 8 / H), h = 1..H. (1, H, q_len, k_len)."""
    L = max(q_len, k_len)
    ctx = torch.arange(1 - L, 1)[None, :].mul(-1)
    mem = torch.arange(1 - L, 1)[:, None].mul(-1)
    rel = torch.abs(mem - ctx)[-q_len:, -k_len:]
    if not bidirectional:
        rel = torch.tril(rel)
    inv_freq = 1.0 / (10000 ** (2 * torch.arange(1, hidden / 2 + 1, dtype=F64) / hidden))
    cos_sum = (rel[:, :, None].repeat(1, 1, len(inv_freq)) * inv_freq).cos().sum(dim=2)
    scales = torch.arange(1, num_heads + 1, 1, dtype=F64)[:, None, None]
    return ((cos_sum.repeat(num_heads, 1, 1) - hidden / 2) / (scales * 8 / num_heads))[None]


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
def test_equals_nemos_construction(bidirectional):
    """NeMo's table, built its own way, on the keys a causal mask lets through (NeMo zeroes
    the rest when causal) or on all of them."""
    Hn, hidden, T = 6, 32, 40
    enc = posenc.build("sandwich", d_model=Hn * hidden, num_heads=Hn).double()
    pos = torch.arange(T)[None]
    got = enc.score_bias(pos, pos)
    want = _nemo_transcribed(T, T, Hn, hidden, bidirectional)
    seen = torch.ones(T, T, dtype=torch.bool) if bidirectional else torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., seen], want[..., seen], atol=1e-12, rtol=1e-12)


def test_closed_form_for_two_dimensions():
    """d' = 2: one frequency 1/10000, so b_h(d) = (cos(d / 10000) - 1) / (8 h / H)."""
    enc = posenc.build("sandwich", d_model=8, num_heads=2, dim=2).double()
    d = torch.tensor([[0, 1, 5000, 31416, 62832, 10**7]])
    got = enc.score_bias(d, torch.zeros(1, 1, dtype=torch.long))[0, :, :, 0]  # (H, 6)
    base = torch.cos(d[0].double() / 10000) - 1
    torch.testing.assert_close(got, torch.stack([base / 4, base / 8]), atol=1e-14, rtol=0)
    assert float(got[0, 3]) == pytest.approx(-0.5, abs=1e-9)  # cos(pi) - 1 = -2, / 4


def test_constants_are_neMos():
    assert sandwich_frequencies(8) == [10000 ** (-2 * i / 8) for i in (1, 2, 3, 4)]  # i from 1, not 0
    assert sandwich_frequencies(8)[0] == pytest.approx(0.1) and sandwich_frequencies(8)[-1] == pytest.approx(1e-4)
    assert sandwich_compression(4) == [2.0, 4.0, 6.0, 8.0]
    assert sandwich_compression(8) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]  # ALiBi's 8/H steps


def test_toeplitz_symmetric_zero_diagonal_and_bounded():
    Hn, dim = 4, 16
    enc = posenc.build("sandwich", d_model=32, num_heads=Hn, dim=dim)
    pos = torch.arange(60)[None]
    bias = enc.score_bias(pos, pos)[0]  # (H, T, T)
    for k in range(-59, 60):  # constant along every diagonal
        diag = torch.diagonal(bias, offset=k, dim1=-2, dim2=-1)
        assert (diag == diag[:, :1]).all()
    assert torch.equal(bias, bias.transpose(-2, -1))  # |m - n|: symmetric
    assert (bias.diagonal(dim1=-2, dim2=-1) == 0).all()
    assert torch.equal(enc.score_bias(pos + 12345, pos + 12345)[0], bias)  # not the absolute position
    far = torch.tensor([[0, 10**3, 10**6, 10**9, 2**52]])
    vals = enc.score_bias(far, torch.zeros(1, 1, dtype=torch.long))[0, :, :, 0]  # (H, 5)
    floor = -dim / torch.tensor(sandwich_compression(Hn))[:, None]  # sum of cosines - d'/2 >= -d'
    assert torch.isfinite(vals).all() and (vals <= 0).all() and (vals >= floor).all()


def test_decays_with_log_distance_then_levels_off():
    """The mean bias per octave [2^k, 2^(k+1)) falls at every octave up to 2^13 (1 / w_min =
    10^4), then stays near -d'/2 / ratio: the paper's logarithmic decay, bounded."""
    dim = 64
    d = torch.arange(0, 2**16)[None]
    b = sandwich_bias(d, torch.zeros(1, 1, dtype=torch.long), 1, dim)[0, 0, :, 0]  # H = 1: ratio 8
    means = [float(b[2**k : 2 ** (k + 1)].mean()) for k in range(16)]
    assert all(a > c for a, c in zip(means[:14], means[1:14]))
    assert all(abs(m - (-dim / 2 / 8)) < 0.3 for m in means[13:])


def test_float64_model_gets_a_float64_bias_and_bfloat16_keeps_float32():
    pos = torch.arange(9)[None]
    want = sandwich_bias(pos, pos, 6, 8)
    assert torch.equal(posenc.build("sandwich", d_model=48, num_heads=6).double().score_bias(pos, pos), want)
    low = posenc.build("sandwich", d_model=48, num_heads=6).to(torch.bfloat16)
    assert low.compression_table.dtype == torch.float32
    torch.testing.assert_close(low.score_bias(pos, pos), want.float())


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_attention_adds_the_bias(impl):
    """Attention with sandwich equals plain attention over q·k/sqrt(D) + the slow loop's bias."""
    torch.manual_seed(0)
    Hn, D, T = 2, 8, 7
    attn = Attention(Hn * D, Hn, pe=posenc.build("sandwich", d_model=Hn * D, num_heads=Hn), impl=impl).double()
    x = torch.randn(1, T, Hn * D, dtype=F64)
    with torch.no_grad():
        got = attn(x, SequenceInfo.from_offset(1, T, 3))
        q, k, v = (p(x).view(1, T, Hn, D).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        bias = torch.tensor([[[_slow(i, j, h, Hn, D) for j in range(T)] for i in range(T)] for h in range(Hn)], dtype=F64)
        logits = q @ k.transpose(-2, -1) / math.sqrt(D) + bias
        logits = logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
        want = attn.o_proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(1, T, Hn * D))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(dim=3), ValueError, r"^dim must be even \(d'/2 sinusoid pairs\), got 3$"),
    (dict(dim=0), ValueError, r"^dim must be in \[2, 4096\], got 0$"),
    (dict(dim=4098), ValueError, r"^dim must be in \[2, 4096\], got 4098$"),
    (dict(dim=8.0), TypeError, "dim"),
    (dict(d_model=6, num_heads=2), ValueError, r"dim must be even: sandwich takes d' from head_dim, which is odd \(3\)"),
])
def test_refuses_bad_config_by_name(kwargs, error, match):
    kwargs = dict(d_model=16, num_heads=2) | kwargs
    with pytest.raises(error, match=match):
        posenc.build("sandwich", **kwargs)


def test_the_boundedness_check_sees_the_bound_past_the_lowest_frequency():
    """``posenc check``'s default window (2048) lies in the logarithmic part (1 / w_min = 10^4
    for d' = 16), where the octave maxima still rise; a window to 2^17 sees them level off."""
    from posenc.analysis.checks import check_bounded
    from posenc.analysis.probes import Probe

    enc = posenc.build("sandwich", d_model=64, num_heads=4)
    assert check_bounded(enc, Probe()).status == "no"
    assert check_bounded(enc, Probe(far_len=2**17, max_probe_position=2**17)).status == "yes"


def test_decoding_reads_the_bias_from_a_table_kept_per_cache():
    """A cached decoding step reads the bias from a per-cache (H, 2n + 1) table of every
    distance (made once, n doubled when a step reaches past it) holding the very numbers the
    full forward's bias has, and the decoded logits equal the full forward's."""
    torch.manual_seed(1)
    model = posenc.Transformer(posenc.ModelConfig(encoding="sandwich", d_model=32, n_head=4, n_layer=2,
                                                  vocab_size=50)).to(F64)
    tokens = torch.randint(0, 50, (2, 150))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :40], cache=cache)]
        for t in range(40, 150):
            steps.append(model(tokens[:, t : t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=1e-12)
    n, table = cache.prepare_memo[0]["sandwich_table"]
    assert n == 256  # 64 at the prompt, doubled at reaches 65 and 129
    d = torch.arange(-n, n + 1)
    want = model.encodings[0].logit_bias().all_pairs(d[None], torch.zeros(1, 1, dtype=torch.long))[0, :, :, 0]
    assert table.dtype == want.dtype and torch.equal(table, want)  # bit for bit
