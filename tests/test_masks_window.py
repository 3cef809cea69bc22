"""masks.py's sliding-window and chunked masks: every form (dense, mask_mod, BlockMask) against
an explicit loop over (b, i, j), against transformers' own mask functions, and through every
attention leaf the plan may take (tests/test_plan.py's style: each leaf against the eager one,
and the eager one against a softmax written out with the loop's mask).

The loop spells out the rules of ``posenc.masks``: causality and the window by stream index
(queries are the last Tq of the Tk keys), the chunk by position, documents, padding keys, and
a row that sees nothing sees everything.
"""

from __future__ import annotations

import pytest
import torch

from helpers import assert_same_grads

import posenc
from posenc import SequenceInfo
from posenc.backends import LEAVES, Leaf, LayerTerms, SharedBias, flex, plan
from posenc.masks import AttentionMask

F64 = torch.float64
TOL = dict(atol=1e-10, rtol=1e-10)
H, D = 4, 8


@pytest.fixture(autouse=True)
def _eager_flex(monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)


def reference_mask(q_seq, k_seq, causal, window=None, chunk=None):
    """Loop over (b, i, j): who may attend to whom, spelled out."""
    B, Tq = q_seq.positions.shape
    Tk = k_seq.positions.shape[1]
    kb = lambda t, b: t[b if t.shape[0] > 1 else 0]  # noqa: E731  (key rows may broadcast)
    m = torch.zeros(B, 1, Tq, Tk, dtype=torch.bool)
    for b in range(B):
        for i in range(Tq):
            qi = i + Tk - Tq  # the query's stream index
            for j in range(Tk):
                ok = True
                if causal and Tq > 1 and j > qi:
                    ok = False
                if window is not None and abs(qi - j) >= window:
                    ok = False
                if chunk is not None and int(q_seq.positions[b, i]) // chunk != int(kb(k_seq.positions, b)[j]) // chunk:
                    ok = False
                if k_seq.valid is not None and not kb(k_seq.valid, b)[j]:
                    ok = False
                if q_seq.segment_ids is not None and q_seq.segment_ids[b, i] != kb(k_seq.segment_ids, b)[j]:
                    ok = False
                m[b, 0, i, j] = ok
            if not m[b, 0, i].any():
                m[b, 0, i] = True
    return m


def _seqs(kind: str) -> tuple[SequenceInfo, SequenceInfo]:
    """Query and key infos of each way attention is used (keys None: self-attention)."""
    if kind == "plain":
        s = SequenceInfo.from_offset(2, 11)
        return s, s
    if kind == "packed":
        s = SequenceInfo.from_cu_seqlens([0, 5, 6, 13])
        return s, s
    if kind == "left_padded":
        s = SequenceInfo.from_padding_mask(torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 10]))
        return s, s
    if kind == "right_padded":
        s = SequenceInfo.from_padding_mask(torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0, 0, 0], [1] * 10]))
        return s, s
    if kind == "decode":  # 3 new queries after 17 cached keys of a left-padded batch
        full = SequenceInfo.from_padding_mask(torch.tensor([[0, 0] + [1] * 18, [1] * 20]))
        return SequenceInfo.from_checked(full.positions[:, 17:], None, full.valid[:, 17:]), full
    if kind == "offset":  # one step at a far position (a long cache)
        return SequenceInfo.from_offset(2, 1, 8190), SequenceInfo.from_offset(2, 8191)
    if kind == "cross":  # keys at other positions than the queries (bidirectional only)
        return SequenceInfo.from_offset(2, 4, 6), SequenceInfo.from_offset(1, 7)
    raise AssertionError(kind)


KINDS = ("plain", "packed", "left_padded", "right_padded", "decode", "offset")
LOCAL = [dict(window=1), dict(window=3), dict(window=50), dict(chunk=1), dict(chunk=4), dict(chunk=4096),
         dict(window=3, chunk=4)]
IDS = [",".join(f"{k}={v}" for k, v in d.items()) for d in LOCAL]


