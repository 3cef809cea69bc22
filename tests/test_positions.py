"""positions.py: SequenceInfo and its builders (offsets, padding masks, packed documents), good and bad inputs."""

from __future__ import annotations

import pytest
import torch

from posenc import SequenceInfo


def test_positions_from_offset_scalar_and_per_row():
    s = SequenceInfo.from_offset(2, 3, 5)
    assert s.positions.tolist() == [[5, 6, 7], [5, 6, 7]]
    s = SequenceInfo.from_offset(2, 3, torch.tensor([0, 4]))
    assert s.positions.tolist() == [[0, 1, 2], [4, 5, 6]]


def test_positions_from_padding_mask_left_and_right():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    s = SequenceInfo.from_padding_mask(mask)
    assert s.positions.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0]]
    assert s.valid.tolist() == mask.bool().tolist()


def test_positions_from_cu_seqlens_restart_per_document():
    s = SequenceInfo.from_cu_seqlens([0, 3, 5, 9])
    assert s.positions.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert s.segment_ids.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2]]


@pytest.mark.parametrize(
    "bad, match",
    [([1, 3], "start at 0"), ([0, 3, 3], "strictly increasing"), ([0], ">= 2 entries")],
)


def test_cu_seqlens_bad_inputs(bad, match):
    with pytest.raises(ValueError, match=match):
        SequenceInfo.from_cu_seqlens(bad)


def test_sequence_info_bad_shapes():
    with pytest.raises(ValueError, match="positions must have shape"):
        SequenceInfo(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="valid must have the shape"):
        SequenceInfo(torch.zeros(1, 3, dtype=torch.long), valid=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="integer"):
        SequenceInfo(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="offset must be >= 0"):
        SequenceInfo.from_offset(1, 3, -1)


def test_padding_mask_accepts_bool_int_and_float_01():
    want = SequenceInfo.from_padding_mask(torch.tensor([[False, True, True], [True, True, False]]))
    for mask in (torch.tensor([[0, 1, 1], [1, 1, 0]]), torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])):
        got = SequenceInfo.from_padding_mask(mask)
        assert torch.equal(got.positions, want.positions) and torch.equal(got.valid, want.valid)


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min, -1e4])
def test_padding_mask_refuses_an_additive_mask(fill):
    # Hugging Face's extended attention mask: 0 at real tokens, a large negative at padding.
    # Read as 0/1 it would make real tokens padding and padding real: refused, with the fix.
    additive = torch.tensor([[fill, 0.0, 0.0], [0.0, 0.0, fill]])
    with pytest.raises(ValueError, match=r"only 0 and 1 .* looks like an additive attention mask .* mask == 0"):
        SequenceInfo.from_padding_mask(additive)
    fixed = SequenceInfo.from_padding_mask(additive == 0)
    assert fixed.valid.tolist() == [[False, True, True], [True, True, False]]


def test_padding_mask_refuses_other_values():
    with pytest.raises(ValueError, match=r"mask must hold only 0 and 1 \(1 = real token\), got 2$"):
        SequenceInfo.from_padding_mask(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match=r"got 0.5$"):
        SequenceInfo.from_padding_mask(torch.tensor([[1.0, 0.5]]))
    with pytest.raises(TypeError, match="mask must be a"):
        SequenceInfo.from_padding_mask([[1, 1]])


@pytest.mark.parametrize(
    "bad, match",
    [
        ([0, 5.7, 10], r"cu_seqlens must hold ints, got 5.7 \(float\)"),
        ([0, 5.0, 10], r"cu_seqlens must hold ints, got 5.0 \(float\)"),
        ([0, True, 2], r"cu_seqlens must hold ints, got True \(bool\)"),
        (torch.tensor([0.0, 5.7, 10.0]), r"cu_seqlens must be an integer tensor, got torch.float32"),
        (7, r"cu_seqlens must be a list of ints or an integer tensor, got int"),
    ],
)


def test_cu_seqlens_refuses_non_integers(bad, match):
    with pytest.raises(TypeError, match=match):
        SequenceInfo.from_cu_seqlens(bad)


def test_cu_seqlens_accepts_integer_tensors_of_any_width():
    for dtype in (torch.int32, torch.int64):
        s = SequenceInfo.from_cu_seqlens(torch.tensor([0, 2, 3], dtype=dtype))
        assert s.positions.tolist() == [[0, 1, 0]]


