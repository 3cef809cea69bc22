"""TableTerm given by factors (``TableTerm.product(x, rows, ...)``): the dense form that gathers
each pair's row of ``rows`` and dots it with x (taken when the other side has few positions,
as in a decoding step) equals gathering the table x @ rows, and both equal an explicit loop
over (batch, head, query, key), forward and backward, for both sides. On the key side, keys
whose bucket is saturated for every query (a :class:`~posenc.terms.SaturatingBucket`) read
their one row without a gather.
"""

from __future__ import annotations

import pytest
import torch

from posenc.relative.deberta import log_bucket_position
from posenc.relative.distance import DistanceBucket, LookupBucket, saturation_bounds
from posenc.terms import TableTerm

CLIP = 20  # R = 41 rows
D = 4


def _positions(B: int, Tq: int, Tk: int, layout: str):
    """(B|1, Tq), (B|1, Tk) int64: contiguous queries after the keys (distances 13 to 25
    reach the clip), or sorted random positions per row that no Toeplitz shortcut can take."""
    if layout == "contiguous":
        return 25 + torch.arange(Tq)[None], torch.arange(Tk)[None]
    g = torch.Generator().manual_seed(1)
    k_pos = torch.sort(torch.randint(-30, 60, (B, Tk), generator=g), dim=-1).values
    q_pos = torch.sort(torch.randint(-30, 60, (B, Tq), generator=g), dim=-1).values
    return q_pos, k_pos


def _loop(x, rows, side, bucket, q_pos, k_pos):
    """logit[b, h, i, j] = x[b, h, i or j] · rows[h, :, bucket(q_pos_i, k_pos_j)], one pair at a time."""
    B, H = x.shape[:2]
    Tq, Tk = q_pos.shape[1], k_pos.shape[1]
    out = torch.zeros(B, H, Tq, Tk, dtype=x.dtype)
    for b in range(B):
        qp, kp = q_pos[min(b, q_pos.shape[0] - 1)], k_pos[min(b, k_pos.shape[0] - 1)]
        for h in range(H):
            for i in range(Tq):
                for j in range(Tk):
                    r = int(bucket(qp[i], kp[j]))
                    vec = x[b, h, i] if side == "query" else x[b, h, j]
                    out[b, h, i, j] = vec @ (rows[:, r] if rows.dim() == 2 else rows[h, :, r])
    return out


def _inputs(side, B, H, rows_heads, Tq, Tk, seed=0):
    g = torch.Generator().manual_seed(seed)
    T_side = Tq if side == "query" else Tk
    x = torch.randn(B, H, T_side, D, generator=g, dtype=torch.float64, requires_grad=True)
    shape = (D, 2 * CLIP + 1) if rows_heads is None else (rows_heads, D, 2 * CLIP + 1)  # None: shared by heads
    rows = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    return x, rows