def _mod_grid(mask: AttentionMask) -> torch.Tensor:
    """mask_mod evaluated on every (b, i, j), broadcasting tensors as flex's vmap does not."""
    mod = mask.mask_mod()
    B = mask.q_seq.positions.shape[0]
    b = torch.arange(B)[:, None, None, None]
    i = torch.arange(mask.tq)[None, None, :, None]
    j = torch.arange(mask.tk)[None, None, None, :]
    return mod(b, torch.zeros((), dtype=torch.long), i, j).expand(B, 1, mask.tq, mask.tk)


@pytest.mark.parametrize("local", LOCAL, ids=IDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("kind", KINDS + ("cross",))
def test_dense_and_mask_mod_match_the_loop(kind, causal, local):
    if kind == "cross" and causal:
        pytest.skip("causal cross-attention at unrelated positions is not a use")
    q_seq, k_seq = _seqs(kind)
    mask = AttentionMask.build(q_seq, k_seq, causal=causal, **local)
    ref = reference_mask(q_seq, k_seq, causal, **local)
    dense = mask.dense()
    if dense is None:  # a window longer than the keys, bidirectional, no padding: nothing hidden
        assert mask.is_full and mask.mask_mod() is None and bool(ref.all())
        return
    assert torch.equal(dense.expand_as(ref), ref)
    assert torch.equal(_mod_grid(mask), ref)


def test_block_mask_skips_exactly_the_hidden_blocks():
    """The BlockMask built from mask_mod: a block is computed iff the loop shows any visible pair in it."""
    T = 300
    s = SequenceInfo.from_offset(1, T)
    for local in (dict(window=64), dict(chunk=100)):
        bm = AttentionMask.build(s, causal=True, **local).block_mask(block_size=32)
        ref = reference_mask(s, s, True, **local)[0, 0]
        nb = -(-T // 32)
        want = torch.zeros(nb, nb, dtype=torch.bool)
        for a in range(nb):
            for c in range(nb):
                want[a, c] = ref[a * 32:(a + 1) * 32, c * 32:(c + 1) * 32].any()
        got = bm.to_dense()[0, 0].bool()[:nb, :nb]
        assert torch.equal(got, want), local


def test_a_window_hiding_nothing_keeps_the_plain_paths():
    """A window of at least max(Tq, Tk) keys changes nothing: is_causal (plain_causal) stays;
    one key less and every shortcut is off. A chunk always applies."""
    s = SequenceInfo.from_offset(2, 8)
    assert AttentionMask.build(s, causal=True, window=8).plain_causal
    assert AttentionMask.build(s, causal=False, window=8).is_full
    for local in (dict(window=7), dict(chunk=8)):
        m = AttentionMask.build(s, causal=True, **local)
        assert not m.plain_causal and not m.causal_only and not m.is_full


@pytest.mark.parametrize("bad,msg", [
    (dict(window=0), r"window must be >= 1, got 0"),
    (dict(chunk=-4), r"chunk must be >= 1, got -4"),
    (dict(window=2.0), r"window must be an int"),
    (dict(chunk=True), r"chunk must be an int"),
])
def test_bad_sizes_are_refused(bad, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        AttentionMask.build(SequenceInfo.from_offset(1, 4), causal=True, **bad)


# ---- transformers' own mask functions (the parity target) -----------------------------------------
def test_sliding_window_matches_transformers():
    """transformers' ``sliding_window_causal_mask_function`` on cache positions is our window
    (w keys counting the query), for a prompt and for decoding steps past the window."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    w, T = 4, 12
    hf = sliding_window_causal_mask_function(w)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    want = hf(0, 0, i, j)  # (T, T)
    s = SequenceInfo.from_offset(1, T)
    assert torch.equal(AttentionMask.build(s, causal=True, window=w).dense()[0, 0], want)
    # A decoding step: query T-1 against keys 0..T-1.
    step = AttentionMask.build(SequenceInfo.from_offset(1, 1, T - 1), s, causal=True, window=w)
    assert torch.equal(step.dense()[0, 0, 0], want[-1])


def test_chunked_matches_transformers_with_left_padding():
    """transformers' ``chunked_causal_mask_function`` (chunks counted from each row's first real
    token by subtracting its left padding) equals ours on positions, at every valid pair."""
    from transformers.masking_utils import chunked_causal_mask_function

    c = 3
    valid = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 10], dtype=torch.bool)
    left = (valid.long().cumsum(-1) == 0).sum(-1)
    hf = chunked_causal_mask_function(c, left)
    T = valid.shape[1]
    b, i, j = torch.arange(2)[:, None, None], torch.arange(T)[None, :, None], torch.arange(T)[None, None, :]
    want = hf(b, 0, i, j) & valid[:, None, :]  # (B, T, T) with padding keys hidden, as HF's padding mask does
    got = AttentionMask.build(SequenceInfo.from_padding_mask(valid), causal=True, chunk=c).dense()[:, 0]
    rows = valid  # padding query rows see everything in posenc (their output is ignored)
    assert torch.equal(got[rows], want[rows])


# ---- every leaf ---------------------------------------------------------------------------------
def _first(flag: str, params: bool | None = None) -> str:
    """The first registered encoding with capability ``flag`` (and with / without parameters)."""
    for name in posenc.list_encodings():
        enc = posenc.build(name, d_model=H * D, num_heads=H)
        has_params = any(True for _ in enc.parameters())
        if getattr(enc, flag) and not enc.has_value_terms and (params is None or params == has_params):
            return name
    raise AssertionError(f"no registered encoding has {flag}")


def _call(name: str | None, kind: str, local: dict, grad: bool):
    q_seq, k_seq = _seqs(kind)
    mask = AttentionMask.build(q_seq, k_seq, causal=True, **local)
    g = torch.Generator().manual_seed(3)
    B = q_seq.positions.shape[0]
    mk = lambda t: torch.randn(B, H, t, D, generator=g, dtype=F64).requires_grad_(grad)  # noqa: E731
    q, k, v = mk(mask.tq), mk(mask.tk), mk(mask.tk)
    if name is None:
        return q, k, v, mask, LayerTerms(q_seq.positions, k_seq.positions)
    enc = posenc.build(name, d_model=H * D, num_heads=H).to(F64)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=F64))
    q_pos, k_pos = q_seq.positions, k_seq.positions
    bias = SharedBias(enc.logit_bias(), mask) if enc.has_bias else None
    terms = enc.terms(q, k, enc.prepare(q_pos, k_pos), None) if enc.has_terms else []
    return q, k, v, mask, LayerTerms.of(q_pos, k_pos, bias, terms)


def _slow(q, k, v, mask, terms, scale=0.3):
    """softmax(q·kᵀ·scale + terms, the loop's mask)·v, written out."""
    ref = reference_mask(mask.q_seq, mask.k_seq, True, mask.window, mask.chunk)
    logits = q @ k.transpose(-1, -2) * scale
    extra = terms.dense_logits()
    if extra is not None:
        logits = logits + extra
    return torch.softmax(logits.masked_fill(~ref, float("-inf")), -1) @ v


# (leaf, impl, capability, autograd): the leaves a local mask can take
LEAF_CASES = [
    (Leaf.SDPA_MASK, "sdpa", None, True),
    (Leaf.SDPA_BIAS, "sdpa", "fixed_bias", True),
    (Leaf.FUSED, "sdpa", "learned_bias", True),
    (Leaf.FUSED, "sdpa", "has_terms", True),
    (Leaf.FLEX, "flex", "fixed_bias", False),
    (Leaf.FLEX, "flex", "has_terms", False),
    (Leaf.FLEX, "flex", None, False),
]


def _capability(c):
    if c is None:
        return None
    return {"fixed_bias": lambda: _first("has_bias", params=False),
            "learned_bias": lambda: _first("has_bias", params=True)}.get(c, lambda: _first(c))()


@pytest.mark.parametrize("local", [dict(window=3), dict(chunk=4)], ids=["window=3", "chunk=4"])
@pytest.mark.parametrize("kind", ["plain", "packed", "left_padded"])
@pytest.mark.parametrize("leaf,impl,capability,grad", LEAF_CASES,
                         ids=[f"{c[0].name}-{c[1]}-{c[2]}" for c in LEAF_CASES])
def test_leaf_is_planned_and_equals_eager_and_the_loop(leaf, impl, capability, grad, kind, local):
    q, k, v, mask, terms = _call(_capability(capability), kind, local, grad)
    with torch.set_grad_enabled(grad):
        p = plan(impl, q, k, v, mask, terms)
        assert p.leaf is leaf, p
        got = LEAVES[p.leaf](q, k, v, scale=0.3, mask=mask, terms=terms)
        want = LEAVES[Leaf.EAGER](q, k, v, scale=0.3, mask=mask, terms=terms)
        slow = _slow(q, k, v, mask, terms)
    torch.testing.assert_close(want, slow, **TOL)
    torch.testing.assert_close(got, want, **TOL)
    if grad:
        assert_same_grads(got, want, (q, k, v), **TOL)


def test_decoding_step_with_terms_takes_eager_and_equals_the_loop():
    """A decoding step without autograd takes the eager composition: with a window it is the loop's."""
    q, k, v, mask, terms = _call(_first("has_terms"), "decode", dict(window=4), False)
    with torch.no_grad():
        assert plan("sdpa", q, k, v, mask, terms).leaf is Leaf.EAGER
        torch.testing.assert_close(LEAVES[Leaf.EAGER](q, k, v, scale=0.3, mask=mask, terms=terms),
                                   _slow(q, k, v, mask, terms), **TOL)


@pytest.mark.parametrize("local", [dict(window=50), dict(chunk=64)], ids=["window=50", "chunk=64"])
@pytest.mark.parametrize("kind", ["plain", "prefill", "offset"])
def test_local_row_blocks_equal_the_loop_forward_and_backward(kind, local):
    """The local leaf (row blocks over the keys a window or chunk reaches, planned past 128
    queries) against the loop's mask, forward and backward: from position 0, after 70 cached
    keys, and from position 1000 (chunk boundaries off the stream's)."""
    from posenc.backends.sdpa import LOCAL_ROWS

    T = LOCAL_ROWS * 2 + 37
    start, cached = {"plain": (0, 0), "prefill": (0, 70), "offset": (1000, 70)}[kind]
    q_seq = SequenceInfo.from_offset(1, T - cached, start + cached)
    k_seq = SequenceInfo.from_offset(1, T, start)
    mask = AttentionMask.build(q_seq, k_seq, causal=True, **local)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, H, mask.tq, D, generator=g, dtype=F64, requires_grad=True)
    k, v = (torch.randn(1, H, T, D, generator=g, dtype=F64, requires_grad=True) for _ in range(2))
    terms = LayerTerms(q_seq.positions, k_seq.positions)
    assert plan("sdpa", q, k, v, mask, terms).leaf is Leaf.SDPA_LOCAL_ROWS
    got = LEAVES[Leaf.SDPA_LOCAL_ROWS](q, k, v, scale=0.3, mask=mask, terms=terms)
    want = _slow(q, k, v, mask, terms)
    torch.testing.assert_close(got, want, **TOL)
    w_out = torch.randn(got.shape, generator=g, dtype=F64)
    for a, b in zip(torch.autograd.grad((got * w_out).sum(), (q, k, v)), torch.autograd.grad((want * w_out).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, **TOL)


def test_local_rows_need_a_mask_without_empty_rows_or_mixed_positions():
    """Padding, documents, both a window and chunks, or chunks over positions that are not one
    contiguous row keep the bool mask (the rows-that-see-nothing rule needs every key; chunk
    boundaries must be stream indices)."""
    T = 300
    plain, padded = SequenceInfo.from_offset(1, T), SequenceInfo.from_padding_mask(torch.ones(1, T, dtype=torch.bool))
    gaps = SequenceInfo(torch.arange(T)[None] * 2)
    two_rows = SequenceInfo(torch.stack([torch.arange(T), torch.arange(T) + 5]))
    assert AttentionMask.build(plain, causal=True, window=50).local_rows
    assert AttentionMask.build(plain, causal=True, chunk=50).local_rows
    for seq, local in ((padded, dict(window=50)), (padded, dict(chunk=50)), (plain, dict(window=50, chunk=64)),
                       (gaps, dict(chunk=50)), (two_rows, dict(chunk=50)),
                       (SequenceInfo.from_cu_seqlens([0, 100, T]), dict(window=50))):
        assert not AttentionMask.build(seq, causal=True, **local).local_rows, (seq, local)
    assert not AttentionMask.build(plain, causal=False, window=50).local_rows
