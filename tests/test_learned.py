"""Learned absolute table: extension methods against explicit references, and its errors."""

from __future__ import annotations

import pytest
import torch

from posenc import SequenceInfo, build


def _table(n=8, c=6):
    torch.manual_seed(0)
    enc = build("learned", d_model=c, num_heads=2, max_len=n)
    with torch.no_grad():
        enc.weight.normal_()
    return enc


def test_hierarchical_keeps_rows_and_matches_formula():
    enc = _table()
    old = enc.weight.detach().clone()
    n, alpha = old.shape[0], 0.3
    enc.extend(50, method="hierarchical", alpha=alpha)
    new = enc.weight.detach()
    assert new.shape == (50, 6) and enc.max_len == 50 and enc.config.max_len == 50
    assert torch.equal(new[:n], old)  # bitwise
    o = old.double()
    for k in range(n, 50):
        i, j = divmod(k, n)
        u_i = (o[i] - alpha * o[0]) / (1 - alpha)
        u_j = (o[j] - alpha * o[0]) / (1 - alpha)
        torch.testing.assert_close(new[k].double(), alpha * u_i + (1 - alpha) * u_j, atol=1e-6, rtol=0)


def test_interpolate_matches_linear_resampling():
    enc = _table()
    old = enc.weight.detach().clone().double()
    n, m = old.shape[0], 20
    enc.extend(m, method="interpolate")
    new = enc.weight.detach().double()
    for r in range(m):
        s = r * (n - 1) / (m - 1)  # where row r of the new table sits in the old one
        lo = min(int(s), n - 2)
        w = s - lo
        torch.testing.assert_close(new[r], (1 - w) * old[lo] + w * old[lo + 1], atol=1e-6, rtol=0)
    torch.testing.assert_close(new[0], old[0])
    torch.testing.assert_close(new[-1], old[-1])


def test_random_keeps_old_rows_and_draws_new_ones_like_init():
    enc = build("learned", d_model=64, num_heads=2, max_len=4, init_std=0.5)
    old = enc.weight.detach().clone()
    enc.extend(2004, method="random")
    assert torch.equal(enc.weight[:4].detach(), old)
    assert abs(enc.weight[4:].std().item() - 0.5) < 0.01


def test_positions_past_the_end_raise_until_extended():
    enc = _table(n=8)
    x = torch.zeros(1, 10, 6)
    seq = SequenceInfo.from_offset(1, 10)
    with pytest.raises(ValueError, match=r"positions must be in \[0, 7\].*extend"):
        enc.embed(x, seq)
    enc.extend(10, method="hierarchical")
    torch.testing.assert_close(enc.embed(x, seq), enc.weight[:10][None].detach())


def test_extend_rejects_bad_arguments():
    enc = _table(n=4)
    with pytest.raises(ValueError, match="n\\^2"):
        enc.extend(17, method="hierarchical")
    for alpha in (0.0, 1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            enc.extend(8, method="hierarchical", alpha=alpha)
    with pytest.raises(ValueError, match="method"):
        enc.extend(8, method="cubic")
    with pytest.raises(ValueError, match="new_max_len"):
        enc.extend(3)
    with pytest.raises(ValueError, match="interpolate"):
        build("learned", d_model=4, num_heads=1, max_len=1).extend(4, method="interpolate")
    with pytest.raises(ValueError, match="max_len"):
        build("learned", d_model=4, num_heads=1, max_len=0)
    with pytest.raises(ValueError, match="init_std"):
        build("learned", d_model=4, num_heads=1, init_std=0.0)
