"""The fused inference path of the attention methods (posenc.methods.fused): equal to the blockwise
path and to the slow loop over each paper's formula, for every method, every mask, grouped
queries, a KV cache, block sizes, and the dtypes; chosen only where it can run."""

from __future__ import annotations

import pytest
import torch

from posenc.methods import build_method, method_attention
from posenc.methods.fused import fused_available
from tests.methods_reference import dual_chunk_pair, qkv, rerope_pair, self_extend_pair, slow_attention
from tests.test_methods_self_extend import positions, rel, rope

CASES = [
    ("self_extend", dict(group_size=2, neighbor_window=3), self_extend_pair(2, 3)),
    ("rerope", dict(window=3, slope=0.0), rerope_pair(3)),
    ("rerope", dict(window=2, slope=0.25), rerope_pair(2, 0.25)),
    ("dual_chunk", dict(chunk_size=5, local_size=2), dual_chunk_pair(5, 2)),
]


@pytest.mark.parametrize("name, params, pair", CASES)
@pytest.mark.parametrize("rows", [1, 4, 13, None])
def test_fused_equals_the_loop_and_the_blockwise_path(name, params, pair, rows):
    q, k, v = qkv(B=2, H=4, Hkv=2, Tq=13)
    pos = positions(2, 13)
    m, inv = build_method(name, **params), rope().inv_freq
    assert fused_available(q, k, v, 0.0)
    got = method_attention(q, k, v, m, pos, pos, inv, block_rows=rows)
    blockwise = method_attention(q, k, v, m, pos, pos, inv, block_rows=rows, fused=False)
    want = slow_attention(q, k, v, pos, pos, inv, pair)
    assert rel(got, want) < 1e-5 and rel(got, blockwise) < 1e-5


@pytest.mark.parametrize("name, params, pair", CASES)
def test_decoding_rows_and_the_attention_factor(name, params, pair):
    q, k, v = qkv(B=1, H=2, Hkv=1, Tq=3, Tk=11)  # the last 3 of 11 keys: a cache of 8
    k_pos = positions(1, 11)
    m, inv = build_method(name, **params), rope(H=2).inv_freq
    got = method_attention(q, k, v, m, k_pos[:, -3:], k_pos, inv, attention_factor=1.2)
    want = slow_attention(q, k, v, k_pos[:, -3:], k_pos, inv, pair, factor=1.2)
    assert rel(got, want) < 1e-5


def test_masks_padding_and_documents_equal_the_blockwise_path():
    B, T = 2, 12
    q, k, v = qkv(B=B, H=2, Hkv=2, Tq=T)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0, :3] = False
    docs = torch.tensor([[0] * 7 + [1] * 5, [0] * 4 + [1] * 8])
    pos = torch.stack([torch.cat((torch.arange(7), torch.arange(5))), torch.cat((torch.arange(4), torch.arange(8)))])
    dense = torch.rand(B, 1, T, T, generator=torch.Generator().manual_seed(3)) > 0.3
    m, inv = build_method("dual_chunk", chunk_size=4, local_size=1), rope(H=2).inv_freq
    for kw in (dict(key_valid=valid), dict(segment_ids=docs), dict(mask=dense), dict(causal=False)):
        got = method_attention(q, k, v, m, pos, pos, inv, block_rows=5, **kw)
        want = method_attention(q, k, v, m, pos, pos, inv, block_rows=5, fused=False, **kw)
        assert torch.isfinite(got).all() and rel(got, want) < 1e-5, kw


def test_a_block_that_sees_no_key_is_the_blockwise_paths_uniform_row():
    q, k, v = qkv(B=1, H=2, Hkv=2, Tq=6)
    pos = positions(1, 6)
    valid = torch.tensor([[False, False, True, True, True, True]])
    m, inv = build_method("rerope", window=2), rope(H=2).inv_freq
    got = method_attention(q, k, v, m, pos, pos, inv, key_valid=valid, block_rows=2)
    want = method_attention(q, k, v, m, pos, pos, inv, key_valid=valid, block_rows=2, fused=False)
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.bfloat16, 2e-2)])
def test_dtypes(dtype, tol):
    q, k, v = qkv(B=1, H=2, Hkv=1, Tq=9, dtype=dtype)
    pos = positions(1, 9)
    m, inv = build_method("self_extend", group_size=3, neighbor_window=2), rope(H=2).inv_freq
    got = method_attention(q, k, v, m, pos, pos, inv)
    assert got.dtype == dtype
    assert rel(got.double(), slow_attention(q, k, v, pos, pos, inv, self_extend_pair(3, 2))) < tol


def test_the_path_is_chosen_where_it_can_run():
    q, k, v = qkv(B=1, H=2, Hkv=1, Tq=4)
    assert fused_available(q, k, v, 0.0)
    assert not fused_available(q, k, v, 0.1)  # dropout: the blockwise path
    assert not fused_available(q.requires_grad_(), k, v, 0.0)  # a gradient: the blockwise path
    with torch.no_grad():
        assert fused_available(q, k, v, 0.0)
    with pytest.raises(ValueError, match="fused must be None"):
        method_attention(q, k, v, build_method("rerope", window=2), positions(1, 4), positions(1, 4),
                         rope(H=2).inv_freq, fused=True)


@pytest.mark.parametrize("name, params, pair", CASES)
def test_select_is_monotone_as_the_tiled_plan_needs(name, params, pair):
    """Farther pairs take later rotations: select(q, k) nondecreasing in q, nonincreasing in k
    (checked on every pair of positions 0..39), so a tile's corners bound its pairs."""
    m = build_method(name, **params)
    p = torch.arange(40)
    sel = m.select(p[None, :, None], p[None, None, :])[0]  # (40, 40): [q, k]
    assert len(set(sel.flatten().tolist())) == m.num_rotations  # every rotation is used
    assert (sel[1:] >= sel[:-1]).all() and (sel[:, 1:] <= sel[:, :-1]).all()


@pytest.mark.parametrize("name, params, pair", CASES)
def test_the_tiled_plan_at_a_length_of_many_tiles_equals_the_blockwise_path(name, params, pair):
    """Causal, unmasked, contiguous positions starting past 0 (a window of a stream) and a cache:
    the tiled plan (runs of 128-key tiles) against the blockwise path, at 700 queries."""
    params = {k: (v * 60 if isinstance(v, int) else v) for k, v in params.items()}
    q, k, v = qkv(B=1, H=2, Hkv=1, Tq=700, Tk=760, D=16)
    k_pos = (torch.arange(760) + 33)[None]
    m, inv = build_method(name, **params), rope(D=16, H=2).inv_freq
    got = method_attention(q, k, v, m, k_pos[:, 60:], k_pos, inv)
    want = method_attention(q, k, v, m, k_pos[:, 60:], k_pos, inv, fused=False)
    assert rel(got, want) < 1e-5
