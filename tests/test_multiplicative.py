"""Multiplicative absolute table: x * P[pos] against a loop, init near 1, extension, errors."""

from __future__ import annotations

import pytest
import torch

from posenc import SequenceInfo, build


def test_matches_loop_reference_on_packed_positions():
    enc = build("multiplicative", d_model=6, num_heads=2, max_len=16, init_std=0.3)
    x = torch.randn(1, 9, 6)
    seq = SequenceInfo.from_cu_seqlens([0, 4, 9])
    out = enc.embed(x, seq)
    W = enc.weight.detach()
    for t in range(9):
        p = seq.positions[0, t].item()
        for c in range(6):
            assert out[0, t, c].item() == pytest.approx(x[0, t, c].item() * W[p, c].item(), rel=1e-6)


def test_init_near_one_and_extension_draws_near_one():
    enc = build("multiplicative", d_model=64, num_heads=2, max_len=500, init_std=0.02)
    assert abs(enc.weight.mean().item() - 1.0) < 2e-3 and abs(enc.weight.std().item() - 0.02) < 2e-3
    enc.extend(1000, method="random")
    new = enc.weight[500:].detach()
    assert abs(new.mean().item() - 1.0) < 2e-3 and abs(new.std().item() - 0.02) < 2e-3
    assert type(enc.config).__name__ == "MultiplicativeConfig" and enc.config.max_len == 1000


def test_errors():
    enc = build("multiplicative", d_model=4, num_heads=1, max_len=4)
    with pytest.raises(ValueError, match="multiplicative table of 4 rows"):
        enc.embed(torch.zeros(1, 5, 4), SequenceInfo.from_offset(1, 5))
    with pytest.raises(ValueError, match="max_len"):
        build("multiplicative", d_model=4, num_heads=1, max_len=0)
    with pytest.raises(ValueError, match="init_std"):
        build("multiplicative", d_model=4, num_heads=1, init_std=-1.0)
