"""Depthwise convolutional encoding: loop reference, per-document zero padding, position leak."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc import SequenceInfo, build
from helpers import assert_embed_decodes_incrementally


def _enc(**cfg):
    torch.manual_seed(0)
    enc = build("convolutional", d_model=6, num_heads=2, **cfg).double()
    with torch.no_grad():
        if enc.bias is not None:
            enc.bias.normal_()
    return enc


def _reference(enc, x, doc, valid):
    """y[b,t,c] = x + bias + sum_j w[c,j] x[b, t-left+j, c] over same-document valid taps (loops)."""
    B, T, C = x.shape
    K, left = enc.weight.shape[1], enc.left
    y = x.clone()
    for b in range(B):
        for t in range(T):
            for c in range(C):
                acc = 0.0 if enc.bias is None else enc.bias[c].item()
                for j in range(K):
                    s = t - left + j
                    if 0 <= s < T and valid[b][s] and doc[b][s] == doc[b][t]:
                        acc += enc.weight[c, j].item() * x[b, s, c].item()
                y[b, t, c] += acc
    return y


@pytest.mark.parametrize("causal,k", [(True, 3), (True, 4), (False, 3), (False, 5)])
def test_packed_and_padded_match_loop_reference(causal, k):
    enc = _enc(kernel_size=k, causal=causal)
    x = torch.randn(1, 12, 6, dtype=torch.float64)
    out = enc.embed(x, SequenceInfo.from_cu_seqlens([0, 2, 7, 12]))
    doc = [[0] * 2 + [1] * 5 + [2] * 5]
    torch.testing.assert_close(out, _reference(enc, x, doc, [[True] * 12]))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 8 + [0] * 4], dtype=torch.bool)
    x2 = torch.randn(2, 12, 6, dtype=torch.float64)
    out2 = enc.embed(x2, SequenceInfo.from_padding_mask(mask))
    ref2 = _reference(enc, x2, [[0] * 12, [0] * 12], mask.tolist())
    torch.testing.assert_close(out2[mask], ref2[mask])


@pytest.mark.parametrize("causal", [True, False])
def test_single_sequence_matches_torch_conv1d(causal):
    enc = _enc(kernel_size=5, causal=causal)
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    out = enc.embed(x, SequenceInfo.from_offset(2, 9))
    pad = (4, 0) if causal else (2, 2)
    conv = F.conv1d(F.pad(x.transpose(1, 2), pad), enc.weight[:, None, :], enc.bias, groups=6)  # (B, C, T)
    torch.testing.assert_close(out, x + conv.transpose(1, 2))


def test_zero_padding_leaks_absolute_position():
    # The same token repeated: the first K-1 outputs see zeros on their left and differ from each
    # other; from position K-1 on every tap sees the token and the outputs are identical.
    k = 4
    enc = _enc(kernel_size=k)
    v = torch.randn(6, dtype=torch.float64)
    out = enc.embed(v.expand(1, 10, 6).clone(), SequenceInfo.from_offset(1, 10))[0]  # (10, 6)
    for t in range(k - 1):
        for s in range(t + 1, 10):
            assert not torch.allclose(out[t], out[s])
    for t in range(k, 10):
        torch.testing.assert_close(out[t], out[k - 1])


def test_state_decodes_incrementally_and_centered_refuses_a_cache():
    enc = _enc(kernel_size=4)
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    assert_embed_decodes_incrementally(enc, x, prefix=2)
    with pytest.raises(ValueError, match="causal=True"):
        _enc(causal=False).embed(x, SequenceInfo.from_offset(2, 9), {})


def test_bad_config():
    with pytest.raises(ValueError, match="kernel_size"):
        build("convolutional", d_model=6, num_heads=2, kernel_size=0)
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        build("convolutional", d_model=6, num_heads=2, kernel_size=4, causal=False)
    with pytest.raises(TypeError, match="kernel_size"):
        build("convolutional", d_model=6, num_heads=2, kernel_size=3.0)
    with pytest.raises(TypeError, match="causal"):
        build("convolutional", d_model=6, num_heads=2, causal="yes")
