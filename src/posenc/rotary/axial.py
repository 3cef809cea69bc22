"""2-D rotary embeddings for image patches: RoPE-Axial and RoPE-Mixed (Heo et al. 2024,
"Rotary Position Embedding for Vision Transformer", ECCV 2024, §3.2-3.3).

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D); positions (B, T) or axes (2, B, T) = (row y,
column x); P = D/2 rotated pairs, Q = D/4.

A patch at (y, x) turns pair j of head h by

    angle_{h,j} = F[0, h, j] * y + F[1, h, j] * x,

so q·k depends on (Δy, Δx) = (y_q - y_k, x_q - x_k) only (each pair is RoPE's rotation by a
linear function of the two coordinates).

* ``rope_axial``: fixed frequencies theta_k = base^(-k/Q) = base^(-4k/D), k < Q: pairs [0, Q)
  turn with the row, pairs [Q, 2Q) with the column (F is 0 across). Heo et al. take base 100.
  The order of the two halves is rotary-embedding-torch's ``get_axial_freqs(H, W)`` (rows
  first); the authors' code puts columns first, a fixed permutation of the channels that no
  trained weight can tell from this one.
* ``rope_mixed``: F (2, H, P) learned per head, so a pair can turn along any direction of the
  image (diagonals as well as rows and columns). Initialised as the paper's
  ``init_random_2d_freqs``: magnitudes theta_k (base 10), per head a random direction phi for
  the first Q pairs and phi + pi/2 for the others: F[1] = theta cos(.), F[0] = theta sin(.).

Positions: the sequence's axes (``SequenceInfo.from_grid``) when it carries them; plain (B, T)
positions are patches in raster order on a grid ``grid_width`` wide, (y, x) = (p // w, p % w).
Layout ``interleaved`` (pairs (2j, 2j+1): the paper's complex pairs, rotary-embedding-torch) or
``half``. Angles are float64 (the learned F cast up), cos/sin float32, results in the input dtype.

Grouped-query attention: a key is rotated once for its group of query heads, so under
``rope_mixed`` each group uses its first query head's frequencies (for q and k alike: logits
stay relative); with one key head per query head every head has its own, as in the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_choice, check_int, check_positive
from ..encoding import Dims, PositionalEncoding
from ..limits import Float32Params, check_positions
from ..literature import LEARNED, NORMS_PRESERVED, ROPE_FEATURES, UNTRAINED
from ..positions import SequenceInfo, raster_axes
from ..registry import register
from . import cpu_rope
from .functional import QKTables, rotate_qk
from .layout import LAYOUTS
from .rope import MAX_TABLE_POSITIONS, PositionTable

__all__ = ["AxialConfig", "AxialRope", "MixedConfig", "MixedRope", "grid_coordinates", "axial_frequencies"]

# What Heo et al. 2024 claim, and why the probe's 1-D positions cannot show a 2-D relative encoding.
_HEO = "Heo et al. 2024 (RoPE for ViT)"
_RASTER = ": q·k depends on (Δy, Δx); the probe's 1-D positions are raster patches, and i - j does not fix (Δy, Δx)"
_RASTER_SHIFT = "raster positions: p -> p + k moves (y, x) by a step that depends on p's column"

#: The widest raster grid a (B, T) position is folded onto.
MAX_GRID_WIDTH = 1 << 20


def grid_coordinates(positions: Tensor, grid_width: int) -> Tensor:
    """(B, T) raster positions -> (2, B, T) (row, column) on a grid ``grid_width`` wide;
    (2, B, T) axes pass unchanged."""
    if positions.dim() == 3:
        if positions.shape[0] != 2:
            raise ValueError(f"2-D RoPE positions must have shape (B, T) or (2, B, T), got {tuple(positions.shape)}")
        return positions
    if positions.dim() != 2:
        raise ValueError(f"2-D RoPE positions must have shape (B, T) or (2, B, T), got {tuple(positions.shape)}")
    return raster_axes(positions, grid_width)  # (2, B, T); not positions // grid_width, see raster_axes


def axial_frequencies(head_dim: int, base: float) -> Tensor:
    """RoPE-Axial's F (2, P) float64: theta_k = base^(-4k/D) on pairs [0, Q) for the row and
    on [Q, 2Q) for the column, 0 elsewhere."""
    q = head_dim // 4
    theta = base ** (-torch.arange(q, dtype=torch.float64) / q)  # (Q,)
    zero = torch.zeros(q, dtype=torch.float64)
    return torch.stack([torch.cat([theta, zero]), torch.cat([zero, theta])])  # (2, P)


def _cos_sin(coords: Tensor, freqs: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin float32 of sum_a coords[a] * freqs[a]: coords (2, B, T), freqs (2, ..., P) with
    the middle dims broadcast between B and T: (2, P) -> (B, T, P); (2, H, P) -> (B, H, T, P)."""
    c = coords.to(torch.float64)
    f = freqs.to(device=coords.device, dtype=torch.float64)
    if f.dim() == 2:
        ang = c[0, ..., None] * f[0] + c[1, ..., None] * f[1]  # (B, T, P)
    else:
        ang = c[0, :, None, :, None] * f[0, :, None] + c[1, :, None, :, None] * f[1, :, None]  # (B, H, T, P)
    return ang.cos().float(), ang.sin().float()


