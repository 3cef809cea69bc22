"""Multi-axis positions (SequenceInfo.axes, multimodal_axes) and the encodings that read them
(mrope, rope_axial, rope_mixed): bad configs and positions refused by name."""

from __future__ import annotations

import torch

from posenc import SequenceInfo, build
from posenc.positions import multimodal_axes, video_rope_axes, xdrope_axes

from . import Case


def _continue_cache_without_axes() -> None:
    from posenc.model import Transformer
    from posenc.model_config import ModelConfig

    model = Transformer(ModelConfig(vocab_size=16, d_model=16, n_layer=1, n_head=2, encoding="mrope"))
    cache = model.new_cache()
    axes = multimodal_axes([1, (1, 2, 2)])[:, None]
    model(torch.zeros(1, 5, dtype=torch.long), SequenceInfo(torch.arange(5)[None], axes=axes), cache=cache)
    model(torch.zeros(1, 1, dtype=torch.long), SequenceInfo.from_offset(1, 1, 5), cache=cache)


def _far_2d(name: str, far: torch.Tensor) -> None:
    enc = build(name, d_model=16, num_heads=2)
    q = torch.zeros(1, 2, 1, 8)
    enc.rotate(q, q, far, far)


def _compiled_axial_model() -> str:
    """A whole rope_axial model compiled with inductor, on 20 raster patches of a 16-wide grid."""
    from posenc.model import Transformer
    from posenc.model_config import ModelConfig

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=16, d_model=16, n_layer=1, n_head=2, encoding="rope_axial")).eval()
    x = torch.randint(0, 16, (1, 20))
    torch._dynamo.reset()
    with torch.no_grad():
        diff = (torch.compile(model)(x) - model(x)).abs().max().item()
    return f"compiled logits equal eager within 1e-5: {diff < 1e-5}"


