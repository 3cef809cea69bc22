"""transformer_xl: both forms (angles, table) against the slow loop over Dai et al.'s formula
(tests/content_reference.py); segment memory spans memory plus segment and is detached; the
kept rows follow any distance range."""

from __future__ import annotations

import pytest
import torch

from posenc import SequenceInfo, build

from content_reference import F64, SETTINGS, TOL, make, ref_scores
from helpers import tiny_model


@pytest.mark.parametrize("angles", [True, False], ids=["angle_form", "table_form"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_transformer_xl_both_forms_match_reference(setting, angles, monkeypatch):
    """Both forms prepare() chooses between by cost (angle-difference identities as a DenseTerm;
    the projected distance table as a TableTerm) against the loop, forward and backward."""
    enc = make("transformer_xl")
    monkeypatch.setattr(enc, "_use_angles", lambda tq, tk: angles)
    q_pos, k_pos = SETTINGS[setting]
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 2, q_pos.shape[1], 4, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(2, 2, k_pos.shape[1], 4, generator=g, dtype=F64, requires_grad=True)
    state = enc.prepare(q_pos, k_pos)
    kinds = {type(t).__name__ for t in enc.terms(q, k, state, None)}
    assert kinds == ({"DenseTerm", "TableTerm"} if angles else {"TableTerm"})
    scale = enc.attention_scale(4)
    fast = enc.score(q, k, q_pos, k_pos, state=state)
    slow = ref_scores(enc, None, q, k, q_pos, k_pos, scale)
    torch.testing.assert_close(fast, slow, **TOL)
    w = torch.randn(fast.shape, generator=g, dtype=F64)
    params = [q, k, *enc.parameters()]
    for a, b in zip(torch.autograd.grad((fast * w).sum(), params), torch.autograd.grad((slow * w).sum(), params)):
        torch.testing.assert_close(a, b, **TOL)


def test_transformer_xl_memory_spans_memory_plus_segment():
    """Segment 2 with a 4-token memory == a forward over the last 4 + 4 tokens (one layer)."""
    model = tiny_model("transformer_xl", n_layer=1)
    tokens = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        cache = model.new_cache(max_length=4, detach=True)
        model(tokens[:, :6], cache=cache)
        assert cache.layers[0].k.shape[2] == 4
        seg2 = model(tokens[:, 6:], cache=cache)
        ref = model(tokens[:, 2:], SequenceInfo.from_offset(2, 8, offset=2))[:, 4:]
    torch.testing.assert_close(seg2, ref, atol=1e-5, rtol=1e-5)


def test_transformer_xl_memory_is_detached():
    model = tiny_model("transformer_xl", n_layer=2).train()
    x = torch.randn(1, 10, 32, requires_grad=True)
    for detach, expect_grad in [(True, False), (False, True)]:
        cache = model.new_cache(max_length=5, detach=detach)
        model(None, inputs_embeds=x[:, :5], cache=cache)
        out = model(None, inputs_embeds=x[:, 5:], cache=cache)
        gx, gu = torch.autograd.grad(out.sum(), [x, model.encodings[0].u], allow_unused=True)
        assert (gx is not None and gx[:, :5].abs().sum() > 0) == expect_grad
        assert gu is not None and gu.abs().sum() > 0  # the encoding still learns from segment 2


def test_transformer_xl_kept_rows_follow_any_distance_range():
    """Transformer-XL's decoding memo keeps W_R R_d in a buffer that grows in place past its
    end (doubling) and is rebuilt when a step reaches distances below its start (positions
    given by the caller may go back): every step's rows equal a fresh projection of exactly
    that step's distances."""
    enc = build("transformer_xl", d_model=16, num_heads=2).double()
    memo: dict = {}
    steps = [(torch.arange(4, 6), torch.arange(0, 6)),  # distances -1 .. 5: the first buffer
             (torch.tensor([6]), torch.arange(0, 7)),  # 0 .. 6: one row past the end (grows)
             (torch.tensor([13]), torch.arange(0, 14)),  # 0 .. 13: past the doubled capacity (grows again)
             (torch.tensor([0, 1]), torch.arange(-2, 9)),  # -8 .. 3: below the start (rebuilt)
             (torch.tensor([14]), torch.arange(0, 15))]  # 0 .. 14: past the end again
    with torch.no_grad():
        for q_pos, k_pos in steps:
            state = enc.prepare_cached(q_pos[None], k_pos[None], memo)
            lo, hi = int(q_pos.min() - k_pos.max()), int(q_pos.max() - k_pos.min())
            assert (state.bucket.lo, state.bucket.hi) == (lo, hi)
            torch.testing.assert_close(state.keys, enc.relative_keys(torch.arange(lo, hi + 1)), rtol=0, atol=1e-14)
    lo0, hi0, buf = memo["keys"]
    assert (lo0, hi0) == (-8, 14) and buf.shape[-1] >= hi0 - lo0 + 1
