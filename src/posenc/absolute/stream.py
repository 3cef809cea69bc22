"""Document boundaries for the stateful embed encodings (recurrent, convolutional).

Encodings that read their neighbours along the token stream (a GRU, a convolution) must not
read across documents of a packed row, nor from padding. Both use one rule:

    a valid token starts a document where its position id is 0, or where its segment id
    differs from the previous token's (the previous token may be the last one of the
    previous KV-cache step, whose segment id the caller passes in).

Shapes: (B, T) per token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..positions import SequenceInfo

__all__ = ["document_starts", "valid_mask"]


def valid_mask(seq: SequenceInfo) -> Tensor:
    """(B, T) bool, True at real tokens (all True when ``seq.valid`` is None)."""
    if seq.valid is not None:
        return seq.valid
    return torch.ones(seq.positions.shape, dtype=torch.bool, device=seq.positions.device)


def document_starts(seq: SequenceInfo, last_segment: Tensor | None = None) -> Tensor:
    """(B, T) bool: True at each valid token that begins a document (see the module docstring).

    ``last_segment`` (B,) is the segment id of the token just before this chunk (KV-cache
    decoding); without it the first token starts a document only if its position is 0.
    """
    start = seq.positions == 0
    seg = seq.segment_ids
    if seg is not None:
        prev = torch.cat([seg[:, :1] if last_segment is None else last_segment[:, None], seg[:, :-1]], dim=1)
        start = start | (seg != prev)
    return start & valid_mask(seq)
