"""masks.py: one forward's AttentionMask (causal, documents, padding) against a loop over (b, i, j)."""

from __future__ import annotations

import pytest
import torch

from posenc import AttentionContext, SequenceInfo


def reference_mask(q_seq, k_seq, q_index, k_index, causal):
    """Loop over (b, i, j): who may attend to whom, spelled out."""
    B, Tq = q_seq.positions.shape
    Tk = k_seq.positions.shape[1]
    m = torch.zeros(B, 1, Tq, Tk, dtype=torch.bool)
    for b in range(B):
        for i in range(Tq):
            for j in range(Tk):
                ok = True
                if causal and k_index[j] > q_index[i]:
                    ok = False
                if k_seq.valid is not None and not k_seq.valid[b, j]:
                    ok = False
                if q_seq.segment_ids is not None and q_seq.segment_ids[b, i] != k_seq.segment_ids[b, j]:
                    ok = False
                m[b, 0, i, j] = ok
            if not m[b, 0, i].any():
                m[b, 0, i] = True
    return m


@pytest.mark.parametrize("causal", [True, False])
def test_mask_matches_reference(causal):
    packed = SequenceInfo.from_cu_seqlens([0, 2, 5, 6])
    padded = SequenceInfo.from_padding_mask(torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]))
    for seq in (packed, padded):
        ctx = AttentionContext.build(seq, causal=causal)
        T = seq.positions.shape[1]
        ref = reference_mask(seq, seq, torch.arange(T), torch.arange(T), causal)
        assert torch.equal(ctx.mask.dense().expand_as(ref), ref)
