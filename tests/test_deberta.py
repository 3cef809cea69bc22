"""deberta: log buckets against transformers' make_log_bucket_position and hand-worked values,
the disentangled attention against transformers' DebertaV2 on the same weights, its scale, the
table bounds, no-grad paths equal autograd, c2p by query equal to projected rows."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import build
from posenc.encoding import QKProjection
from posenc.relative import log_bucket_position

from content_reference import F64
from helpers import tiny_model


@pytest.mark.parametrize("buckets,max_rel", [(4, 8), (256, 512), (6, 12), (0, 3)])
def test_deberta_bounds_are_where_the_table_saturates(buckets, max_rel):
    enc = build("deberta", d_model=8, num_heads=2, position_buckets=buckets, max_relative_positions=max_rel)
    lo, hi = enc.bounds
    span = enc.config.span
    d = torch.arange(lo - 3000, hi + 3001)
    c = enc._canon(d)
    assert (c[d >= hi] == span - 1).all() and (c[d <= lo] == -span).all()
    assert int(enc._canon(torch.tensor([hi - 1]))) != span - 1 and int(enc._canon(torch.tensor([lo + 1]))) != -span


def test_log_bucket_position_golden_and_reference():
    # bucket_size 256, max_position 512 (DeBERTa-v3): mid = 128, |d| <= 128 kept;
    # d = 300: 128 + ceil(log(300/128) / log(511/128) * 127) = 128 + ceil(78.14) = 207;
    # d = -1000: -(128 + ceil(log(7.8125) / log(3.992) * 127)) = -(128 + ceil(188.6)) = -317.
    d = torch.tensor([0, 5, -5, 128, -128, 129, 300, -1000])
    assert log_bucket_position(d, 256, 512).tolist() == [0, 5, -5, 128, -128, 129, 207, -317]
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    d = torch.arange(-3000, 3001)
    for bs, mp in [(256, 512), (4, 8), (6, 12), (32, 33), (2, 3)]:
        assert log_bucket_position(d, bs, mp).equal(make_log_bucket_position(d, bs, mp).long())


@pytest.mark.parametrize("share", [False, True])
def test_deberta_matches_hf_disentangled_attention(share):
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    C, H, T = 16, 2, 9
    cfg = DebertaV2Config(
        hidden_size=C, num_attention_heads=H, relative_attention=True, pos_att_type=["c2p", "p2c"],
        position_buckets=4, max_relative_positions=8, share_att_key=share,
    )
    torch.manual_seed(0)
    hf = DisentangledSelfAttention(cfg).to(F64).eval()
    enc = build("deberta", d_model=C, num_heads=H, position_buckets=4, max_relative_positions=8,
                share_att_key=share, layer_norm=False).to(F64)
    rel = torch.randn(8, C, dtype=F64)  # 2 * span rows, span = 4 buckets
    with torch.no_grad():
        enc.rel_embeddings.copy_(rel)
        if not share:
            enc.pos_key_proj.load_state_dict(hf.pos_key_proj.state_dict())
            enc.pos_query_proj.load_state_dict(hf.pos_query_proj.state_dict())
    proj = QKProjection(hf.query_proj, hf.key_proj, H, H, C // H)
    x = torch.randn(2, T, C, dtype=F64)
    qh = hf.transpose_for_scores(hf.query_proj(x), H)  # (B*H, T, D)
    kh = hf.transpose_for_scores(hf.key_proj(x), H)
    want = hf.disentangled_attention_bias(qh, kh, None, rel, 3).view(2, H, T, T)
    pos = torch.arange(T).expand(2, T)
    got = enc.score(qh.view(2, H, T, -1), kh.view(2, H, T, -1), pos, pos, proj=proj)
    # HF divides by sqrt(D * 3) computed in float32, hence 1e-7 rather than 1e-10.
    torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-7)


def test_deberta_attention_scale():
    for c2p, p2c, n in [(True, True, 2), (True, False, 1), (False, True, 1)]:
        enc = build("deberta", d_model=32, num_heads=4, c2p=c2p, p2c=p2c)
        assert enc.attention_scale(8) == pytest.approx(1 / math.sqrt(8 * (1 + n)))


@pytest.mark.parametrize("share_att_key", [False, True])
def test_deberta_no_grad_matches_autograd_and_tracks_parameter_updates(share_att_key):
    """Under no_grad the projected table comes from the per-forward state; it must equal the
    autograd path and follow an in-place parameter update (an optimizer step)."""
    model = tiny_model("deberta", n_layer=2, encoding_config={"share_att_key": share_att_key})
    tokens = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        a = model(tokens)
        a2 = model(tokens)
    torch.testing.assert_close(a, a2, rtol=0, atol=0)
    torch.testing.assert_close(a, model(tokens).detach(), rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.1)  # in place, as an optimizer step
        b = model(tokens)
    torch.testing.assert_close(b, model(tokens).detach(), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(a, b)


def test_deberta_c2p_by_query_equals_projected_rows(monkeypatch):
    """c2p from (q W_k)·P_r + q·b_k equals q·K^r_r with P projected, forward and backward
    (gradients of q, P, W_k and b_k), for one decoding query over 29 rows (log buckets past 16)."""
    enc = build("deberta", d_model=128, num_heads=2, position_buckets=32, max_relative_positions=64, p2c=False)
    enc = enc.double()
    with torch.no_grad():
        enc.pos_key_proj.bias.normal_()  # nonzero: the q·b_k term is checked too
    q_pos, k_pos = torch.tensor([[45]]), torch.arange(46)[None]
    q = torch.randn(1, 2, 1, 64, dtype=torch.float64, requires_grad=True)
    w = torch.randn(1, 2, 1, 46, dtype=torch.float64)
    params = [q, enc.rel_embeddings, enc.pos_key_proj.weight, enc.pos_key_proj.bias]

    def run():
        state = enc.prepare(q_pos, k_pos)
        (term,) = enc.terms(q, q, state)
        out = term.dense(q_pos, k_pos)
        return out, state, torch.autograd.grad((out * w).sum(), params)

    by_query, state, g1 = run()
    assert state.keys is None and state.rows.shape[0] == 29, "one query over many rows: the by-query form"
    monkeypatch.setattr(type(enc), "_c2p_by_query", lambda self, tq, rows: False)
    projected, state, g2 = run()
    assert state.keys is not None
    torch.testing.assert_close(by_query, projected, rtol=1e-12, atol=1e-12)
    for a, b in zip(g1, g2):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
