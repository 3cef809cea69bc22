"""Position ids of multimodal sequences: the (A, T) axes of text, images and videos that the
multimodal rotary encodings read (``SequenceInfo(positions, axes=ids[:, None])``), one builder per
engine layout, each re-exported by :mod:`posenc.positions`:

* :func:`multimodal_axes`: M-RoPE's (time, height, width) (Qwen2-VL, Qwen2.5-VL's spaced frames);
* :func:`video_rope_axes`: VideoRoPE's centred, diagonal layout (SGLang's Bailing);
* :func:`xdrope_axes`: XD-RoPE's (position, width, height, image) (HunYuan-VL).

Shapes: T tokens of one sequence; ids (A, T) int64.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from .config import check_int
from .limits import MAX_TOKENS

__all__ = ["multimodal_axes", "video_rope_axes", "xdrope_axes"]


def _check_tokens(name: str, n: int) -> None:
    """A builder about to make ``n`` tokens: at most MAX_TOKENS, before anything is allocated (as
    :mod:`posenc.positions`' builders)."""
    if n > MAX_TOKENS:
        raise ValueError(f"{name} must be <= {MAX_TOKENS} tokens (2**24, posenc.limits.MAX_TOKENS), got {n}")


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


#: XD-RoPE's axes, in the engine's row order: 4 axes (position, width, height, image), or 3 without position.
XDROPE_AXES = {4: ("position", "width", "height", "image"), 3: ("width", "height", "image")}


def _image_span(block: tuple) -> int:
    """The tokens of one :func:`xdrope_axes` image block (begin, h rows of w + 1, end), after checking it."""
    if len(block) != 2:
        raise ValueError(f"an XD-RoPE image block must be an (h, w) tuple (the merged grid; the engine places no "
                         f"video), got {block!r}")
    for name, n in zip("hw", block):
        check_int(f"an image block's {name}", n, minimum=1)
    h, w = block
    return h * (w + 1) + 2


def xdrope_axes(blocks: list[int | tuple[int, int]], num_axes: int = 4,
                device: torch.device | str | None = None) -> Tensor:
    """XD-RoPE's positions (num_axes, T) of one sequence of text and images, as HunYuan-VL
    (HunyuanOCR) makes them: vLLM's ``HunYuanVLForConditionalGeneration.get_xdrope_input_positions``
    (vllm/model_executor/models/hunyuan_vision.py, commit 1c1b86e166), the same ids as
    transformers' ``HunYuanVLModel.get_rope_index`` for one sequence.

    Rows (position, width, height, image) for ``num_axes=4`` (the engine's P/W/H/T), (width,
    height, image) for 3. Every token starts at its index in the sequence on every axis. ``blocks``,
    in order: an int n is n text tokens; a tuple (h, w) is one image's span as the vision tower
    emits it after the merge (h = grid_h // merge, w = grid_w // merge): a begin token, h rows of
    w patches each followed by a newline token, an end token, h (w + 1) + 2 tokens. Its grid
    tokens (rows and newlines) take width = column (0 .. w, the newline w), height = row, image =
    the image's ordinal (0, 1, ..); the begin and end tokens, and position everywhere, keep the
    index. Text after an image continues at its index (nothing is shifted)::

        xdrope_axes([1, (2, 2), 1])   # 1 text, begin, 2 rows of (2 patches + newline), end, 1 text
        # position: 0 1 2 3 4 5 6 7 8 9
        # width:    0 1 0 1 2 0 1 2 8 9
        # height:   0 1 0 0 0 1 1 1 8 9
        # image:    0 1 0 0 0 0 0 0 8 9

    The engine's prompt puts an image-start token before each span and an image-end token
    after it (text blocks here). Decoding continues at the index on every axis (the engine's
    ``get_next_input_positions``), which is :meth:`SequenceInfo.next`'s rule here: no grid id
    exceeds its token's index.
    """
    if not isinstance(blocks, (list, tuple)):
        raise TypeError(f"blocks must be a list of text and image blocks, got {type(blocks).__name__}")
    if not blocks:
        raise ValueError(f"blocks must name at least one text or image block, got {blocks!r}")
    check_int("num_axes", num_axes, minimum=3, maximum=4)
    sizes = []
    for block in blocks:
        if isinstance(block, tuple):
            sizes.append(_image_span(block))
        else:
            check_int("a text block", block, minimum=0)
            sizes.append(block)
    _check_tokens("the tokens of blocks", sum(sizes))  # before any allocation
    ids = torch.arange(sum(sizes), device=device).expand(4, -1).clone()  # (4, T): P, W, H, T rows
    start, image = 0, 0
    for block, size in zip(blocks, sizes):
        if isinstance(block, tuple):
            h, w = block
            row, col = torch.meshgrid(torch.arange(h, device=device), torch.arange(w + 1, device=device),
                                      indexing="ij")  # (h, w + 1) each
            grid = slice(start + 1, start + size - 1)  # after the begin token, before the end token
            ids[1, grid] = col.reshape(-1)
            ids[2, grid] = row.reshape(-1)
            ids[3, grid] = image
            image += 1
        start += size
    return ids[4 - num_axes:]  # (num_axes, T)