@pytest.mark.parametrize("side", ["query", "key"])
@pytest.mark.parametrize("rows_heads", [None, 3])
@pytest.mark.parametrize("layout", ["contiguous", "ragged"])
def test_gathered_rows_equal_table_and_loop(side, rows_heads, layout):
    B, H = 2, 3
    # One position on the other side (other · D <= R): the gathered rows are taken.
    Tq, Tk = (1, 13) if side == "key" else (13, 1)
    q_pos, k_pos = _positions(B, Tq, Tk, layout)
    bucket = DistanceBucket(-CLIP, CLIP)
    x, rows = _inputs(side, B, H, rows_heads, Tq, Tk)
    w = torch.randn(B, H, Tq, Tk, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    fast = TableTerm.product(x, rows, side, bucket)
    got = fast.dense(q_pos, k_pos)
    assert fast._table is None, "the few-positions case must not build the table"
    gx, grows = torch.autograd.grad((got * w).sum(), (x, rows))

    table = TableTerm(x @ rows, side, bucket).dense(q_pos, k_pos)
    tx, trows = torch.autograd.grad((table * w).sum(), (x, rows))
    ref = _loop(x.detach(), rows.detach(), side, bucket, q_pos, k_pos)

    assert got.shape == (B, H, Tq, Tk)
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(table, ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gx, tx, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grows, trows, atol=1e-12, rtol=1e-12)
    assert grows.abs().sum() > 0 and gx.abs().sum() > 0


@pytest.mark.parametrize("side", ["query", "key"])
def test_many_positions_use_the_table(side):
    """Tq = Tk = 16 with D = 4, R = 41: 16·4 > 41, so the table is built (and read by every form)."""
    B, H, T = 1, 2, 16
    q_pos, k_pos = _positions(B, T, T, "contiguous")
    bucket = DistanceBucket(-CLIP, CLIP)
    x, rows = _inputs(side, B, H, None, T, T)
    term = TableTerm.product(x, rows, side, bucket)
    assert term.is_factored
    got = term.dense(q_pos, k_pos)
    assert not term.is_factored
    torch.testing.assert_close(term.table, x @ rows)
    torch.testing.assert_close(got, _loop(x.detach(), rows.detach(), side, bucket, q_pos, k_pos), atol=1e-12, rtol=1e-12)


def test_given_table_is_kept_and_bad_side_refused():
    tab = torch.randn(1, 2, 3, 5)
    t = TableTerm(tab, "key", DistanceBucket(-2, 2))
    assert t.table is tab and t.side == "key" and not t.is_factored
    with pytest.raises(ValueError, match="side must be 'query' or 'key'"):
        TableTerm(tab, "keys", DistanceBucket(-2, 2))
    with pytest.raises(ValueError, match="side must be 'query' or 'key'"):
        TableTerm.product(torch.randn(1, 2, 3, 4), torch.randn(1, 4, 5), "both", DistanceBucket(-2, 2))


def _deberta_bucket() -> LookupBucket:
    """DeBERTa's log buckets (bucket_size 8, max_position 24) as the encoding builds them: a
    lookup table over the distances where they are not yet saturated, clamped to +-span."""
    span = 8
    canon = lambda d: log_bucket_position(d, span, 24).clamp(-span, span - 1)  # noqa: E731
    lo, hi = saturation_bounds(canon, span - 1, -span)
    return LookupBucket(canon(torch.arange(lo, hi + 1)) + span, lo, hi)  # rows 0 .. 2·span - 1


@pytest.mark.parametrize("bucket", [DistanceBucket(-CLIP, CLIP), DistanceBucket(-3, 17), "deberta"], ids=str)
@pytest.mark.parametrize("rows_heads", [None, 3])
def test_saturated_keys_read_one_row(bucket, rows_heads, monkeypatch):
    """Key side, two queries amid 90 contiguous keys: keys far before the queries (distance >=
    hi from both) and far after them (<= lo) read one row each as a matrix-vector product; only
    the keys in between gather rows, and the result equals the loop over pairs, with gradients
    equal to the table form's."""
    bucket = _deberta_bucket() if bucket == "deberta" else bucket
    B, H, Tq, Tk = 2, 3, 2, 90
    q_pos, k_pos = 40 + torch.arange(Tq)[None], torch.arange(Tk)[None]
    x, rows = _inputs("key", B, H, rows_heads, Tq, Tk)
    R = rows.shape[-1]
    assert int(bucket(torch.tensor(10**6), torch.tensor(0))) < R  # the buckets index these rows
    gathered = []
    real = TableTerm._gather_rows
    monkeypatch.setattr(TableTerm, "_gather_rows", lambda self, idx, xs: gathered.append(idx.shape[-1]) or real(self, idx, xs))

    term = TableTerm.product(x, rows, "key", bucket)
    got = term.dense(q_pos, k_pos)
    w = torch.randn(B, H, Tq, Tk, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    gx, grows = torch.autograd.grad((got * w).sum(), (x, rows))
    table = TableTerm(x @ rows, "key", bucket).dense(q_pos, k_pos)
    tx, trows = torch.autograd.grad((table * w).sum(), (x, rows))

    # Keys j with 40 - j >= hi, or 41 - j <= lo, are saturated; the rest are gathered.
    assert gathered == [(40 + Tq - 1 - bucket.lo) - (40 - bucket.hi + 1)]
    torch.testing.assert_close(got, _loop(x.detach(), rows.detach(), "key", bucket, q_pos, k_pos), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(table, got, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(gx, tx, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grows, trows, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("case", ["lambda bucket", "ragged positions", "all saturated", "none saturated"])
def test_key_rows_without_or_with_trivial_windows(case):
    """The saturation shortcut's edges: a plain function as bucket or non-contiguous positions
    gather every key; a window that is empty, or covers every key, is still exact."""
    B, H = 1, 2
    bucket = DistanceBucket(-CLIP, CLIP)
    q_pos, k_pos = 40 + torch.arange(1)[None], torch.arange(30)[None]
    if case == "lambda bucket":
        bucket = lambda qp, kp: (qp - kp).clamp(-CLIP, CLIP) + CLIP  # noqa: E731
    elif case == "ragged positions":
        q_pos, k_pos = _positions(B, 1, 30, "ragged")
    elif case == "all saturated":
        q_pos = 1000 + q_pos
    else:
        k_pos = 30 + torch.arange(20)[None]  # distances 10 .. -9, inside the clip
    x, rows = _inputs("key", B, H, None, 1, k_pos.shape[1])
    got = TableTerm.product(x, rows, "key", bucket).dense(q_pos, k_pos)
    torch.testing.assert_close(got, _loop(x.detach(), rows.detach(), "key", bucket, q_pos, k_pos), atol=1e-12, rtol=1e-12)
