"""Limits and numerics shared by the encoding families (absolute and relative).

Sizes. A config's size-like fields are bounded so that a typo (``max_len=10**12``) is a
``ValueError`` naming the field, not an allocator error deep in ``torch.randn``:

* ``MAX_TABLE_ROWS`` (2^24, 16.8 M): rows of a learned table (learned/multiplicative
  ``max_len``, Shaw's 2·clip + 1, DeBERTa's 2·span, T5's buckets). Beyond any context a
  Transformer is trained on, and still exact as a float32 index.
* ``MAX_TABLE_ELEMENTS`` (2^30 numbers, 4 GiB in float32): rows times width of one table,
  checked when the module is built (the width comes from the model).
* ``MAX_DISTANCE`` (2^40): a distance that only parameterizes a function (a clamp, a log
  scale) and allocates nothing; int64 positions and float32 arithmetic on it stay exact
  enough (and :func:`~posenc.relative.distance.saturation_bounds` searches up to 2^40).
* ``MAX_WIDTH`` (2^16): a hidden width of a small per-encoding network (GRU, MLP).
* ``MAX_TOKENS`` (2^24, 16.8 M): tokens that one call of a position builder makes
  (``SequenceInfo.from_grid``, ``multimodal_axes``): (3, T) int64 ids are then 400 MB, and a
  typo (``multimodal_axes([10**12])``) is refused before ``torch.arange`` tries to allocate.

Positions. ``MAX_POSITION`` (2^53 - 1): rotary encodings turn by float64 angles, and float64
holds every integer up to 2^53 and not all beyond, so a larger position would be rotated by a
neighbour's angle; :func:`check_positions` refuses it (and a negative one) in eager mode.

Float fields: ``MAX_INIT_STD`` (1e4) bounds the std of a normal init: past ~1e19 a
LayerNorm's variance overflows float32 (``init_std=1e30`` gave NaN logits); 1e4 leaves a
margin of 10^15 for sums over the width.

Precision. :class:`Float32Params` keeps named, angle-like parameters in float32 when the
module is cast to float16/bfloat16 (``model.to(torch.bfloat16)``): a learned frequency
rounded to bfloat16 (8 bits of mantissa) is off by up to 2^-9 relative, i.e. 16 rad of phase
at position 8192 for omega = 1.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import torch
from torch import Tensor, nn

from .config import check_int

__all__ = [
    "MAX_TABLE_ROWS",
    "MAX_TABLE_ELEMENTS",
    "MAX_DISTANCE",
    "MAX_WIDTH",
    "MAX_TOKENS",
    "MAX_POSITION",
    "MAX_INIT_STD",
    "check_table_size",
    "check_width",
    "check_positions",
    "Float32Params",
]

MAX_TABLE_ROWS = 2**24
MAX_TABLE_ELEMENTS = 2**30
MAX_DISTANCE = 2**40
MAX_WIDTH = 2**16
MAX_TOKENS = 2**24
MAX_POSITION = 2**53 - 1
MAX_INIT_STD = 1e4


def check_table_size(
    field: str, value: int, width: int, width_name: str, *, rows_per: int = 1, extra_rows: int = 0
) -> None:
    """Refuse a table of ``rows_per * value + extra_rows`` rows of ``width`` numbers above
    ``MAX_TABLE_ELEMENTS``, before it is allocated.

    ``field`` = ``value`` is the config field that sets the rows (Shaw's clip k: 2k + 1 rows);
    the message names it, the largest value that fits at this width and the value received.
    """
    if (rows_per * value + extra_rows) * width > MAX_TABLE_ELEMENTS:
        largest = (MAX_TABLE_ELEMENTS // width - extra_rows) // rows_per
        raise ValueError(
            f"{field} must be <= {largest} with {width_name}={width} (a table of at most 2^30 numbers, "
            f"4 GiB in float32), got {value}"
        )


class Float32Params(nn.Module):
    """Mixin: the parameters named in ``float32_params`` stay float32 under a low-precision cast.

    ``module.to(torch.bfloat16)`` / ``.half()`` cast every floating parameter; for these the
    float32 value from before the cast is kept (moved to the new device), so nothing is
    rounded. Casts to float32 or float64 apply as usual. The hooks already compute in float32
    or wider and cast their result to the input's dtype.
    """

    float32_params: ClassVar[tuple[str, ...]] = ()

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> "Float32Params":
        before = {n: p.data for n in self.float32_params if (p := getattr(self, n, None)) is not None}
        super()._apply(fn, recurse)
        for name, old in before.items():
            p = getattr(self, name)
            if p.dtype in (torch.float16, torch.bfloat16):
                p.data = old.to(device=p.device, dtype=torch.float32)
        return self


def check_width(name: str, value: int) -> None:
    """A hidden width: an int in [1, MAX_WIDTH]."""
    check_int(name, value, minimum=1, maximum=MAX_WIDTH)


def check_positions(positions: Tensor, name: str = "positions") -> int | None:
    """Integer ``positions`` (any shape) in [0, MAX_POSITION], checked with one host read;
    returns the largest (what a RoPE table must reach).

    Skipped (None) under torch.compile (the read would break the graph) and for meta or empty
    tensors."""
    if torch.compiler.is_compiling() or positions.numel() == 0 or positions.device.type == "meta":
        return None
    if positions.numel() <= 64:  # a decoding step: one read of the values, min and max on the host
        values = positions.reshape(-1).tolist()
        lo, hi = min(values), max(values)
    else:
        lo, hi = torch.stack(torch.aminmax(positions)).tolist()  # one host read
    if lo < 0:
        raise ValueError(f"{name} must be >= 0, got {lo}")
    if hi > MAX_POSITION:
        raise ValueError(
            f"{name} must be <= {MAX_POSITION} (2**53 - 1: float64 angles hold every integer up to "
            f"there, no further), got {hi}"
        )
    return hi
