"""The blockwise attention every method runs through (posenc.methods.blockwise): row blocks equal
one block, the masks (padding, documents, a dense mask) equal the slow loop's, gradients equal the
loop's, and a forward at 2048 tokens never makes a (T, T) tensor."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from posenc.methods import block_rows_for, build_method, method_attention
from tests.methods_reference import qkv, self_extend_pair, slow_attention
from tests.test_methods_self_extend import positions, rel, rope

SE = dict(group_size=2, neighbor_window=3)


@pytest.mark.parametrize("rows", [1, 5, 11, 12, 100])
def test_any_block_size_equals_one_block(rows):
    q, k, v = qkv(B=2, H=4, Hkv=2, Tq=12)
    pos = positions(2, 12)
    m, inv = build_method("self_extend", **SE), rope().inv_freq
    one = method_attention(q, k, v, m, pos, pos, inv, block_rows=12)
    assert torch.allclose(method_attention(q, k, v, m, pos, pos, inv, block_rows=rows), one, atol=1e-6, rtol=0)


def test_padding_documents_and_a_dense_mask_match_the_loop():
    B, T = 2, 12
    q, k, v = qkv(B=B, H=2, Hkv=2, Tq=T)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0, :3] = False  # row 0 left-padded by 3
    docs = torch.tensor([[0] * 7 + [1] * 5, [0] * 4 + [1] * 8])
    pos = torch.stack([torch.cat((torch.arange(7), torch.arange(5))), torch.cat((torch.arange(4), torch.arange(8)))])
    dense = torch.rand(B, 1, T, T, generator=torch.Generator().manual_seed(3)) > 0.3
    m, inv = build_method("self_extend", **SE), rope(H=2).inv_freq
    cases = [
        (dict(key_valid=valid), lambda b, i, j: bool(valid[b, j])),
        (dict(segment_ids=docs), lambda b, i, j: bool(docs[b, i] == docs[b, j])),
        (dict(mask=dense), lambda b, i, j: bool(dense[b, 0, i, j])),
    ]
    for kw, visible in cases:
        got = method_attention(q, k, v, m, pos, pos, inv, block_rows=5, **kw)
        want = slow_attention(q, k, v, pos, pos, inv, self_extend_pair(2, 3), visible=visible)
        rows = [(b, i) for b in range(B) for i in range(T) if any(visible(b, i, j) for j in range(i + 1))]
        assert rows
        for b, i in rows:  # rows that see a key; the others are checked below
            assert rel(got[b, :, i], want[b, :, i]) < 1e-5, kw


def test_a_row_that_sees_no_key_is_finite():
    q, k, v = qkv(B=1, Tq=6)
    pos = positions(1, 6)
    valid = torch.tensor([[False, False, True, True, True, True]])
    out = method_attention(q, k, v, build_method("rerope", window=2), pos, pos, rope().inv_freq, key_valid=valid)
    assert torch.isfinite(out).all()


def test_gradients_match_the_loop():
    q, k, v = qkv(B=1, H=2, Hkv=1, Tq=7, dtype=torch.float64)
    pos = positions(1, 7)
    inv = rope(H=2).inv_freq
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = method_attention(*leaves, build_method("self_extend", **SE), pos, pos, inv, block_rows=3)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = torch.autograd.grad((out * w).sum(), leaves)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = slow_attention(*ref_leaves, pos, pos, inv, self_extend_pair(2, 3))
    want = torch.autograd.grad((ref * w).sum(), ref_leaves)
    for g, r in zip(got, want):
        assert rel(g, r) < 1e-9


def test_bfloat16_stays_close_to_float32():
    q, k, v = qkv(B=1, Tq=16)
    pos = positions(1, 16)
    m, inv = build_method("rerope", window=4, slope=0.5), rope().inv_freq
    full = method_attention(q, k, v, m, pos, pos, inv)
    half = method_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), m, pos, pos, inv)
    assert half.dtype == torch.bfloat16 and rel(half, full) < 3e-2


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_t_by_t_tensor_at_2048_tokens_forward_and_backward():
    T, rows = 2048, 256  # one block (H=2, 256, 2048) is a quarter of T * T
    q, k, v = qkv(B=1, H=2, Hkv=1, Tq=T, D=16)
    pos = positions(1, T)
    m, inv = build_method("self_extend", group_size=4, neighbor_window=256), rope(16, 2).inv_freq
    with LargestTensor() as dense:  # the recorder sees a (T, T) product when there is one
        (q @ k.transpose(-1, -2)).softmax(-1)
    assert dense.largest >= T * T
    with torch.no_grad(), LargestTensor() as rec:
        method_attention(q, k, v, m, pos, pos, inv, block_rows=rows)
    assert rec.largest <= 2 * rows * T  # one block: (1, H=2, rows, <= T)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with LargestTensor() as rec:
        method_attention(*leaves, m, pos, pos, inv, block_rows=rows).sum().backward()
    assert rec.largest <= 2 * rows * T


def test_the_automatic_block_is_about_64_mib_of_logits():
    assert block_rows_for(1, 9, 16384) == 113  # SmolLM2-135M's 9 heads at 16384 keys
    assert block_rows_for(1, 1, 1 << 30) == 16  # never fewer than 16 rows


@pytest.mark.parametrize("kw,match", [
    (dict(block_rows=0), r"block_rows must be an int >= 1"),
    (dict(k_slice=slice(0, 5)), r"keys \(5\) must include the 8 queries"),
    (dict(q_pos=torch.zeros(1, 8)), r"q_pos must be integer positions"),
])
def test_bad_inputs(kw, match):
    q, k, v = qkv(B=1, Tq=8)
    ks = kw.pop("k_slice", slice(None))
    pos = positions(1, 8)
    args = dict(q_pos=pos) | kw
    with pytest.raises(ValueError, match=match):
        method_attention(q, k[:, :, ks], v[:, :, ks], build_method("rerope", window=2), args.pop("q_pos"),
                         pos[:, ks], rope().inv_freq, **args)
