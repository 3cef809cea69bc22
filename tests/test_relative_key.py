"""relative_key / relative_key_query: the relative logit term against transformers 4's BERT formula
written out here (``einsum`` over a table read at the clipped distance), forward and backward,
on positions with offsets, gaps and distances past the clip; the table's layout is HF's
(``clip = P - 1``: row d + P - 1); bad clips named."""

from __future__ import annotations

import math

import pytest
import torch

import posenc

H, D = 2, 4
F64 = torch.float64


def _encoding(name: str, clip: int):
    torch.manual_seed(0)
    enc = posenc.build(name, d_model=H * D, num_heads=H, clip=clip).to(F64)
    with torch.no_grad():
        enc.weight.add_(0.3 * torch.randn_like(enc.weight))
    return enc


def _bert_term(enc, q, k, q_pos, k_pos, key_term: bool):
    """BERT's relative_key(_query) term: q·a[d] (+ k·a[d]) / sqrt(D), d = clamp(q_pos - k_pos, -k, k)."""
    kk = enc.config.clip
    distance = (q_pos[:, :, None] - k_pos[:, None, :]).clamp(-kk, kk)  # (B, Tq, Tk)
    a = enc.weight[distance + kk]  # (B, Tq, Tk, D)
    term = torch.einsum("bhld,blrd->bhlr", q, a)
    if key_term:
        term = term + torch.einsum("bhrd,blrd->bhlr", k, a)
    return term / math.sqrt(D)


POSITIONS = {
    "contiguous": (torch.arange(6).expand(2, 6), torch.arange(6).expand(2, 6)),
    "offsets_and_gaps": (torch.tensor([[7, 8, 9], [0, 4, 30]]), torch.tensor([[0, 1, 2, 3, 9], [0, 2, 3, 29, 30]])),
    "past_the_clip": ((50 + torch.arange(3)).expand(2, 3), torch.arange(5).expand(2, 5)),
}


@pytest.mark.parametrize("positions", list(POSITIONS))
@pytest.mark.parametrize("name", ["relative_key", "relative_key_query"])
def test_term_matches_bert_formula_forward_and_backward(name, positions):
    enc = _encoding(name, clip=3)
    q_pos, k_pos = POSITIONS[positions]
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, H, q_pos.shape[1], D, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(2, H, k_pos.shape[1], D, generator=g, dtype=F64, requires_grad=True)
    fast = enc.score(q, k, q_pos, k_pos)
    slow = _bert_term(enc, q, k, q_pos, k_pos, key_term=name == "relative_key_query")
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=1e-12)
    w = torch.randn(fast.shape, generator=g, dtype=F64)
    params = [q, enc.weight] + ([k] if name == "relative_key_query" else [])  # relative_key's term has no k
    for a, b in zip(torch.autograd.grad((fast * w).sum(), params), torch.autograd.grad((slow * w).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_only_relative_key_query_reads_the_keys():
    q_pos = k_pos = torch.arange(5)[None]
    q = torch.randn(1, H, 5, D, dtype=F64)
    k = torch.randn(1, H, 5, D, dtype=F64)
    for name, reads_keys in (("relative_key", False), ("relative_key_query", True)):
        enc = _encoding(name, clip=2)
        changed = not torch.equal(enc.score(q, k, q_pos, k_pos), enc.score(q, 2 * k, q_pos, k_pos))
        assert changed == reads_keys, name


def test_the_table_is_hf_bert_layout():
    """HF's distance_embedding has 2P - 1 rows read at d + P - 1; with clip = P - 1 a BERT table
    loads as ``weight`` unchanged: distance d reads row d + clip."""
    P = 6
    enc = _encoding("relative_key", clip=P - 1)
    assert enc.weight.shape == (2 * P - 1, D)
    q = torch.randn(1, H, 1, D, dtype=F64)
    for d in range(-(P - 1), P):
        q_pos, k_pos = torch.tensor([[max(d, 0)]]), torch.tensor([[max(-d, 0)]])
        got = enc.score(q, q, q_pos, k_pos)[0, :, 0, 0]
        torch.testing.assert_close(got, q[0, :, 0] @ enc.weight[d + P - 1] / math.sqrt(D))


@pytest.mark.parametrize("name", ["relative_key", "relative_key_query"])
def test_bad_clip_is_named(name):
    with pytest.raises(ValueError, match="clip must be"):
        posenc.build(name, d_model=H * D, num_heads=H, clip=0)
    with pytest.raises(TypeError, match="clip must be an int"):
        posenc.build(name, d_model=H * D, num_heads=H, clip=2.0)
