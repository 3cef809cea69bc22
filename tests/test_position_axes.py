"""``PositionalEncoding.position_axes``: what a class declares is what its ``position_ids`` reads.

The bench's 1-D presets choose encodings by this class attribute (posenc.bench.settings.
sequence_encodings), so a multi-axis encoding that forgot to declare itself would be benchmarked
on folded 1-D positions: every registered encoding is probed here with 2, 3 and 4 axes.
"""

from __future__ import annotations

import pytest
import torch

import posenc


def _reads_axes(name: str, axes: int) -> bool:
    enc = posenc.build(name, d_model=32, num_heads=4)
    seq = posenc.SequenceInfo.from_offset(1, 4).with_axes(torch.zeros(axes, 1, 4, dtype=torch.long))
    try:
        return enc.position_ids(seq) is seq.axes
    except ValueError:  # it reads another number of axes
        return False


@pytest.mark.parametrize("name", posenc.list_encodings())
def test_declared_axes_are_the_axes_read(name):
    declared = posenc.get_info(name).cls.position_axes
    read = [a for a in (2, 3, 4) if _reads_axes(name, a)]
    assert read == ([] if declared == 1 else [declared])


def test_the_multi_axis_encodings_declare_themselves():
    multi = {n: posenc.get_info(n).cls.position_axes for n in posenc.list_encodings()
             if posenc.get_info(n).cls.position_axes != 1}
    assert multi == {**multi, "mrope": 3, "xdrope": 4, "rope_axial": 2, "rope_mixed": 2, "rope_dinov3": 2}
