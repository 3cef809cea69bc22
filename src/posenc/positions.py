"""Explicit token positions: where each token sits in its own sequence.

Notation used throughout posenc:
    B batch, T sequence length (Tq queries, Tk keys), H heads, D head dim, C model width.

Every encoding receives per-token position ids of shape (B, T). :class:`SequenceInfo`
carries them together with the two other facts attention needs:

* ``segment_ids`` (B, T) for packed sequences: tokens attend only within their document;
* ``valid`` (B, T) bool, False at padding tokens.

Encodings that place a token on several axes (M-RoPE's time, height and width; 2-D RoPE's
row and column on a patch grid) read ``axes`` (A, B, T) as well, when the info carries them;
every other encoding reads ``positions`` alone (:meth:`PositionalEncoding.position_ids
<posenc.encoding.PositionalEncoding.position_ids>` says which an encoding reads).

Build one with the helpers: :meth:`SequenceInfo.from_offset` (plain batches and KV-cache
decoding), :meth:`SequenceInfo.from_padding_mask` (left or right padding),
:meth:`SequenceInfo.from_cu_seqlens` (packed documents, positions restart at each one),
:meth:`SequenceInfo.from_grid` (a 2-D patch grid) and :meth:`SequenceInfo.with_axes` (axes
given, e.g. :func:`multimodal_axes`' for text and images, :func:`video_rope_axes`' for
VideoRoPE's layout, :func:`xdrope_axes`' for HunYuan-VL's; the multimodal builders live in
:mod:`posenc.multimodal_positions` and are re-exported here).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import check_int
from .limits import MAX_TOKENS
from .multimodal_positions import multimodal_axes, video_rope_axes, xdrope_axes  # re-exported: the multimodal builders

__all__ = ["SequenceInfo", "floor_div", "multimodal_axes", "raster_axes", "relative_positions", "contiguous_offset",
           "shared_rows", "video_rope_axes", "xdrope_axes"]


def relative_positions(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Distances ``i - j`` (query position minus key position): (B, Tq) x (B, Tk) -> (B, Tq, Tk)."""
    return q_pos[:, :, None] - k_pos[:, None, :]


def contiguous_offset(q_pos: Tensor, k_pos: Tensor) -> int | None:
    """``s`` when ``q_pos[b, i] - k_pos[b, j] == s + i - j`` for every row b, else None.

    q_pos (B, Tq), k_pos (B|1, Tk). True for plain batches, KV-cache decoding with one offset
    for the batch and contiguous cross-attention: a function of ``i - j`` then has only
    Tq + Tk - 1 distinct values (a Toeplitz matrix). One host read; under ``torch.compile``
    it returns None (the check needs the values) and callers take their general path.
    """
    if torch.compiler.is_compiling() or q_pos.shape[1] == 0 or k_pos.shape[1] == 0:
        return None
    ok = torch.ones((), dtype=torch.bool, device=q_pos.device)
    for pos in (q_pos, k_pos):
        if pos.shape[1] > 1:
            ok = ok & (pos.diff(dim=1) == 1).all()
    off = q_pos[:, 0] - k_pos[:, 0]  # (B,)
    ok = ok & (off == off[0]).all()
    return int(off[0]) if bool(ok) else None


