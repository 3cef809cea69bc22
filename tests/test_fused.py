"""posenc.backends.fused against a slow explicit reference, forward and backward.

The reference spells attention out per (query, key) pair with Python loops over buckets:
logits = q·kᵀ·scale + bias + table[bucket], masked, softmax, p·v + Σ_r mass(i, r)·values[r],
differentiated by autograd. Every gradient (q, k, v, bias, each table, each ValueTerm's
values) is compared, over causal / bidirectional / packed / padded masks, GQA, Tq < Tk and
no terms at all.
"""

from __future__ import annotations

import pytest
import torch

from posenc.backends.fused import fused_attention
from posenc.terms import TableTerm, ValueTerm


def clip_bucket(k: int):
    """Bucket of a clipped distance q_pos - k_pos in [-k, k] -> [0, 2k]."""
    return lambda qp, kp: (qp - kp).clamp(-k, k) + k


def reference(q, k, v, *, scale, mask=None, causal=False, bias=None, tables=(), values=(), q_pos=None, k_pos=None):
    """Explicit attention: every pair's logit term looked up one bucket at a time."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    cdt = torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    logits = q @ k.transpose(-1, -2) * scale  # (B, H, Tq, Tk)
    if bias is not None:
        logits = logits + bias
    qp = None if q_pos is None else q_pos.expand(B, Tq)
    kp = None if k_pos is None else k_pos.expand(B, Tk)
    for t in tables:
        tab = t.table.expand(B, H, -1, -1)
        extra = torch.zeros_like(logits)
        for b in range(B):
            for i in range(Tq):
                for j in range(Tk):
                    r = int(t.bucket(qp[b, i], kp[b, j]))
                    row = i if t.side == "query" else j
                    extra[b, :, i, j] = tab[b, :, row, r]
        logits = logits + extra
    allowed = torch.ones(B, H, Tq, Tk, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if causal:
        allowed = allowed & (torch.arange(Tk)[None, :] <= torch.arange(Tk - Tq, Tk)[:, None])
    logits = logits.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(logits, -1).nan_to_num(0.0)  # rows with no visible key: zero
    out = p @ v
    for t in values:
        val = t.values.to(cdt).expand(H, -1, -1)
        add = torch.zeros_like(out)
        for b in range(B):
            for i in range(Tq):
                for j in range(Tk):
                    r = int(t.bucket(qp[b, i], kp[b, j]))
                    add[b, :, i] += p[b, :, i, j, None] * val[:, r]
        out = out + add
    return out


def make(B=2, H=4, Hkv=4, Tq=7, Tk=7, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, Tk, D, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, Tk, D, generator=g, dtype=dtype, requires_grad=True)
    return g, q, k, v


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def compare(kw, tensors, block, atol=1e-10, rtol=1e-8):
    """Run fused and reference on copies of the same leaves; compare outputs and every grad."""
    assert tensors, "nothing to differentiate"

    def run(fn, b):
        leaves = [leaf(t) for t in tensors]
        out = fn(leaves, b)
        g = torch.Generator().manual_seed(7)
        w = torch.randn(out.shape, generator=g, dtype=out.dtype)
        (out * w).sum().backward()
        return out.detach(), [x.grad for x in leaves]

    out_f, grads_f = run(lambda ls, b: kw(ls, fused=True, block=b), block)
    out_r, grads_r = run(lambda ls, b: kw(ls, fused=False, block=b), block)
    torch.testing.assert_close(out_f, out_r, atol=atol, rtol=rtol)
    for n, (a, b) in enumerate(zip(grads_f, grads_r)):
        assert a is not None and b is not None, f"input {n} got no gradient"
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m: f"grad of input {n}: {m}")


def shaw_like(B, H, Hkv, Tq, Tk, D, clip, q_pos, k_pos, *, mask=None, causal=False, key_table=True, bias=False, seed=0):
    """Inputs with a query-side table, a key-side table, a value term and optionally a dense bias."""
    g, q, k, v = make(B, H, Hkv, Tq, Tk, D, seed=seed)
    R = 2 * clip + 1
    tq = torch.randn(B, H, Tq, R, generator=g, dtype=torch.float64)
    tk = torch.randn(B, H, Tk, R, generator=g, dtype=torch.float64)
    vals = torch.randn(H, R, D, generator=g, dtype=torch.float64)
    dense = torch.randn(1, H, Tq, Tk, generator=g, dtype=torch.float64)
    bucket = clip_bucket(clip)
    tensors = [q, k, v, tq, vals] + ([tk] if key_table else []) + ([dense] if bias else [])

    def call(ls, fused, block):
        q, k, v, tq, vals = ls[:5]
        rest = ls[5:]
        tables = [TableTerm(tq, "query", bucket)]
        if key_table:
            tables.append(TableTerm(rest.pop(0), "key", bucket))
        b = rest.pop(0) if bias else None
        kw = dict(scale=0.3, mask=mask, causal=causal, bias=b, tables=tables,
                  values=[ValueTerm(vals, bucket)], q_pos=q_pos, k_pos=k_pos)
        if fused:
            return fused_attention(q, k, v, block=block, **kw)
        return reference(q, k, v, **kw)

    return call, tensors


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", [3, 256])
def test_contiguous_all_terms(causal, block):
    T = 9
    pos = torch.arange(T)[None]
    call, tensors = shaw_like(2, 4, 4, T, T, 8, 3, pos, pos, causal=causal, bias=True)
    compare(call, tensors, block)


def test_packed_documents():
    # Two documents per row (segment ids), positions restart at each document start.
    seg = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 0, 0, 1, 1, 1]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 0, 1, 2]])
    mask = (seg[:, None, :, None] == seg[:, None, None, :])  # (B, 1, T, T)
    call, tensors = shaw_like(2, 2, 2, 8, 8, 4, 2, pos, pos, mask=mask, causal=True)
    compare(call, tensors, block=3)


def test_left_padding():
    # Row 1 has three padding tokens on the left: they are hidden as keys; their own rows see
    # nothing and give zero output (and so zero gradient).
    valid = torch.tensor([[True] * 6, [False] * 3 + [True] * 3])
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    mask = valid[:, None, None, :].expand(2, 1, 6, 6)
    call, tensors = shaw_like(2, 2, 2, 6, 6, 4, 2, pos, pos, mask=mask, causal=True)
    compare(call, tensors, block=4)


def test_gqa_and_decoding_tq_lt_tk():
    # 4 query heads on 2 kv heads; 3 queries at the end of 10 keys (a chunked decoding step).
    kp = torch.arange(10)[None]
    qp = kp[:, -3:]
    call, tensors = shaw_like(2, 4, 2, 3, 10, 8, 4, qp, kp, causal=True)
    compare(call, tensors, block=2)


def test_single_query_bidirectional_batch_positions():
    # Per-row KV-cache offsets (different positions per batch row), one query.
    kp = torch.tensor([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    qp = torch.tensor([[5], [10]])
    call, tensors = shaw_like(2, 2, 2, 1, 5, 4, 2, qp, kp)
    compare(call, tensors, block=256)


def test_no_terms_matches_sdpa():
    _, q, k, v = make(2, 4, 2, 9, 9, 8)

    def call(ls, fused, block):
        q, k, v = ls
        if fused:
            return fused_attention(q, k, v, scale=0.25, causal=True, block=block)
        kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True, scale=0.25)

    compare(call, [q, k, v], block=4)


def test_broadcast_tables_and_shared_values():
    # A table broadcast over batch (1, H, T, R), values shared by heads (1, R, D): gradients
    # are summed back to those shapes.
    T, clip = 6, 2
    pos = torch.arange(T)[None]
    g, q, k, v = make(2, 3, 3, T, T, 4)
    tab = torch.randn(1, 3, T, 2 * clip + 1, generator=g, dtype=torch.float64)
    vals = torch.randn(1, 2 * clip + 1, 4, generator=g, dtype=torch.float64)
    bucket = clip_bucket(clip)

    def call(ls, fused, block):
        q, k, v, tab, vals = ls
        kw = dict(scale=0.5, causal=False, tables=[TableTerm(tab, "query", bucket)],
                  values=[ValueTerm(vals, bucket)], q_pos=pos, k_pos=pos)
        return fused_attention(q, k, v, block=block, **kw) if fused else reference(q, k, v, **kw)

    compare(call, [q, k, v, tab, vals], block=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype):
    # Computed in float32: compare with the float64 reference at the input dtype's resolution.
    T, clip = 16, 3
    pos = torch.arange(T)[None]
    g, q, k, v = make(1, 2, 2, T, T, 8, dtype=torch.float64)
    tab = torch.randn(1, 2, T, 2 * clip + 1, generator=g)
    bucket = clip_bucket(clip)
    ql, kl, vl = (leaf(x.to(dtype)) for x in (q, k, v))
    out = fused_attention(ql, kl, vl, scale=0.35, causal=True, tables=[TableTerm(tab, "query", bucket)],
                          q_pos=pos, k_pos=pos, block=5)
    assert out.dtype == dtype
    out.float().sum().backward()
    assert ql.grad.dtype == dtype and kl.grad.dtype == dtype and vl.grad.dtype == dtype
    q64, k64, v64 = (leaf(x.detach().to(dtype).double()) for x in (ql, kl, vl))
    ref = reference(q64, k64, v64, scale=0.35, causal=True, tables=[TableTerm(tab.double(), "query", bucket)],
                    q_pos=pos, k_pos=pos)
    ref.sum().backward()
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(out.double(), ref.detach().to(dtype).double(), atol=tol, rtol=tol)
    torch.testing.assert_close(ql.grad.double(), q64.grad, atol=4 * tol, rtol=4 * tol)


def test_keeps_no_dense_probabilities_for_backward():
    # What autograd saves is O(T·D + T·R): nothing with a (Tq, Tk) pair of dims.
    T, clip = 64, 4
    pos = torch.arange(T)[None]
    g, q, k, v = make(1, 2, 2, T, T, 8, dtype=torch.float32)
    tab = torch.randn(1, 2, T, 2 * clip + 1, generator=g, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fused_attention(q, k, v, scale=0.3, causal=True, tables=[TableTerm(tab, "query", clip_bucket(clip))],
                        q_pos=pos, k_pos=pos, block=16)
    assert saved, "the fused op saved nothing: the hook did not run"
    assert all(s[-2:] != (T, T) for s in saved), saved


def test_fully_masked_row_is_zero():
    _, q, k, v = make(1, 1, 1, 2, 3, 4)
    mask = torch.tensor([[[[True, True, False], [False, False, False]]]])
    out = fused_attention(q, k, v, scale=1.0, mask=mask)
    assert torch.equal(out[0, 0, 1], torch.zeros(4, dtype=out.dtype))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[0, 0, 1], torch.zeros(4, dtype=q.dtype))


def test_empty_sequences():
    _, q, k, v = make(1, 2, 2, 0, 0, 4)
    out = fused_attention(q, k, v, scale=1.0, causal=True)
    assert out.shape == (1, 2, 0, 4)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(scale=float("nan")), ValueError, "scale must be a finite float"),
        (dict(scale=1.0, block=0), ValueError, "block must be an int >= 1, got 0"),
        (dict(scale=1.0, causal=1), TypeError, "causal must be a bool"),
        (dict(scale=1.0, mask=torch.ones(1, 1, 3, 3)), ValueError, "mask must be a bool tensor"),
        (dict(scale=1.0, bias=torch.zeros(1, 2, 4, 3)), ValueError, r"bias must have shape \(1 or 1, 1 or 2, 3, 3\)"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    _, q, k, v = make(1, 2, 2, 3, 3, 4)
    with pytest.raises(error, match=match):
        fused_attention(q, k, v, **kwargs)


def test_table_shape_and_positions_are_checked():
    _, q, k, v = make(1, 2, 2, 3, 3, 4)
    pos = torch.arange(3)[None]
    bad = TableTerm(torch.zeros(1, 2, 5, 3), "query", clip_bucket(1))
    with pytest.raises(ValueError, match=r"query-side TableTerm's table must have shape \(1 or 1, 1 or 2, 3, R >= 1\)"):
        fused_attention(q, k, v, scale=1.0, tables=[bad], q_pos=pos, k_pos=pos)
    ok = TableTerm(torch.zeros(1, 2, 3, 3), "query", clip_bucket(1))
    with pytest.raises(ValueError, match=r"q_pos must be an int tensor of shape \(1 or 1, 3\)"):
        fused_attention(q, k, v, scale=1.0, tables=[ok])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shared_rows", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_factored_query_table_equals_the_table(causal, shared_rows, padded):
    """A query-side TableTerm.product (x @ rows) is read block by block from its factors,
    never as a (B, H, Tq, R) table: output and the gradients of q, k, v, x and rows equal the
    loop reference over the full table, with buckets spread over many rows (R = 2T - 1, as
    Transformer-XL's unclipped distances) and per-row positions (left padding)."""
    B, H, T, D = 2, 3, 11, 4
    g, q, k, v = make(B=B, H=H, Hkv=H, Tq=T, Tk=T, D=D)
    x = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    rows = torch.randn(*(() if shared_rows else (H,)), D, 2 * T - 1, generator=g, dtype=torch.float64)
    offset = torch.tensor([[0], [3]]) if padded else torch.zeros(1, 1, dtype=torch.long)
    pos = torch.arange(T)[None] - offset  # (B|1, T): row 1 starts at -3 (left padding)
    mask = None
    if padded:
        mask = (pos >= 0)[:, None, None, :].expand(B, 1, T, T)  # padding keys hidden
    bucket = lambda qp, kp: (qp - kp).clamp(-(T - 1), T - 1) + (T - 1)

    def kw(leaves, fused, block):
        q_, k_, v_, x_, r_ = leaves
        term = TableTerm.product(x_, r_, "query", bucket) if fused else TableTerm(x_ @ r_, "query", bucket)
        args = dict(scale=0.5, causal=causal, tables=[term], q_pos=pos, k_pos=pos, mask=mask)
        if fused:
            return fused_attention(q_, k_, v_, block=block, **args)
        return reference(q_, k_, v_, **args)

    for block in (3, 256):
        compare(kw, [q, k, v, x, rows], block)
