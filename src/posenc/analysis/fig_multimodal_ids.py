"""The position ids of two more multimodal layouts: VideoRoPE's (Wei et al. 2025, an ``mrope``
layout) and XD-RoPE's (HunYuan-VL, the ``xdrope`` encoding).

Left: a video of 3 frames of 3 x 4 patches between text, as
:func:`posenc.positions.video_rope_axes` makes them: every frame centred on its time id (the
diagonal of the text's ids), frames ``temporal_stride`` apart. Right: an image of 3 rows of 4
patches between text, as :func:`posenc.positions.xdrope_axes` makes them: a begin token, each
row followed by a newline token, an end token; the grid tokens take column, row and image
ordinal, every other token and the position axis keep the token's index. The ids are the
builders' own, the ones these encodings rotate by.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..positions import video_rope_axes, xdrope_axes
from .canvas import PlotResult, figure, save

__all__ = ["plot_multimodal_ids"]

VIDEO_BLOCKS = [4, (3, 3, 4), 4]
XDROPE_BLOCKS = [4, (3, 4), 4]
MARKS, SIZES = ("o-", "s-", "^-", "x-"), (9, 6, 4, 4)  # nested markers: axes with the same id stay visible


def plot_multimodal_ids(out_dir: Path, temporal_stride: int = 2) -> PlotResult:
    """VideoRoPE's and XD-RoPE's position ids of text + a video or image + text, per axis: VideoRoPE
    centres each frame on the diagonal of the text's ids, frames apart in time; XD-RoPE gives the
    grid column, row and image number and keeps the token index elsewhere."""
    video = video_rope_axes(VIDEO_BLOCKS, temporal_stride=temporal_stride)  # (3, T)
    xd = xdrope_axes(XDROPE_BLOCKS)  # (4, T)
    plt, fig, (a0, a1) = figure(2)
    t = torch.arange(video.shape[1])
    for i, name in enumerate(("time", "height", "width")):
        a0.plot(t.numpy(), video[i].numpy(), MARKS[i], color=f"C{i}", ms=SIZES[i], mfc="none", lw=0.7, label=name)
    a0.axvspan(3.5, 3.5 + 36, color="0.9", zorder=0, label="video (3 frames of 3 x 4)")
    a0.set_xlabel("token index (4 text, 36 patches, 4 text)")
    a0.set_ylabel("position id")
    a0.set_title(f"VideoRoPE (mrope layout video_rope), stride {temporal_stride}", fontsize=10)
    a0.legend(loc="upper left", fontsize=8)
    a0.grid(alpha=0.3)
    t = torch.arange(xd.shape[1])
    for i, name in enumerate(("position", "width", "height", "image")):
        a1.plot(t.numpy(), xd[i].numpy(), MARKS[i], color=f"C{i + 3}", ms=SIZES[i], mfc="none", lw=0.7, label=name)
    n = 3 * (4 + 1) + 2
    a1.axvspan(3.5, 3.5 + n, color="0.9", zorder=0, label="image: begin, 3 rows of 4 + newline, end")
    a1.set_xlabel(f"token index (4 text, {n} image tokens, 4 text)")
    a1.set_title("XD-RoPE (xdrope), 4 axes", fontsize=10)
    a1.legend(loc="upper left", fontsize=8)
    a1.grid(alpha=0.3)
    return save(plt, fig, out_dir, "multimodal-ids", "VideoRoPE and XD-RoPE: position ids per axis",
                {"video": video, "xdrope": xd, "temporal_stride": temporal_stride})
