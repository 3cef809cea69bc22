"""The slow reference every content-independent bias is checked against: loops over (b, h, i, j)
that spell out a formula, in float64, forward and backward, on positions with an offset row,
gaps (packing, padding, a cache), Tq != Tk and keys after queries."""

from __future__ import annotations

import torch

from posenc import build


# Arbitrary positions: an offset row, a row with gaps (packing/padding/cache), Tq != Tk, and
# keys after queries (bidirectional use).
Q_POS = torch.tensor([[5, 6, 7, 8], [0, 3, 9, 20]])
K_POS = torch.tensor([[0, 1, 2, 3, 9, 300], [1, 2, 3, 4, 5, 160]])
H = 3


def bias64(name: str, **config) -> tuple[torch.nn.Module, torch.Tensor]:
    """A float64 encoding ``name`` with perturbed parameters, and its bias on Q_POS x K_POS."""
    torch.manual_seed(0)
    enc = build(name, d_model=H * 4, num_heads=H, **config).double()
    with torch.no_grad():  # non-trivial values
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return enc, enc.score_bias(Q_POS, K_POS)


def check_against_reference(enc, bias, ref_fn):
    """Forward to 1e-10 and gradients w.r.t. every parameter, against ``ref_fn(b, h, i, j)``."""
    B, Tq, Tk = Q_POS.shape[0], Q_POS.shape[1], K_POS.shape[1]
    assert bias.dtype == torch.float64 and bias.shape[1:] == (H, Tq, Tk)
    ref = torch.stack(
        [
            torch.stack(
                [
                    torch.stack([torch.stack([ref_fn(b, h, i, j) for j in range(Tk)]) for i in range(Tq)])
                    for h in range(H)
                ]
            )
            for b in range(B)
        ]
    )  # (B, H, Tq, Tk)
    torch.testing.assert_close(bias.expand_as(ref), ref, atol=1e-10, rtol=1e-10)
    params = list(enc.parameters())
    upstream = torch.randn(ref.shape, dtype=torch.float64)
    got = torch.autograd.grad((bias * upstream).sum(), params, allow_unused=True)
    want = torch.autograd.grad((ref * upstream).sum(), params, allow_unused=True)
    for p, g, w in zip(params, got, want):
        g = torch.zeros_like(p) if g is None else g
        w = torch.zeros_like(p) if w is None else w
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)