A = "multi-axis positions"
_POS = torch.zeros(2, 5, dtype=torch.long)
CASES = [
    Case(A, "axes of another length than the positions", r"axes must have shape \(A, B, T\) = \(A, 2, 5\) with A >= 1, got \(3, 2, 4\)",
         run=lambda: SequenceInfo(_POS, axes=torch.zeros(3, 2, 4, dtype=torch.long))),
    Case(A, "float axes", r"axes must be an integer tensor \(int64 or int32\), got torch.float32", error=TypeError,
         run=lambda: SequenceInfo(_POS, axes=torch.zeros(3, 2, 5))),
    Case(A, "a negative axis position", r"axes must be >= 0, got a minimum of -1",
         run=lambda: SequenceInfo(_POS, axes=torch.full((3, 2, 5), -1))),
    Case(A, "a vision block of two sizes", r"a vision block must be a \(t, h, w\) or \(t, h, w, interval\) tuple, got \(1, 2\)",
         run=lambda: multimodal_axes([2, (1, 2)])),
    Case(A, "a video's time interval of 0", r"a vision block's interval must be a finite number > 0, got 0",
         run=lambda: multimodal_axes([(2, 1, 1, 0)])),
    Case(A, "a video's frames spaced past float32's exact integers", r"a vision block's last frame time \(t - 1\) \* interval must be below 2\*\*24, got \(3 - 1\) \* 10000000\.0",
         run=lambda: multimodal_axes([(3, 1, 1, 1e7)])),
    Case(A, "a KV cache of tokens with axes continued by tokens without", r"the cached tokens carry 3 position axes but the new ones 1",
         run=_continue_cache_without_axes),
    Case(A, "mrope_section that does not sum to the pairs", r"mrope_section must sum to the rotated pairs rotary_dim / 2 = 64, got \[16, 24, 25\]",
         run=lambda: build("mrope", d_model=1536, num_heads=12, mrope_section=[16, 24, 25])),
    Case(A, "an interleaved mrope_section too wide for the pairs", r"mrope_section \[4, 30, 30\] does not fit 64 interleaved pairs",
         run=lambda: build("mrope", d_model=1536, num_heads=12, mrope_section=[4, 30, 30], mrope_interleaved=True)),
    Case(A, "mrope on a 2-D patch grid's axes", r"mrope reads 3 position axes \(time, height, width\), but seq.axes has 2",
         run=lambda: build("mrope", d_model=16, num_heads=2).position_ids(SequenceInfo.from_grid(2, 2))),
    Case(A, "rope_axial with a head that does not split into rows and columns", r"rope_axial needs head_dim divisible by 4 .*got 6",
         run=lambda: build("rope_axial", d_model=12, num_heads=2)),
    Case(A, "rope_mixed grid_width=0", r"grid_width must be in \[1, 1048576\], got 0",
         run=lambda: build("rope_mixed", d_model=16, num_heads=2, grid_width=0)),    Case(A, "SequenceInfo.from_grid(2**20, 2**20) (10**12 patches)",
         r"^height \* width must be <= 16777216 tokens \(2\*\*24, posenc.limits.MAX_TOKENS\), got 1099511627776$",
         run=lambda: SequenceInfo.from_grid(2**20, 2**20)),
    Case(A, "multimodal_axes([10**12]) (a text block of 10**12 tokens)",
         r"^the tokens of blocks must be <= 16777216 tokens \(2\*\*24, posenc.limits.MAX_TOKENS\), got 1000000000000$",
         run=lambda: multimodal_axes([10**12])),
    Case(A, "multimodal_axes with a 10**4 x 10**4 x 10**4 video",
         r"^the tokens of blocks must be <= 16777216 tokens .*got 1000000000002$",
         run=lambda: multimodal_axes([2, (10**4, 10**4, 10**4)])),
    Case(A, "rope_axial at raster position 2**53 (float64 angles no longer hold every integer)",
         r"^positions must be <= 9007199254740991 \(2\*\*53 - 1.*got 9007199254740992$",
         run=lambda: _far_2d("rope_axial", torch.tensor([[2**53]]))),
    Case(A, "rope_mixed at a column axis of 2**53",
         r"^positions must be <= 9007199254740991 \(2\*\*53 - 1.*got 9007199254740992$",
         run=lambda: _far_2d("rope_mixed", torch.tensor([[[0]], [[2**53]]]))),
    Case(A, "a whole rope_axial model compiled with inductor, past the grid width (20 patches, width 16)",
         r"^compiled logits equal eager within 1e-5: True$", run=_compiled_axial_model, error=None),
    Case(A, "video_rope_axes with temporal_stride=0", r"^temporal_stride must be in \[1, 16777216\], got 0$",
         run=lambda: video_rope_axes([2, (1, 2, 2)], temporal_stride=0)),
    Case(A, "video_rope_axes with a (t, h, w, interval) block (VideoRoPE spaces frames by temporal_stride)",
         r"^a VideoRoPE vision block must be a \(t, h, w\) tuple \(its frames are temporal_stride apart\), "
         r"got \(1, 2, 2, 1.5\)$", run=lambda: video_rope_axes([2, (1, 2, 2, 1.5)])),
    Case(A, "mrope with both video_rope and mrope_interleaved",
         r"^mrope_interleaved and video_rope are two layouts of the pairs: set at most one, got both True$",
         run=lambda: build("mrope", d_model=64, num_heads=2, video_rope=True, mrope_interleaved=True)),
    Case(A, "xdrope_axes with an image 0 patches wide", r"^an image block's w must be >= 1, got 0$",
         run=lambda: xdrope_axes([2, (2, 0)])),
    Case(A, "xdrope_axes with num_axes=5", r"^num_axes must be in \[3, 4\], got 5$",
         run=lambda: xdrope_axes([2, (1, 2)], num_axes=5)),
    Case(A, "xdrope with a section that does not sum to the pairs",
         r"^xdrope_section must sum to the rotated pairs rotary_dim / 2 = 16, got \[4, 4, 4, 5\] \(sum 17\)$",
         run=lambda: build("xdrope", d_model=64, num_heads=2, xdrope_section=[4, 4, 4, 5])),
]
