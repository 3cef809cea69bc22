"""Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers", ACL 2023).

Not an encoding but a way to choose the positions any encoding is given. A model trained
on sequences of length n <= N only ever sees positions 0 .. N - 1, so at test length M > N
its encoding meets positions it never saw. The paper instead gives each training sequence
of n tokens a random ordered subset of a much larger range [0, L) (L >= M):

    positions = sort(sample n distinct values from {0, ..., L - 1}),

so every position up to L - 1 occurs in training, in the right order, and only the order and
the gaps (never the exact values) carry the sequence structure. Any encoding reading
positions takes it: sinusoidal and learned tables (sized to L), RoPE, ALiBi, T5, ...

:func:`randomized_positions` turns a batch's :class:`~posenc.positions.SequenceInfo` into one
with such positions: each document of each row (a packed row holds several) gets its own
sorted sample, the token at position p taking the p-th smallest value of it, so documents,
padding (position 0) and the order inside each document are kept. Pass the result to the
model in place of the original info, for training forwards; decoding with a KV cache
continues positions one by one and is not covered.

Shapes: positions (B, T).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import check_int
from ..positions import SequenceInfo

__all__ = ["randomized_positions", "MAX_RANGE"]

MAX_RANGE = 2**24  # L: one random key per value of the range per document is drawn
_KEYS_PER_CHUNK = 2**24  # random keys held at once (64 MiB): documents are sampled in chunks


def randomized_positions(seq: SequenceInfo, max_length: int, *, generator: torch.Generator | None = None) -> SequenceInfo:
    """``seq`` with each document's positions 0 .. n - 1 replaced by a sorted random sample of n
    distinct values from [0, max_length). Segment ids and padding are kept; padding stays at 0.

    ``max_length`` is L, in [1, 2^24]; a document whose largest position is L or more is a
    ``ValueError`` naming it (L must exceed every position). ``generator``: a CPU
    ``torch.Generator`` for reproducible draws (the sampling runs on CPU, the result moves to
    the positions' device). A ``seq`` carrying multi-axis positions (``seq.axes``) is a
    ``ValueError``.
    """
    if not isinstance(seq, SequenceInfo):
        raise TypeError(f"seq must be a SequenceInfo, got {type(seq).__name__}")
    check_int("max_length", max_length, minimum=1, maximum=MAX_RANGE)
    if seq.axes is not None:
        # Ruoss et al. sample 1-D positions; resampling each axis apart would break a patch grid's
        # geometry, and keeping the old axes beside new positions would be two disagreeing orders.
        raise ValueError("seq.axes must be None: randomized_positions samples 1-D positions, and this "
                         "SequenceInfo carries multi-axis positions (M-RoPE, 2-D RoPE)")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    pos = seq.positions.cpu().long()  # (B, T)
    B, T = pos.shape
    if pos.numel() == 0:
        return seq
    valid = torch.ones_like(pos, dtype=torch.bool) if seq.valid is None else seq.valid.cpu()
    longest = int(pos[valid].max()) + 1 if valid.any() else 0
    if longest == 0:
        return seq
    if longest > max_length:
        raise ValueError(f"max_length must be > every position (the sampled range [0, max_length) must hold "
                         f"each document's {longest} positions), got {max_length}")
    # One group per (row, document): its tokens share one sorted sample.
    seg = torch.zeros_like(pos) if seq.segment_ids is None else seq.segment_ids.cpu().long()
    seg = seg - seg.min(dim=1, keepdim=True).values  # (B, T) >= 0
    key = torch.arange(B)[:, None] * (int(seg.max()) + 1) + seg  # (B, T)
    groups, group = torch.unique(key, return_inverse=True)  # group: (B, T) in [0, G)
    G = groups.numel()
    size = torch.zeros(G, dtype=torch.long).scatter_reduce(0, group[valid], pos[valid] + 1, "amax")  # (G,) n per group
    # A uniform n-subset of [0, L): the values with the n smallest of L random keys, sorted.
    chunk = max(1, _KEYS_PER_CHUNK // max_length)
    perm = torch.cat([
        torch.rand(min(chunk, G - g), max_length, generator=generator).topk(longest, dim=1, largest=False).indices
        for g in range(0, G, chunk)
    ])  # (G, n_max), in random order
    column = torch.arange(longest)
    perm = torch.where(column < size[:, None], perm, max_length + column)  # past n: sorts last
    sample = perm.sort(dim=1).values  # (G, n_max): the first n of row g are group g's positions
    new = sample[group, pos.clamp(max=longest - 1)]  # (B, T)
    new = torch.where(valid, new, 0).to(device=seq.positions.device, dtype=seq.positions.dtype)
    return SequenceInfo.from_checked(new, seq.segment_ids, seq.valid)
