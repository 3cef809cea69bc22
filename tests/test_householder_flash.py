"""posenc.backends.householder_flash: PaTH's causal attention chunk by chunk, against the paper's
formula spelled out as loops over explicit D x D products, and against the eager composition of
the dense term, forward and backward; what it keeps for the backward; its refusals."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_impls_train_alike, assert_same_grads, tiny_model

from posenc.backends import Leaf, LayerTerms, householder_flash
from posenc.backends.householder_flash import householder_attention
from posenc.terms import HouseholderTerm

F64 = torch.float64


def _inputs(B, H, T, D, Dv=None, dtype=F64, seed=0):
    """q, k, v, and the raw w0, b0 that make unit w and β in (0, 2)."""
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=dtype).requires_grad_()  # noqa: E731
    return mk(B, H, T, D), mk(B, H, T, D), mk(B, H, T, Dv or D), mk(B, H, T, D), mk(B, H, T)


def _w_beta(w0, b0):
    return w0 / w0.norm(dim=-1, keepdim=True), 2 * torch.sigmoid(b0)


def _paper(q, k, v, w, beta, scale):
    """softmax_j<=i(scale · q_iᵀ H_i ⋯ H_{j+1} k_j) v_j, each H_t = I - β_t w_t w_tᵀ an explicit
    D x D matrix and each product multiplied out, pair by pair."""
    B, H, T, D = q.shape
    eye = torch.eye(D, dtype=q.dtype)
    out = []
    for b in range(B):
        for h in range(H):
            Hs = [eye - beta[b, h, t] * torch.outer(w[b, h, t], w[b, h, t]) for t in range(T)]
            rows = []
            for i in range(T):
                logits, P = [], eye
                for j in range(i, -1, -1):  # P = H_i ⋯ H_{j+1}, grown one matrix at a time going back
                    logits.append(q[b, h, i] @ P @ k[b, h, j])
                    P = P @ Hs[j]
                a = torch.softmax(torch.stack(logits[::-1]) * scale, -1)  # keys 0..i
                rows.append(a @ v[b, h, : i + 1])
            out.append(torch.stack(rows))
    return torch.stack(out).view(B, H, T, -1)


@pytest.mark.parametrize("T,chunk", [(1, 4), (3, 4), (4, 4), (5, 4), (9, 4), (13, 8), (7, 1), (6, 16)])
def test_equals_the_papers_products(T, chunk):
    """Forward and every gradient (q, k, v, w, β) against the loops, float64: single chunks,
    exact multiples, a ragged last chunk, one token per chunk, and a chunk longer than T."""
    q, k, v, w0, b0 = _inputs(2, 2, T, 3, Dv=5)
    got = householder_attention(q, k, v, *_w_beta(w0, b0), scale=0.6, chunk=chunk)
    want = _paper(q, k, v, *_w_beta(w0, b0), 0.6)  # a graph of its own from w0, b0
    assert got.shape == (2, 2, T, 5)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert_same_grads(got, want, (q, k, v, w0, b0), atol=1e-11, rtol=1e-11)


def test_gradcheck_and_gradgradcheck():
    """Finite differences, first and second order (a backward with create_graph replays the forward)."""
    q, k, v, w0, b0 = _inputs(1, 2, 7, 3)
    fn = lambda q, k, v, w0, b0: householder_attention(q, k, v, *_w_beta(w0, b0), scale=0.8, chunk=3)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, w0, b0))
    assert torch.autograd.gradgradcheck(fn, (q, k, v, w0, b0))


def test_passes_over_heads_do_not_change_the_result(monkeypatch):
    """The rows and heads are taken in passes bounded by CHAIN_FLOATS: one sequence per pass
    gives what one pass of all gives."""
    q, k, v, w0, b0 = _inputs(2, 3, 70, 4)
    whole = householder_attention(q, k, v, *_w_beta(w0, b0), scale=0.5, chunk=16)
    monkeypatch.setattr(householder_flash, "CHAIN_FLOATS", 1)
    assert householder_flash._group(70, 16, 4) == 1
    one = householder_attention(q, k, v, *_w_beta(w0, b0), scale=0.5, chunk=16)
    torch.testing.assert_close(one, whole, atol=1e-13, rtol=1e-13)
    assert_same_grads(one, whole, (q, k, v, w0, b0), atol=1e-12, rtol=1e-12)


def test_keeps_no_square_tensor_for_the_backward():
    """What autograd keeps between forward and backward is O(T·D) per sequence (the inputs, the
    output, the rows' log-sum-exp and the chunks' (n, n) inverses), nothing (T, T)."""
    B, H, T, D, n = 1, 2, 512, 8, 32
    q, k, v, w0, b0 = _inputs(B, H, T, D, dtype=torch.float32)
    w, beta = (x.detach().requires_grad_() for x in _w_beta(w0, b0))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        householder_attention(q, k, v, w, beta, scale=0.3, chunk=n)
    total = sum(t.numel() for t in saved)
    assert total <= B * H * T * (6 * D + n + 2)
    assert total < B * H * T * T // 4


def test_half_precision_is_computed_in_float32():
    """bfloat16 inputs: computed in float32 (the products of Householders would drift in
    bfloat16), the result in v's dtype and the gradients in their inputs' dtypes."""
    q, k, v, w0, b0 = (x.detach() for x in _inputs(1, 2, 40, 8, dtype=torch.float32))
    w, beta = _w_beta(w0, b0)
    half = [x.to(torch.bfloat16).requires_grad_() for x in (q, k, v, w, beta)]
    got = householder_attention(*half, scale=0.35, chunk=16)
    want = householder_attention(*(x.detach().float() for x in half), scale=0.35, chunk=16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=0)
    got.float().sum().backward()
    assert all(x.grad.dtype == torch.bfloat16 for x in half)


def test_empty_sequence():
    q, k, v, w0, b0 = _inputs(1, 2, 0, 4)
    out = householder_attention(q, k, v, *_w_beta(w0, b0), scale=0.5)
    assert out.shape == (1, 2, 0, 4)


@pytest.mark.parametrize("change,message", [
    (dict(k=torch.zeros(1, 2, 5, 3)), r"k and w must have q's shape"),
    (dict(v=torch.zeros(1, 2, 6, 4)), r"v must be \(B=1, H=2, T=5, Dv\)"),
    (dict(beta=torch.zeros(1, 2, 5, 1)), r"beta must be a float tensor \(B=1, H=2, T=5\)"),
    (dict(q=torch.zeros(2, 5, 4)), r"q must be a 4-D float tensor"),
    (dict(scale=float("nan")), r"scale must be a finite float"),
    (dict(chunk=0), r"chunk must be an int in \[1, 4096\]"),
    (dict(chunk=True), r"chunk must be an int in \[1, 4096\]"),
])
def test_bad_inputs_are_refused_by_name(change, message):
    args = dict(q=torch.zeros(1, 2, 5, 4), k=torch.zeros(1, 2, 5, 4), v=torch.zeros(1, 2, 5, 4),
                w=torch.zeros(1, 2, 5, 4), beta=torch.zeros(1, 2, 5), scale=0.5, chunk=4)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        householder_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("w"), args.pop("beta"), **args)


def test_the_leaf_refuses_another_scale():
    """The term's logits replace the call's scaled q·kᵀ, so its scale must be the call's."""
    from posenc.masks import AttentionMask
    from posenc.positions import SequenceInfo

    q, k, v, w0, b0 = (x.detach() for x in _inputs(1, 2, 6, 4))
    w, beta = _w_beta(w0, b0)
    seq = SequenceInfo.from_offset(1, 6)
    mask = AttentionMask.build(seq, seq, causal=True)
    terms = LayerTerms.of(seq.positions, seq.positions, None, [HouseholderTerm(q, k, w, beta, 0.5, 4)])
    with pytest.raises(ValueError, match=r"a HouseholderTerm's scale \(0.5\) must be the attention's \(0.25\)"):
        householder_flash.attention(q, k, v, scale=0.25, mask=mask, terms=terms)


def test_a_path_model_trains_through_the_leaf_as_through_eager(plans):
    """A PaTH model (float64, grouped-query heads, a length that is no multiple of the chunk):
    impl='sdpa' plans the Householder leaf for every layer, and its loss and every parameter's
    gradient equal impl='eager''s, which adds the dense term to q·kᵀ."""
    torch.manual_seed(0)
    model = tiny_model("path", dtype=F64, n_kv_head=2)
    assert_impls_train_alike(model, torch.randint(0, 64, (2, 71)))
    assert [p.leaf for p in plans][:2] == [Leaf.HOUSEHOLDER] * 2
    assert Leaf.HOUSEHOLDER not in [p.leaf for p in plans][2:]
