"""DINOv3's 2-D RoPE: axial RoPE on patch centres normalised to [-1, 1], with the coordinate
augmentations it trains with (Siméoni et al. 2025, "DINOv3", section 3; facebookresearch/dinov3
``RopePositionEmbedding``; transformers 5.24 ``DINOv3ViTRopePositionEmbedding``, the reference
of tests/test_dinov3.py).

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D); positions (B, T) raster or axes (2, B, T) =
(row y, column x); P = D/2 pairs, Q = D/4.

A patch at (y, x) of a grid ``grid_height`` x ``grid_width`` sits at the normalised centre

    u_y = 2 (y + 1/2) / grid_height - 1,   u_x = 2 (x + 1/2) / grid_width - 1,

and pair k < Q turns by 2 pi u_y theta_k, pair Q + k by 2 pi u_x theta_k, theta_k = base^(-4k/D)
(base 100; rows on the first half of the pairs, as ``rope_axial``, half layout as DINOv3). So
the logits depend on (Δy / grid_height, Δx / grid_width): the same relative *fraction* of the
image, not the same number of patches; an image of another size is read at the coordinates it
was trained on (set the grid to the image's patches).

Training augmentation (only in ``train()`` mode, each when set; one draw per forward, shared by
q and k and by every layer through :meth:`prepare`, from torch's generator in the order
shift, jitter, rescale, as the reference draws them): ``shift`` adds one uniform value in
[-shift, shift] per axis; ``jitter`` multiplies each axis by a log-uniform value in
[1/jitter, jitter]; ``rescale`` multiplies both by one log-uniform value in [1/rescale,
rescale] (DINOv3 trains with rescale 2; transformers' config default).

Prefix tokens (DINOv3's class and register tokens) are not rotated by the model: they are not
patches of the grid, and a model with them rotates its patch tokens only (the reference splits
them off before rotating). Angles are float64, cos/sin float32, results in the input dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import check_int
from ..encoding import Dims
from ..literature import NORMS_PRESERVED, ROPE_FEATURES
from ..registry import register
from .axial import MAX_GRID_WIDTH, AxialConfig, AxialRope, _cos_sin
from .functional import QKTables

__all__ = ["DinoV3Config", "DinoV3Rope", "normalized_centres"]

_DINO = "Siméoni et al. 2025 (DINOv3)"


@dataclass
class DinoV3Config(AxialConfig):
    """Config of :class:`DinoV3Rope`: :class:`~posenc.rotary.axial.AxialConfig`'s fields
    (``base`` 100, ``layout`` half as DINOv3; ``grid_width`` also folds (B, T) raster positions),
    and

    Attributes:
        grid_height: the rows of patches the coordinates are normalised over, in [1, 2**20].
        shift: training: add a uniform value in [-shift, shift] per axis; None: off. > 0.
        jitter: training: multiply each axis by a log-uniform value in [1/jitter, jitter]; > 1.
        rescale: training: multiply both axes by one log-uniform value in [1/rescale, rescale]; > 1.
    """

    layout: str = "half"
    grid_height: int = 16
    shift: float | None = None
    jitter: float | None = None
    rescale: float | None = None

    def validate(self) -> None:
        super().validate()
        check_int("grid_height", self.grid_height, minimum=1, maximum=MAX_GRID_WIDTH)
        if self.shift is not None and not (isinstance(self.shift, (int, float)) and 0 < self.shift < math.inf):
            raise ValueError(f"shift must be a number > 0 (or None: no shift), got {self.shift!r}")
        for name in ("jitter", "rescale"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and 1 < v < math.inf):
                raise ValueError(f"{name} must be a number > 1 (or None: off), got {v!r}")


def normalized_centres(coords: Tensor, height: int, width: int) -> Tensor:
    """(2, B, T) integer (row, column) -> float64 patch centres in [-1, 1] of a
    ``height`` x ``width`` grid (outside it for patches past its edge)."""
    c = coords.to(torch.float64)
    size = torch.tensor([height, width], dtype=torch.float64, device=c.device).view(2, 1, 1)
    return 2.0 * (c + 0.5) / size - 1.0


@register(
    "rope_dinov3",
    family="rotary",
    summary="DINOv3's 2-D RoPE: axial RoPE on patch centres normalised to [-1, 1], with training augmentation",
    paper="Siméoni et al. 2025, DINOv3 (facebookresearch/dinov3 RopePositionEmbedding)",
    claims={
        "absolute": (True, _DINO + ": a rotation per patch centre"),
        "relative": (False, _DINO + ": q·k depends on (Δy / grid_height, Δx / grid_width); the probe's 1-D positions "
                     "are raster patches, and i - j does not fix (Δy, Δx)"),
        "linear_map": (False, "raster positions: p -> p + k moves (y, x) by a step that depends on p's column"),
        "bounded": (True, NORMS_PRESERVED),
        "extrapolation": (True, _DINO + ": coordinates normalised to the image, so a larger image is read "
                          "within the trained range"),
        "linear_attention": (True, ROPE_FEATURES),
    },
)
class DinoV3Rope(AxialRope):
    """DINOv3's RoPE; see the module docstring.

    >>> enc = posenc.build("rope_dinov3", d_model=384, num_heads=6, grid_height=14, grid_width=14)
    >>> seq = SequenceInfo.from_grid(14, 14)  # a 224-pixel image in 16-pixel patches
    """

    Config = DinoV3Config

    def __init__(self, config: DinoV3Config, dims: Dims) -> None:
        super().__init__(config, dims)
        self.freqs = 2 * math.pi * self.freqs  # (2, P) float64: one turn per unit of the normalised range

    def augmentation(self, device: torch.device | str) -> Tensor | None:
        """One forward's draw (shift y, shift x, scale y, scale x) float64 (4,), or None outside
        training or with no augmentation set; drawn in float32 from torch's generator as the
        reference draws it (shift (1, 2), jitter (1, 2), rescale (1,))."""
        if not self._augmenting:
            return None
        c = self.config
        shift = torch.zeros(2, dtype=torch.float32, device=device)
        scale = torch.ones(2, dtype=torch.float32, device=device)
        if c.shift is not None:
            shift = torch.empty((1, 2), dtype=torch.float32, device=device).uniform_(-c.shift, c.shift)[0]
        if c.jitter is not None:
            r = math.log(c.jitter)
            scale = scale * torch.empty((1, 2), dtype=torch.float32, device=device).uniform_(-r, r).exp()[0]
        if c.rescale is not None:
            r = math.log(c.rescale)
            scale = scale * torch.empty(1, dtype=torch.float32, device=device).uniform_(-r, r).exp()
        return torch.cat([shift, scale]).to(torch.float64)

    @property
    def _augmenting(self) -> bool:
        c = self.config
        return self.training and not (c.shift is None and c.jitter is None and c.rescale is None)

    def cos_sin(self, positions: Tensor, augmentation: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """cos, sin (B, T, D/2) float32 at (B, T) raster positions or (2, B, T) axes, the patch
        centres normalised (and moved by ``augmentation``, :meth:`augmentation`'s draw)."""
        u = normalized_centres(self.coordinates(positions), self.config.grid_height, self.config.grid_width)
        if augmentation is not None:
            a = augmentation.to(u.device)
            u = (u + a[:2].view(2, 1, 1)) * a[2:].view(2, 1, 1)
        return _cos_sin(u, self.freqs)

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> QKTables:
        """cos/sin at the query positions, for q and the new keys, with this forward's one draw."""
        return QKTables.shared(*self.cos_sin(q_pos, self.augmentation(q_pos.device)))

    def prepare_cached(self, q_pos: Tensor, k_pos: Tensor, memo: dict) -> QKTables:
        """:class:`~posenc.rotary.axial.AxialRope`'s table lookup for a decoding step when no
        augmentation is drawn (eval, or none set); a forward in training with one set draws it
        (:meth:`prepare`)."""
        if self._augmenting:
            return self.prepare(q_pos, k_pos)
        return super().prepare_cached(q_pos, k_pos, memo)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state=None) -> tuple[Tensor, Tensor]:
        """As :class:`~posenc.rotary.axial.AxialRope`'s, one draw for q and k when no state is given."""
        if state is None:
            aug = self.augmentation(q_pos.device)
            return self._turn(q, k, QKTables(*self.cos_sin(q_pos, aug), *self.cos_sin(k_pos, aug)))
        return super().rotate(q, k, q_pos, k_pos, state)
