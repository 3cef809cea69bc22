"""randomized_positions (Ruoss et al. 2023): each document gets a sorted uniform sample of
distinct positions from [0, L); structure (documents, padding, order) is kept, and a model
given them treats a packed batch as its documents alone."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from helpers import tiny_model
from posenc import SequenceInfo
from posenc.absolute.randomized import randomized_positions


def _docs(seq: SequenceInfo) -> list[torch.Tensor]:
    """The positions of each (row, document), padding left out."""
    out = []
    for b in range(seq.positions.shape[0]):
        valid = torch.ones(seq.positions.shape[1], dtype=torch.bool) if seq.valid is None else seq.valid[b]
        seg = torch.zeros_like(seq.positions[b]) if seq.segment_ids is None else seq.segment_ids[b]
        for s in seg[valid].unique():
            out.append(seq.positions[b][valid & (seg == s)])
    return out


SEQS = {
    "plain": SequenceInfo.from_offset(3, 6),
    "packed": SequenceInfo.from_cu_seqlens([0, 4, 5, 11]),
    "left_padded": SequenceInfo.from_padding_mask(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)),
}


@pytest.mark.parametrize("kind", list(SEQS))
def test_each_document_gets_sorted_distinct_positions_below_L_and_structure_is_kept(kind):
    seq = SEQS[kind]
    out = randomized_positions(seq, 50, generator=torch.Generator().manual_seed(0))
    assert out.segment_ids is seq.segment_ids and out.valid is seq.valid
    before, after = _docs(seq), _docs(out)
    assert len(after) == len(before) > 0
    for old, new in zip(before, after):
        assert len(new) == len(old) and (new[1:] > new[:-1]).all() and 0 <= int(new.min()) and int(new.max()) < 50
    if seq.valid is not None:
        assert (out.positions[~seq.valid] == 0).all()


def test_subsets_are_uniform():
    """Every 2-subset of [0, 5) is drawn equally often (10 subsets, 20000 draws: 2000 each, sd ~42)."""
    seq = SequenceInfo.from_offset(1, 2)
    g = torch.Generator().manual_seed(1)
    counts = {s: 0 for s in itertools.combinations(range(5), 2)}
    for _ in range(100):
        batch = SequenceInfo.from_offset(200, 2)
        for row in randomized_positions(batch, 5, generator=g).positions.tolist():
            counts[tuple(row)] += 1
    assert set(counts) == set(itertools.combinations(range(5), 2))
    assert all(abs(c - 2000) < 5 * math.sqrt(2000 * 0.9) for c in counts.values()), counts
    assert seq.positions.tolist() == [[0, 1]]


def test_full_range_gives_the_plain_positions():
    seq = SequenceInfo.from_cu_seqlens([0, 4, 8])
    out = randomized_positions(seq, 4)
    assert out.positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]


def test_same_generator_seed_same_draw():
    seq = SEQS["packed"]
    a = randomized_positions(seq, 1000, generator=torch.Generator().manual_seed(3))
    b = randomized_positions(seq, 1000, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.positions, b.positions)


@pytest.mark.parametrize("name", ["sinusoidal", "rope", "alibi"])
def test_packed_randomized_batch_equals_its_documents_alone(name):
    model = tiny_model(name)
    seq = randomized_positions(SequenceInfo.from_cu_seqlens([0, 4, 9]), 64, generator=torch.Generator().manual_seed(4))
    tokens = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        packed = model(tokens, seq)
        alone = [model(tokens[:, a:b], SequenceInfo(seq.positions[:, a:b])) for a, b in ((0, 4), (4, 9))]
    torch.testing.assert_close(packed, torch.cat(alone, 1), atol=1e-5, rtol=1e-5)


def test_refuses_bad_inputs_by_name():
    seq = SequenceInfo.from_offset(1, 6)
    with pytest.raises(ValueError, match=r"^max_length must be > every position .* 6 positions\), got 5$"):
        randomized_positions(seq, 5)
    with pytest.raises(ValueError, match=r"^max_length must be in \[1, 16777216\], got 0$"):
        randomized_positions(seq, 0)
    with pytest.raises(TypeError, match="max_length must be an int"):
        randomized_positions(seq, 10.0)
    with pytest.raises(TypeError, match="seq must be a SequenceInfo"):
        randomized_positions(torch.arange(4)[None], 10)


def test_refuses_multi_axis_positions():
    """A patch grid's (row, column) axes cannot be resampled as 1-D positions: refused, not dropped."""
    grid = SequenceInfo.from_grid(3, 4)
    assert grid.axes is not None
    with pytest.raises(ValueError, match=r"^seq\.axes must be None: randomized_positions samples 1-D positions"):
        randomized_positions(grid, 100)
