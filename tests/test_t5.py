"""t5: the bucketed learned bias against a bucket function re-derived with exact arithmetic, a
slow loop over (b, h, i, j), hand-worked buckets and transformers' T5Attention; one table per
forward when shared, bad configs named."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from posenc import ModelConfig, Transformer, build
from posenc.relative.t5 import t5_relative_position_bucket

from bias_reference import K_POS, Q_POS, bias64, check_against_reference


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
    enc, bias = bias64("t5", num_buckets=16, max_distance=40, bidirectional=bidirectional)

    def ref(b, h, i, j):
        rel = int(K_POS[b, j]) - int(Q_POS[b, i])
        return enc.table[exact_bucket(rel, bidirectional, 16, 40), h]

    check_against_reference(enc, bias, ref)


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


def test_shared_t5_bias_computed_once_per_forward(monkeypatch):
    model = Transformer(ModelConfig(vocab_size=32, d_model=16, n_layer=3, n_head=4, encoding="t5"))
    assert len(model.encodings) == 1
    assert all(model.encoding_of(i) is model.encodings[0] for i in range(3))  # one table
    from posenc.terms import BiasTerm

    terms, dense = [], []
    original = model.encodings[0].logit_bias
    monkeypatch.setattr(model.encodings[0], "logit_bias", lambda: terms.append(1) or original())
    # The bias is evaluated once per forward: densely, or (a learned Toeplitz bias on the CPU
    # flash leaf under autograd) as its Tq + Tk - 1 distinct values.
    original_dense, original_values = BiasTerm.dense, BiasTerm.toeplitz_values
    monkeypatch.setattr(BiasTerm, "dense", lambda self, q, k: dense.append(1) or original_dense(self, q, k))
    monkeypatch.setattr(BiasTerm, "toeplitz_values",
                        lambda self, q, k: dense.append(1) or original_values(self, q, k))
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
