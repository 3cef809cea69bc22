"""Recurrent (GRU) encoding: explicit GRU equations as the reference, restarts, padding, state."""

from __future__ import annotations

import pytest
import torch

from posenc import SequenceInfo, build
from helpers import assert_embed_decodes_incrementally


def _reference_gru(enc, x_doc, h=None):
    """The GRU equations spelled out, one token at a time, float64 -> states (T, Hd)."""
    g = enc.gru
    Wi, Wh = g.weight_ih_l0.double(), g.weight_hh_l0.double()
    bi, bh = g.bias_ih_l0.double(), g.bias_hh_l0.double()
    Hd = Wh.shape[1]
    h = torch.zeros(Hd, dtype=torch.float64) if h is None else h
    out = []
    for x in x_doc.double():
        gi, gh = Wi @ x + bi, Wh @ h + bh
        r = torch.sigmoid(gi[:Hd] + gh[:Hd])
        z = torch.sigmoid(gi[Hd : 2 * Hd] + gh[Hd : 2 * Hd])
        n = torch.tanh(gi[2 * Hd :] + r * gh[2 * Hd :])
        h = (1 - z) * n + z * h
        out.append(h)
    return torch.stack(out)


def _enc(**cfg):
    torch.manual_seed(0)
    return build("recurrent", d_model=8, num_heads=2, hidden=5, **cfg).double()


def _expected(enc, x_doc):
    return x_doc + _reference_gru(enc, x_doc) @ enc.proj.weight.T


def test_plain_batch_matches_reference():
    enc = _enc()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    out = enc.embed(x, SequenceInfo.from_offset(2, 7))  # the fused CPU kernel where built, else nn.GRU
    for b in range(2):
        torch.testing.assert_close(out[b], _expected(enc, x[b]))


def test_packed_row_restarts_at_each_document():
    enc = _enc()
    x = torch.randn(1, 12, 8, dtype=torch.float64)
    out = enc.embed(x, SequenceInfo.from_cu_seqlens([0, 4, 9, 12]))  # the fused CPU kernel where built, else gru_scan
    for a, b in ((0, 4), (4, 9), (9, 12)):
        torch.testing.assert_close(out[0, a:b], _expected(enc, x[0, a:b]))


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_leaves_the_state_unchanged(side):
    enc = _enc()
    x = torch.randn(1, 9, 8, dtype=torch.float64)
    mask = torch.ones(1, 9, dtype=torch.bool)
    mask[0, :3] = side == "right"
    mask[0, 3:6] = True
    mask[0, 6:] = side == "left"
    out = enc.embed(x, SequenceInfo.from_padding_mask(mask))
    real = x[0][mask[0]]
    torch.testing.assert_close(out[0][mask[0]], _expected(enc, real))
    # Padding in the middle of a packed row (a pad run between two tokens) is skipped too.
    seq = SequenceInfo(torch.tensor([[0, 1, 0, 2, 3]]), valid=torch.tensor([[True, True, False, True, True]]))
    x5 = torch.randn(1, 5, 8, dtype=torch.float64)
    out5 = enc.embed(x5, seq)
    torch.testing.assert_close(out5[0, [0, 1, 3, 4]], _expected(enc, x5[0, [0, 1, 3, 4]]))


def test_state_carries_the_recurrence_across_calls():
    enc = _enc()
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    assert_embed_decodes_incrementally(enc, x, prefix=4)


def test_agrees_with_torch_gru_on_each_document():
    enc = _enc()
    x = torch.randn(1, 11, 8, dtype=torch.float64)
    out = enc.embed(x, SequenceInfo.from_cu_seqlens([0, 6, 11]))
    for a, b in ((0, 6), (6, 11)):
        h, _ = enc.gru(x[:, a:b])
        torch.testing.assert_close(out[:, a:b], x[:, a:b] + enc.proj(h))


def test_low_precision_runs_the_recurrence_in_float32():
    enc = _enc().to(torch.bfloat16)
    x = torch.randn(1, 6, 8).to(torch.bfloat16)
    out = enc.embed(x, SequenceInfo.from_offset(1, 6))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_bad_config():
    with pytest.raises(ValueError, match="hidden"):
        build("recurrent", d_model=8, num_heads=2, hidden=0)
    with pytest.raises(TypeError, match="hidden"):
        build("recurrent", d_model=8, num_heads=2, hidden=2.5)
