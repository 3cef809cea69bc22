"""The two RoPE layouts (posenc.rotary.layout): converting a checkpoint's q/k projections
between them leaves the attention scores unchanged, and bad shapes are refused."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.rotary import convert_qk_layout


@pytest.mark.parametrize("rotary_dim", [None, 8])
@pytest.mark.parametrize("bias", [False, True])
def test_layout_conversion_preserves_scores(rotary_dim, bias):
    # A checkpoint trained with interleaved RoPE and weights W gives the same attention
    # logits as half-split RoPE with the permuted W (and back).
    H, D, C, T = 2, 16, 32, 11
    lin_q, lin_k = torch.nn.Linear(C, H * D, bias=bias).double(), torch.nn.Linear(C, H * D, bias=bias).double()
    x = torch.randn(1, T, C, dtype=torch.float64)
    pos = torch.randint(0, 3000, (1, T))

    def logits(layout, wq, bq, wk, bk):
        rope = posenc.build("rope", d_model=C, num_heads=H, layout=layout, rotary_dim=rotary_dim)
        q = torch.nn.functional.linear(x, wq, bq).view(1, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = torch.nn.functional.linear(x, wk, bk).view(1, T, H, D).transpose(1, 2)
        q, k = rope.rotate(q, k, pos, pos)
        return q @ k.transpose(-1, -2)

    conv = lambda t: None if t is None else convert_qk_layout(t, H, D, rotary_dim, to="half")  # noqa: E731
    wq, bq, wk, bk = lin_q.weight, lin_q.bias, lin_k.weight, lin_k.bias
    ref = logits("interleaved", wq, bq, wk, bk)
    torch.testing.assert_close(logits("half", conv(wq), conv(bq), conv(wk), conv(bk)), ref, atol=1e-9, rtol=1e-9)
    back = lambda t: None if t is None else convert_qk_layout(conv(t), H, D, rotary_dim, to="interleaved")  # noqa: E731
    assert torch.equal(back(wq), wq)
    # The permutation itself: interleaved channel 2j goes to half channel j.
    w = torch.arange(H * D, dtype=torch.float64)[:, None]
    r = D if rotary_dim is None else rotary_dim
    perm = convert_qk_layout(w, H, D, rotary_dim)[:D, 0].long().tolist()
    assert perm == list(range(0, r, 2)) + list(range(1, r, 2)) + list(range(r, D))


def test_convert_qk_layout_rejects_bad_shapes():
    with pytest.raises(ValueError, match="rows"):
        convert_qk_layout(torch.zeros(10, 4), 2, 4)
    with pytest.raises(ValueError, match="rotary_dim must be <= head_dim"):
        convert_qk_layout(torch.zeros(8, 4), 2, 4, rotary_dim=6)
    with pytest.raises(ValueError, match="even"):
        convert_qk_layout(torch.zeros(8, 4), 2, 4, rotary_dim=3)
    with pytest.raises(ValueError, match="'half', 'interleaved'"):
        convert_qk_layout(torch.zeros(8, 4), 2, 4, to="neox")
