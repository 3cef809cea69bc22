"""shaw: the value term sum_j alpha_ij a^V_ij against a slow loop over Shaw et al.'s formula
(tests/content_reference.py; the key term is in test_relative_content.py's shared tables); the
hooks it declares follow use_key / use_value."""

from __future__ import annotations

import pytest
import torch

from posenc import build

from content_reference import F64, SETTINGS, TOL, make, ref_value_term


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_shaw_value_term_matches_reference(setting):
    enc = make("shaw")
    q_pos, k_pos = SETTINGS[setting]
    g = torch.Generator().manual_seed(8)
    probs = torch.rand(2, 2, q_pos.shape[1], k_pos.shape[1], generator=g, dtype=F64).softmax(-1).requires_grad_(True)
    v = torch.zeros(2, 2, k_pos.shape[1], 4, dtype=F64)
    fast = enc.output(probs, v, q_pos, k_pos)
    slow = ref_value_term(enc, probs, q_pos, k_pos)
    torch.testing.assert_close(fast, slow, **TOL)
    w = torch.randn(fast.shape, generator=g, dtype=F64)
    params = [probs, enc.value_table]
    for a, b in zip(torch.autograd.grad((fast * w).sum(), params), torch.autograd.grad((slow * w).sum(), params)):
        torch.testing.assert_close(a, b, **TOL)


def test_shaw_capabilities_follow_config():
    key_only = build("shaw", d_model=8, num_heads=2, use_value=False)
    value_only = build("shaw", d_model=8, num_heads=2, use_key=False)
    assert key_only.has_terms and not key_only.has_value_terms
    assert value_only.has_value_terms and not value_only.has_terms
    both = build("shaw", d_model=8, num_heads=2)
    assert both.has_terms and both.has_value_terms
    pos = torch.arange(4)[None]
    q = torch.randn(1, 2, 4, 4)
    assert [type(t).__name__ for t in key_only.terms(q, q, key_only.prepare(pos, pos), None)] == ["TableTerm"]
    assert [type(t).__name__ for t in value_only.terms(q, q, value_only.prepare(pos, pos), None)] == ["ValueTerm"]
