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
VideoRoPE's layout).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import check_int
from .limits import MAX_TOKENS

__all__ = ["SequenceInfo", "floor_div", "multimodal_axes", "raster_axes", "relative_positions", "contiguous_offset",
           "shared_rows", "video_rope_axes"]


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


def _block_tokens(block: int | tuple) -> int:
    """The tokens of one :func:`multimodal_axes` block, after checking it."""
    if not isinstance(block, tuple):
        check_int("a text block", block, minimum=0)
        return block
    if len(block) not in (3, 4):
        raise ValueError(f"a vision block must be a (t, h, w) or (t, h, w, interval) tuple, got {block!r}")
    for name, n in zip("thw", block):
        check_int(f"a vision block's {name}", n, minimum=1)
    t, h, w = block[:3]
    if len(block) == 4:
        interval = block[3]
        if isinstance(interval, bool) or not isinstance(interval, numbers.Real) or not interval > 0 \
                or not math.isfinite(interval):
            raise ValueError(f"a vision block's interval must be a finite number > 0, got {interval!r}")
        if (t - 1) * interval >= 2**24:  # float32 holds every integer below 2**24 exactly
            raise ValueError(f"a vision block's last frame time (t - 1) * interval must be below 2**24, "
                             f"got ({t} - 1) * {interval!r}")
    return t * h * w


def multimodal_axes(blocks: list[int | tuple[int, int, int] | tuple[int, int, int, float]],
                    device: torch.device | str | None = None) -> Tensor:
    """M-RoPE's (time, height, width) positions (3, T) of one sequence of text, images and videos.

    ``blocks``, in order: an int n is n text tokens, each at the next position on all three
    axes; a tuple (t, h, w) is a vision grid of t x h x w tokens (after the vision encoder's
    merge), in (time, row, column) raster order, at ``start + (i, y, x)``; the text after it
    starts at ``start + max(h, w)`` (Wang et al. 2024, "Qwen2-VL", §2.1; transformers'
    ``Qwen2VLModel.get_rope_index``). Every axis of the result is >= 0::

        multimodal_axes([2, (1, 2, 3), 1])
        # t: 0 1 2 2 2 2 2 2 5   h: 0 1 2 2 2 3 3 3 5   w: 0 1 2 3 4 2 3 4 5

    A video's frames may be spaced in time: a tuple (t, h, w, interval) puts frame i at time
    ``start + floor(i * interval)`` (Bai et al. 2025, "Qwen2.5-VL Technical Report", its M-RoPE
    "aligned to absolute time", with
    ``interval = tokens_per_second * second_per_grid_t``, as ``Qwen2_5_VLModel.get_rope_index``
    takes it from the vision config and the processor). The product is taken in float32, as
    transformers takes it, so the truncation agrees with its ids to the token; the text after
    the video still starts at ``start + max(h, w)``, as there::

        multimodal_axes([(3, 1, 1, 12.5)])  # t: 0 12 25   h: 0 0 0   w: 0 0 0
    """
    if not isinstance(blocks, (list, tuple)):
        raise TypeError(f"blocks must be a list of text and vision blocks, got {type(blocks).__name__}")
    if not blocks:
        raise ValueError(f"blocks must name at least one text or vision block, got {blocks!r}")
    _check_tokens("the tokens of blocks", sum(_block_tokens(b) for b in blocks))  # before any allocation
    parts, start = [], 0
    for block in blocks:
        if isinstance(block, tuple):
            t, h, w = block[:3]
            grid = torch.meshgrid(*(torch.arange(n, device=device) for n in (t, h, w)), indexing="ij")
            ids = torch.stack([g.reshape(-1) for g in grid])  # (3, t*h*w)
            if len(block) == 4:
                step = torch.tensor(float(block[3]), dtype=torch.float32, device=device)
                ids[0] = (ids[0] * step).long()  # float32 then truncated, as transformers computes it
            parts.append(ids + start)
            start += max(h, w)
        else:
            parts.append(torch.arange(start, start + block, device=device).expand(3, -1))
            start += block
    return torch.cat(parts, dim=1)  # (3, T)