def test_from_offset_refuses_negative_tensor_offsets_like_ints():
    with pytest.raises(ValueError, match=r"offset must be >= 0, got -1$"):
        SequenceInfo.from_offset(2, 3, -1)
    with pytest.raises(ValueError, match=r"offset must be >= 0, got a minimum of -2$"):
        SequenceInfo.from_offset(2, 3, torch.tensor([0, -2]))
    with pytest.raises(TypeError, match=r"offset tensor must hold integers, got torch.float32"):
        SequenceInfo.from_offset(2, 3, torch.tensor([0.0, 1.5]))
    with pytest.raises(TypeError, match=r"offset must be an int, got float 1.5"):
        SequenceInfo.from_offset(2, 3, 1.5)
    with pytest.raises(TypeError, match=r"batch must be an int, got str '2'"):
        SequenceInfo.from_offset("2", 3)
    with pytest.raises(ValueError, match=r"batch must be >= 1, got 0"):
        SequenceInfo.from_offset(0, 3)
    with pytest.raises(TypeError, match=r"length must be an int, got float 3.0"):
        SequenceInfo.from_offset(2, 3.0)


def test_sequence_info_refuses_lists_arrays_and_negative_positions():
    np = pytest.importorskip("numpy")
    for bad in ([[0, 1, 2]], np.arange(3)[None]):
        with pytest.raises(TypeError, match=r"positions must be a \(B, T\) integer tensor, got .* torch.as_tensor"):
            SequenceInfo(positions=bad)
    with pytest.raises(ValueError, match=r"positions must be >= 0, got a minimum of -3$"):
        SequenceInfo(torch.tensor([[0, 1, -3]]))
    with pytest.raises(TypeError, match=r"segment_ids must be a tensor or None, got list"):
        SequenceInfo(torch.tensor([[0, 1]]), segment_ids=[[0, 0]])
    with pytest.raises(TypeError, match=r"segment_ids must be an integer tensor, got torch.float32"):
        SequenceInfo(torch.tensor([[0, 1]]), segment_ids=torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"valid is on meta but positions are on cpu"):
        SequenceInfo(torch.tensor([[0, 1]]), valid=torch.ones(1, 2, dtype=torch.bool, device="meta"))


@pytest.mark.parametrize("T,width", [(20, 16), (33, 16), (5, 16), (70, 12), (17, 3)])
def test_raster_axes_compiled_equal_a_loop(T, width):
    """(p // w, p % w) of arange(T), made inside a compiled graph. torch 2.13's inductor (CPU)
    compiles ``arange(T) // w`` into a loop over (T // w) * w elements and leaves the rest
    unwritten; raster_axes must give every element, eager and compiled."""
    from posenc.positions import raster_axes

    want = [[p // width for p in range(T)], [p % width for p in range(T)]]
    torch._dynamo.reset()
    make = lambda x: raster_axes(torch.arange(x.shape[0]), width)  # noqa: E731
    x = torch.zeros(T)
    assert make(x).tolist() == want
    assert torch.compile(make)(x).tolist() == want


def test_from_grid_axes_are_row_and_column():
    s = SequenceInfo.from_grid(3, 5, batch=2)
    rows = [[p // 5 for p in range(15)]] * 2
    cols = [[p % 5 for p in range(15)]] * 2
    assert s.axes.tolist() == [rows, cols] and s.positions.tolist() == [list(range(15))] * 2


@pytest.mark.parametrize("make,match", [
    (lambda: SequenceInfo.from_grid(2**20, 2**20), r"^height \* width must be <= 16777216 tokens .*got 1099511627776$"),
    (lambda: SequenceInfo.from_grid(2**12 + 1, 2**12), r"^height \* width must be <= 16777216 tokens .*got 16781312$"),
])
def test_from_grid_refuses_absurd_sizes_before_allocating(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("blocks,total", [([10**12], 10**12), ([(10**4, 10**4, 10**4)], 10**12),
                                          ([(1, 2**12, 2**12), 1], 2**24 + 1)])
def test_multimodal_axes_refuses_absurd_sizes_before_allocating(blocks, total):
    from posenc.positions import multimodal_axes

    with pytest.raises(ValueError, match=rf"^the tokens of blocks must be <= 16777216 tokens .*got {total}$"):
        multimodal_axes(blocks)