def _rotate_heads(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """x (B, h, T, D) turned by per-head cos/sin (B|1, h, T, D/2) float32, in float32 (float64
    for float64 x), rounded once to x's dtype."""
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(dt)
    cos, sin = cos.to(dt), sin.to(dt)
    if layout == "half":
        a, b = xf.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)
    pairs = xf.unflatten(-1, (-1, 2))  # (B, h, T, D/2, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2).to(x.dtype)


def _fused_heads(q: Tensor, k: Tensor, cos_q: Tensor, cos_k: Tensor):
    """The fused CPU rotary kernel's per-head rotation (:mod:`posenc.rotary.cpu_rope`,
    ``rotate_heads_qk``: :func:`_rotate_heads`' arithmetic, within a rounding) when it is built
    and applies: float32 CPU q and k with a contiguous last dim, no autograd (a decoding step, a
    no-grad forward), outside torch.compile; the tables are :func:`_cos_sin`'s (float32, sin
    beside cos; the kernel checks their shapes). None otherwise: :func:`_rotate_heads`."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or cos_q.requires_grad or cos_k.requires_grad):
        return None
    f32 = torch.float32
    if (q.dtype is not f32 or k.dtype is not f32 or cos_q.dtype is not f32 or cos_k.dtype is not f32
            or q.stride(-1) != 1 or k.stride(-1) != 1 or cos_q.stride(-1) != 1 or cos_k.stride(-1) != 1):
        return None
    return cpu_rope.kernel_on(q)


def _check_head_dim(name: str, dims: Dims) -> None:
    if dims.head_dim % 4:
        raise ValueError(f"{name} needs head_dim divisible by 4 (pairs for rows and columns), got {dims.head_dim}")


@dataclass
class AxialConfig(EncodingConfig):
    """Config of :class:`AxialRope`.

    Attributes:
        base: theta_k = base^(-4k/D); > 0 and != 1. Heo et al. 2024 use 100.
        layout: "interleaved" (the paper's complex pairs) or "half".
        grid_width: the raster width that (B, T) positions are folded onto, in [1, 2**20].
    """

    base: float = 100.0
    layout: str = "interleaved"
    grid_width: int = 16

    def validate(self) -> None:
        check_positive("base", self.base)
        if self.base == 1.0:
            raise ValueError("base must be != 1 (every pair would turn at the same rate), got 1.0")
        check_choice("layout", self.layout, LAYOUTS)
        check_int("grid_width", self.grid_width, minimum=1, maximum=MAX_GRID_WIDTH)


class _Rope2D(PositionalEncoding):
    """What the two 2-D encodings share: positions, per-forward state, the hook."""

    position_axes = 2  # row, column

    def position_ids(self, seq: SequenceInfo) -> Tensor:
        """``seq.axes`` (2, B, T) = (row, column) when given, else ``seq.positions`` (B, T) (raster)."""
        if seq.axes is None:
            return seq.positions
        if seq.axes.shape[0] != 2:
            raise ValueError(f"{self.name} reads 2 position axes (row, column), but seq.axes has {seq.axes.shape[0]}")
        return seq.axes

    def coordinates(self, positions: Tensor) -> Tensor:
        """(2, B, T) (row, column) of (B, T) raster positions or (2, B, T) axes, each in
        [0, 2**53 - 1] (float64 angles; checked in eager mode, as RoPE's)."""
        coords = grid_coordinates(positions, self.config.grid_width)
        check_positions(positions)
        return coords

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:  # pragma: no cover - abstract
        """cos, sin float32 at (B, T) raster positions or (2, B, T) axes (each subclass's shape)."""
        raise NotImplementedError

    def _turn(self, q: Tensor, k: Tensor, tables: QKTables) -> tuple[Tensor, Tensor]:
        """q by q's tables and k by k's (:meth:`cos_sin`'s)."""  # pragma: no cover - abstract
        raise NotImplementedError

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> QKTables:
        """cos/sin at the query positions, for q and the new keys (self-attention): one
        :class:`~posenc.rotary.functional.QKTables` for every layer of the forward (the
        rotation's rolled tables, checks and plan are then made once)."""
        return QKTables.shared(*self.cos_sin(q_pos))

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: QKTables | None = None) -> tuple[Tensor, Tensor]:
        """Rotate q (B, H, Tq, D) at q_pos and k (B, Hkv, Tk, D) at k_pos ((B, T) or (2, B, T));
        ``state``: :meth:`prepare`'s, for keys at the query positions."""
        tables = QKTables(*self.cos_sin(q_pos), *self.cos_sin(k_pos)) if state is None else state
        if k.shape[-2] != tables.cos_k.shape[-2]:
            raise ValueError(
                f"state is prepare()'s, for keys at the {tables.cos_k.shape[-2]} query positions, but k has "
                f"{k.shape[-2]}; pass state=None for keys at other positions"
            )
        return self._turn(q, k, tables)


@register(
    "rope_axial",
    family="rotary",
    summary="2-D axial RoPE for image patches: rows and columns on separate halves of the pairs",
    paper="Heo et al. 2024, Rotary Position Embedding for Vision Transformer (RoPE-Axial)",
    claims={
        "absolute": (True, _HEO + ": a rotation per patch (y, x)"),
        "relative": (False, _HEO + _RASTER),
        "linear_map": (False, _RASTER_SHIFT),
        "bounded": (True, NORMS_PRESERVED),
        "extrapolation": (True, _HEO + ": defined at every patch, extrapolates to larger images"),
        "linear_attention": (True, ROPE_FEATURES),
    },
)
class AxialRope(_Rope2D):
    """RoPE-Axial; see the module docstring.

    >>> enc = posenc.build("rope_axial", d_model=384, num_heads=6)
    >>> seq = SequenceInfo.from_grid(14, 14)  # a 224-pixel image in 16-pixel patches
    """

    Config = AxialConfig

    def __init__(self, config: AxialConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        _check_head_dim("rope_axial", dims)
        self.freqs = axial_frequencies(dims.head_dim, config.base)  # (2, P) float64, CPU: not a buffer

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin (B, T, D/2) float32 at (B, T) raster positions or (2, B, T) axes."""
        return _cos_sin(self.coordinates(positions), self.freqs)

    def prepare_cached(self, q_pos: Tensor, k_pos: Tensor, memo: dict) -> QKTables:
        """:meth:`prepare` for a decoding step: cos and sin at raster positions looked up in a
        table of positions [0, P) kept in the cache's ``memo`` (a
        :class:`~posenc.rotary.rope.PositionTable`, as RoPE's, grown to the next power of two past
        the largest position), not computed from grid coordinates every step. The table's rows are
        :meth:`cos_sin`'s, so the result equals :meth:`prepare`'s. Axes (2, B, T), positions
        past the table's limit and traced forwards take :meth:`prepare`."""
        if q_pos.dim() != 2 or q_pos.numel() == 0 or q_pos.is_floating_point() or torch.compiler.is_compiling():
            return self.prepare(q_pos, k_pos)
        hi = check_positions(q_pos)
        if hi >= MAX_TABLE_POSITIONS:
            return self.prepare(q_pos, k_pos)
        if q_pos.shape[0] > 1 and q_pos.stride(0) == 0:
            q_pos = q_pos[:1]  # one row for the whole batch (from_offset): looked up once
        table = PositionTable.covering(memo, ("table", q_pos.device), hi,
                                       lambda p: tuple(t[0] for t in self.cos_sin(p[None])), q_pos.device)  # (P, D/2)
        rows = table.rows(q_pos, hi)
        return QKTables.shared(*rows.columns, rolled=rows.rolled)

    def _turn(self, q, k, tables):
        return rotate_qk(q, k, tables, self.config.layout)


@dataclass
class MixedConfig(AxialConfig):
    """Config of :class:`MixedRope`: :class:`AxialConfig`'s fields, with ``base`` (default 10, as
    Heo et al. 2024) setting the magnitudes of the initial frequencies, and

    Attributes:
        learned: train the frequencies (the paper's RoPE-Mixed); False keeps the random
            initial directions fixed.
    """

    base: float = 10.0
    learned: bool = True


@register(
    "rope_mixed",
    family="rotary",
    summary="2-D RoPE with learned per-head frequencies mixing rows and columns (RoPE-Mixed)",
    paper="Heo et al. 2024, Rotary Position Embedding for Vision Transformer (RoPE-Mixed)",
    claims={
        "absolute": (True, _HEO + ": a rotation per patch (y, x) by learned frequencies"),
        "relative": (False, _HEO + _RASTER),
        "linear_map": (False, _RASTER_SHIFT),
        "bounded": (True, NORMS_PRESERVED),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, _HEO + ": defined at every patch, extrapolates to larger images"),
        "linear_attention": (True, ROPE_FEATURES),
    },
)
class MixedRope(Float32Params, _Rope2D):
    """RoPE-Mixed; see the module docstring. ``freqs`` (2, H, D/2) float32 is a parameter
    (a buffer with ``learned=False``), kept float32 under low-precision casts."""

    Config = MixedConfig
    float32_params = ("freqs",)

    def __init__(self, config: MixedConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        _check_head_dim("rope_mixed", dims)
        H, q = dims.num_heads, dims.head_dim // 4
        theta = config.base ** (-torch.arange(q, dtype=torch.float64) / q)  # (Q,)
        phi = torch.rand(H, 1, dtype=torch.float64) * 2 * math.pi  # (H, 1): one direction per head
        ang = torch.cat([phi.expand(H, q), phi.expand(H, q) + math.pi / 2], dim=1)  # (H, P)
        theta = torch.cat([theta, theta])  # (P,)
        freqs = torch.stack([theta * ang.sin(), theta * ang.cos()]).float()  # (2, H, P): F[0] row y, F[1] column x
        if config.learned:
            self.freqs = nn.Parameter(freqs)
        else:
            self.register_buffer("freqs", freqs, persistent=True)

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin (B, H, T, D/2) float32 at (B, T) raster positions or (2, B, T) axes."""
        return _cos_sin(self.coordinates(positions), self.freqs)

    def _turn(self, q, k, tables):
        cq, sq, ck, sk = tables.cos_q, tables.sin_q, tables.cos_k, tables.sin_k
        layout, H, Hkv = self.config.layout, q.shape[1], k.shape[1]
        if cq.shape[1] != H or H % Hkv:
            raise ValueError(f"rope_mixed has frequencies for {cq.shape[1]} heads, got q with {H} and k with {Hkv}")
        if H != Hkv:  # a key serves its group of H // Hkv query heads: the group's first head's frequencies
            group = torch.arange(H, device=cq.device) // (H // Hkv) * (H // Hkv)  # (H,)
            cq, sq = cq.index_select(1, group), sq.index_select(1, group)
            ck, sk = ck[:, :: H // Hkv], sk[:, :: H // Hkv]  # (B, Hkv, Tk, P)
        ext = _fused_heads(q, k, cq, ck)
        if ext is not None:
            return ext.rotate_heads_qk(q, k, cq, sq, ck, sk, layout == "interleaved")
        return _rotate_heads(q, cq, sq, layout), _rotate_heads(k, ck, sk, layout)