def shared_rows(q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
    """Reduce (B, T) positions to one row when every row is provably the same.

    A bias that depends on positions only is then computed once, (1, H, Tq, Tk), and
    broadcast over the batch. The test is exact and free: a batch of one row, or a row
    expanded with stride 0 (``SequenceInfo.from_offset`` with an int offset, the model's
    default). Rows that merely happen to be equal are left alone; comparing them would need
    a device sync.
    """
    one_row = lambda pos: pos.shape[0] == 1 or pos.stride(0) == 0  # noqa: E731
    if one_row(q_pos) and one_row(k_pos):
        return q_pos[:1], k_pos[:1]
    return q_pos, k_pos


def floor_div(index: Tensor, divisor: int) -> Tensor:
    """``index // divisor`` of an integer tensor, exact for every integer, and correct under
    torch.compile: (index - index % divisor) is a multiple of the divisor, divided truncating.

    Not ``index // divisor`` (nor ``torch.div(..., rounding_mode="floor")``): torch 2.13's
    inductor (CPU) compiles ``arange(T) // d`` into a loop over the first (T // d) * d elements
    only and leaves the rest unwritten, so a compiled model read uninitialised memory as the
    rows of a partial last grid row (2-D RoPE) or the groups of Self-Extend's last positions.
    """
    return torch.div(index - index % divisor, divisor, rounding_mode="trunc")


def raster_axes(index: Tensor, width: int) -> Tensor:
    """(row, column) = (index // width, index % width) of raster indices (any shape) on a grid
    ``width`` wide: (2, *index.shape), the row by :func:`floor_div` (correct when compiled)."""
    return torch.stack([floor_div(index, width), index % width])


def _check_tokens(name: str, n: int) -> None:
    """A builder about to make ``n`` tokens: at most MAX_TOKENS, before anything is allocated."""
    if n > MAX_TOKENS:
        raise ValueError(f"{name} must be <= {MAX_TOKENS} tokens (2**24, posenc.limits.MAX_TOKENS), got {n}")


_INT64_MAX = torch.iinfo(torch.int64).max


def _check_last_position(offset: int, length: int) -> None:
    """Positions ``offset .. offset + length - 1`` must fit int64, the dtype they are made in."""
    if length and offset > _INT64_MAX - (length - 1):
        raise ValueError(
            f"offset must be <= {_INT64_MAX - (length - 1)} for length {length} (the last position, "
            f"offset + length - 1, must fit int64: <= {_INT64_MAX}), got {offset}"
        )


def _compiling() -> bool:
    """True while torch.compile traces: value checks that read a tensor on the host are
    skipped there (they would break the graph); eager calls keep them."""
    return torch.compiler.is_compiling()


def _is_int_tensor(t: Tensor) -> bool:
    return not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


@dataclass
class SequenceInfo:
    """Positions and document/padding structure of a batch of tokens.

    Attributes:
        positions: (B, T) int64 or int32 position ids, >= 0. Padding tokens get 0.
        segment_ids: (B, T) integer document ids, or None when each row is one sequence.
        valid: (B, T) bool, False at padding, or None when there is none.
        axes: (A, B, T) integer position ids per axis (A >= 1), >= 0, or None: the positions
            of multi-axis encodings (M-RoPE: A = 3, time / height / width; 2-D RoPE: A = 2,
            row / column). 1-D encodings ignore them; masks never read them.

    All of them must be tensors on one device (a list or an array is refused with a
    ``TypeError``: convert it with ``torch.as_tensor``). Negative positions are refused in
    eager mode (one host read of the minimum); under ``torch.compile`` only shapes, dtypes and
    devices are checked.
    """

    positions: Tensor
    segment_ids: Tensor | None = None
    valid: Tensor | None = None
    axes: Tensor | None = None

    def __post_init__(self) -> None:
        self._check_structure()
        for name in ("positions", "axes"):
            t = getattr(self, name)
            if t is not None and not _compiling() and t.numel() and t.device.type != "meta":
                low = int(t.min())
                if low < 0:
                    raise ValueError(f"{name} must be >= 0, got a minimum of {low}")

    @classmethod
    def from_checked(
        cls, positions: Tensor, segment_ids: Tensor | None = None, valid: Tensor | None = None, axes: Tensor | None = None
    ) -> "SequenceInfo":
        """An info made of parts of checked ones (a slice, a concatenation, the next step):
        the shape, dtype and device checks run, the value check (a host read per call, one per
        decoding step on a GPU) does not. Positions from anywhere else go through the
        constructor."""
        info = cls.__new__(cls)
        info.positions, info.segment_ids, info.valid, info.axes = positions, segment_ids, valid, axes
        info._check_structure()
        return info

    def _check_structure(self) -> None:
        pos = self.positions
        if not isinstance(pos, Tensor):
            raise TypeError(
                f"positions must be a (B, T) integer tensor, got {type(pos).__name__} "
                "(convert with torch.as_tensor(positions, dtype=torch.long))"
            )
        if pos.dim() != 2:
            raise ValueError(f"positions must have shape (B, T), got {tuple(pos.shape)}")
        if pos.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"positions must be an integer tensor (int64 or int32), got {pos.dtype}")
        for name in ("segment_ids", "valid"):
            t = getattr(self, name)
            if t is None:
                continue
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a tensor or None, got {type(t).__name__}")
            if t.shape != pos.shape:
                raise ValueError(f"{name} must have the shape of positions {tuple(pos.shape)}, got {tuple(t.shape)}")
            if t.device != pos.device:
                raise ValueError(f"{name} is on {t.device} but positions are on {pos.device}")
        if self.segment_ids is not None and not _is_int_tensor(self.segment_ids):
            raise TypeError(f"segment_ids must be an integer tensor, got {self.segment_ids.dtype}")
        if self.valid is not None and self.valid.dtype != torch.bool:
            raise TypeError(f"valid must be a bool tensor, got {self.valid.dtype}")
        axes = self.axes
        if axes is not None:
            if not isinstance(axes, Tensor):
                raise TypeError(f"axes must be an (A, B, T) integer tensor or None, got {type(axes).__name__}")
            if axes.dim() != 3 or axes.shape[0] < 1 or axes.shape[1:] != pos.shape:
                raise ValueError(
                    f"axes must have shape (A, B, T) = (A, {pos.shape[0]}, {pos.shape[1]}) with A >= 1, got {tuple(axes.shape)}"
                )
            if axes.dtype not in (torch.int64, torch.int32):
                raise TypeError(f"axes must be an integer tensor (int64 or int32), got {axes.dtype}")
            if axes.device != pos.device:
                raise ValueError(f"axes is on {axes.device} but positions are on {pos.device}")

    @property
    def num_axes(self) -> int:
        """A, the position axes carried (1 without ``axes``: the positions are the one axis)."""
        return 1 if self.axes is None else self.axes.shape[0]

    @property
    def shape(self) -> torch.Size:
        """(B, T)."""
        return self.positions.shape

    @classmethod
    def from_offset(
        cls,
        batch: int,
        length: int,
        offset: int | Tensor = 0,
        device: torch.device | str | None = None,
    ) -> "SequenceInfo":
        """Positions ``offset, offset + 1, ...`` for every row.

        ``offset`` is an int >= 0 or a (B,) integer tensor of values >= 0 (one offset per row,
        e.g. KV-cache decoding of sequences of different lengths); a tensor offset sets the
        device.
        """
        check_int("batch", batch, minimum=1)
        check_int("length", length, minimum=0)
        if isinstance(offset, Tensor):
            if offset.shape != (batch,):
                raise ValueError(f"offset tensor must have shape (batch,) = ({batch},), got {tuple(offset.shape)}")
            if not _is_int_tensor(offset):
                raise TypeError(f"offset tensor must hold integers, got {offset.dtype}")
            if not _compiling() and offset.device.type != "meta":
                low, high = (int(x) for x in torch.aminmax(offset))
                if low < 0:
                    raise ValueError(f"offset must be >= 0, got a minimum of {low}")
                _check_last_position(high, length)
            device = offset.device
            pos = offset.long()[:, None] + torch.arange(length, device=device)[None, :]
        else:
            check_int("offset", offset, minimum=0)
            _check_last_position(offset, length)
            pos = (torch.arange(length, device=device) + offset).expand(batch, length)  # (B, T); offset + length may be 2**63
        return cls.from_checked(pos)

    @classmethod
    def from_padding_mask(cls, mask: Tensor) -> "SequenceInfo":
        """Positions from a (B, T) padding mask (1/True = real token, 0/False = padding).

        Works for left and right padding: the first real token of each row gets position 0.
        ``mask`` is bool, or integer or float holding only 0 and 1 (Hugging Face's
        ``attention_mask``). An *additive* mask (0 at real tokens, -inf or a large negative
        value at padding) means the opposite and is refused, not inverted: convert it with
        ``mask == 0``.
        """
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a (B, T) tensor, got {type(mask).__name__}")
        if mask.dim() != 2:
            raise ValueError(f"mask must have shape (B, T), got {tuple(mask.shape)}")
        if mask.is_complex():
            raise TypeError(f"mask must be bool, integer or float 0/1, got {mask.dtype}")
        if mask.dtype != torch.bool and not _compiling() and mask.device.type != "meta":
            bad = (mask != 0) & (mask != 1)
            if bool(bad.any()):
                value = mask[bad][0].item()
                hint = (
                    "; it looks like an additive attention mask (0 = keep, negative = hide): "
                    "pass mask == 0"
                    if value < 0 and bool((mask[bad] < 0).all())
                    else ""
                )
                raise ValueError(f"mask must hold only 0 and 1 (1 = real token), got {value}{hint}")
        valid = mask.bool()
        pos = (valid.long().cumsum(-1) - 1).clamp_min(0)
        pos = pos.masked_fill(~valid, 0)
        return cls.from_checked(pos, valid=valid)

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: Tensor | list[int]) -> "SequenceInfo":
        """A packed row of documents, given their cumulative lengths ``[0, n1, n1+n2, ...]``.

        Returns B = 1: positions restart at 0 at each document and segment ids number them.
        ``cu_seqlens`` is a 1-D integer tensor or a list of ints (floats are refused, even
        integral ones: a length is a count).
        """
        if isinstance(cu_seqlens, Tensor):
            if not _is_int_tensor(cu_seqlens):
                raise TypeError(f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
        else:
            try:
                items = list(cu_seqlens)
            except TypeError:
                raise TypeError(f"cu_seqlens must be a list of ints or an integer tensor, got {type(cu_seqlens).__name__}") from None
            for v in items:
                if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                    raise TypeError(f"cu_seqlens must hold ints, got {v!r} ({type(v).__name__}) in {items!r}")
        cu = torch.as_tensor(cu_seqlens, dtype=torch.long)
        if cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0:
            raise ValueError(f"cu_seqlens must be 1-D, start at 0 and have >= 2 entries, got {cu.tolist()}")
        lengths = cu.diff()
        if bool((lengths <= 0).any()):
            raise ValueError(f"cu_seqlens must be strictly increasing, got {cu.tolist()}")
        total = int(cu[-1])
        seg = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths)
        pos = torch.arange(total, device=cu.device) - cu[:-1][seg]
        return cls.from_checked(pos[None], segment_ids=seg[None])

    @classmethod
    def from_grid(cls, height: int, width: int, batch: int = 1, device: torch.device | str | None = None) -> "SequenceInfo":
        """The ``height x width`` patches of an image in raster order (row by row), as a vision
        transformer reads them: positions ``0 .. height * width - 1`` and axes (2, B, T) =
        (row, column) for 2-D RoPE (Heo et al. 2024)."""
        check_int("height", height, minimum=1)
        check_int("width", width, minimum=1)
        check_int("batch", batch, minimum=1)
        _check_tokens("height * width", height * width)
        t = torch.arange(height * width, device=device)
        axes = raster_axes(t, width)[:, None].expand(2, batch, -1)  # (2, B, T)
        return cls.from_checked(t.expand(batch, -1), axes=axes)

    def with_axes(self, axes: Tensor) -> "SequenceInfo":
        """This info with ``axes`` (A, B, T) given (checked as the constructor checks them)."""
        return SequenceInfo(self.positions, self.segment_ids, self.valid, axes)

    def to(self, device: torch.device | str) -> "SequenceInfo":
        """The same info on ``device``."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return SequenceInfo.from_checked(move(self.positions), move(self.segment_ids), move(self.valid), move(self.axes))

    def next(self, length: int = 1) -> "SequenceInfo":
        """The info of the ``length`` tokens that follow each row (greedy decoding).

        Positions continue from the last position of each row; the new tokens are valid and
        belong to the last document of their row. Axes, when given, continue as text: every
        axis from the largest axis position of the row's valid tokens in its last document
        (transformers' ``rope_deltas``: the largest id of the prompt + 1; after a video whose
        frames are spaced in time, that is its last frame's time, not the text after it).
        """
        check_int("length", length, minimum=0)
        last = self.positions[:, -1:]
        step = torch.arange(1, length + 1, device=last.device)[None, :]
        pos = last + step
        seg = None if self.segment_ids is None else self.segment_ids[:, -1:].expand(-1, length)
        valid = None if self.valid is None else torch.ones_like(pos, dtype=torch.bool)
        axes = None
        if self.axes is not None:
            keep = torch.ones_like(self.positions, dtype=torch.bool)  # (B, T): the tokens that count
            if self.valid is not None:
                keep = keep & self.valid
            if self.segment_ids is not None:
                keep = keep & (self.segment_ids == self.segment_ids[:, -1:])
            top = self.axes.masked_fill(~keep, -1).amax(dim=(0, 2))  # (B,): -1 for a row of pads only
            text = top[:, None] + step.to(self.axes.dtype)  # (B, length)
            axes = text.expand(self.axes.shape[0], -1, -1)  # (A, B, length)
        return SequenceInfo.from_checked(pos, seg, valid, axes)