def video_rope_axes(blocks: list[int | tuple[int, int, int]], temporal_stride: int = 2,
                    device: torch.device | str | None = None) -> Tensor:
    """VideoRoPE's (time, height, width) positions (3, T) of one sequence of text, images and
    videos: its diagonal layout and adjustable temporal spacing (Wei et al. 2025, "VideoRoPE:
    What Makes for Good Video Rotary Position Embedding?", arXiv 2502.05173), exactly as SGLang's
    ``BailingMRotaryEmbedding.bailing_3drope_get_input_positions_tensor`` makes them
    (python/sglang/srt/layers/rotary_embedding/bailing_mrope.py, commit 3176746068), which is the
    authors' ``get_t_scale_rope_index`` (Wiselnn570/VideoRoPE, videorope-transformer/).

    ``blocks`` as :func:`multimodal_axes`': an int n is n text tokens, each at the next position
    on all three axes; a tuple (t, h, w) is a vision grid after the vision encoder's merge, in
    (time, row, column) raster order (an image is a grid with t = 1: the engine places images
    and videos alike). A grid starting at position s puts token (i, y, x) at::

        time   s + delta i
        height s + delta i + y - (h - 1) // 2
        width  s + delta i + x - (w - 1) // 2

    every frame centred on its time id (the diagonal of the text's ids), frames ``delta =
    temporal_stride`` apart; the text after it starts at the last frame's time + 1::

        video_rope_axes([2, (1, 2, 3), 1])
        # t: 0 1 2 2 2 2 2 2 3   h: 0 1 2 2 2 3 3 3 3   w: 0 1 1 2 3 1 2 3 3

    Unlike :func:`multimodal_axes`' (Qwen2-VL's):

    * Ids can be negative: a grid starting at s < (h - 1) // 2 has height ids below 0 (width
      likewise; the engine's cos/sin cache starts at -max_position_embeddings for them).
      :class:`SequenceInfo` takes ids >= 0: shift every axis by one constant, ``axes -
      axes.min().clamp(max=0)``; q.k depends on each axis' differences only, so every logit is
      the engine's (for frequencies that do not depend on the length).
    * Decoding continues at the time axis' largest id + 1 (the engine's ``position_delta``), not
      after the largest id of any axis as :meth:`SequenceInfo.next` does: for the ids of a
      longer sequence, call this with the trailing text block extended.
    * delta is an integer: the engine fixes it at 2 (``scale_factor = 2.0``, the seconds per
      grid ignored); the authors' float spacings would need non-integer ids.
    * The engine's ``use_interleaved_frame_timestamp`` splits a video into its frames, each after
      its timestamp's text tokens: pass ``[ts, (1, h, w), ts, (1, h, w), ...]``.
    """
    if not isinstance(blocks, (list, tuple)):
        raise TypeError(f"blocks must be a list of text and vision blocks, got {type(blocks).__name__}")
    if not blocks:
        raise ValueError(f"blocks must name at least one text or vision block, got {blocks!r}")
    for block in blocks:
        if isinstance(block, tuple) and len(block) != 3:
            raise ValueError(f"a VideoRoPE vision block must be a (t, h, w) tuple (its frames are temporal_stride "
                             f"apart), got {block!r}")
    # <= 2**24: with at most 2**24 tokens every id stays below 2**49, well inside int64 and float64's integers.
    check_int("temporal_stride", temporal_stride, minimum=1, maximum=MAX_TOKENS)
    _check_tokens("the tokens of blocks", sum(_block_tokens(b) for b in blocks))  # before any allocation
    parts, start = [], 0
    for block in blocks:
        if isinstance(block, tuple):
            t, h, w = block
            i, y, x = (g.reshape(-1) for g in torch.meshgrid(
                *(torch.arange(n, device=device) for n in (t, h, w)), indexing="ij"))  # 3 x (t*h*w,)
            time = start + temporal_stride * i
            parts.append(torch.stack([time, time + y - (h - 1) // 2, time + x - (w - 1) // 2]))  # (3, t*h*w)
            start += temporal_stride * (t - 1) + 1
        else:
            parts.append(torch.arange(start, start + block, device=device).expand(3, -1))
            start += block
    return torch.cat(parts, dim=1)  # (3, T)
