"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer").

RoPE plus an exponential decay per rotated pair: q at position m is rotated and scaled by
zeta_j^(m / scale_base), k at position n rotated and scaled by zeta_j^(-n / scale_base), with
zeta_j = (2j/r + gamma) / (1 + gamma) in (0, 1). The score of pair j picks up
zeta_j^((m - n) / scale_base): a function of m - n only, which decays with distance for
m > n (keys in the past), so long-range terms fade smoothly (the paper's "attention
resolution").

Bidirectional use: for a key in the future (n > m) the factor is zeta_j^(-(n - m)/scale_base)
> 1, so an encoder amplifies the terms of distant future keys instead of damping them. The
paper uses xPos in causal language models (with blockwise causal attention); use it with
``causal=True`` unless you mean this.

Range: k's scale zeta_0^(-n / scale_base) grows and q's zeta_0^(m / scale_base) shrinks
exponentially (zeta_0 = gamma / (1 + gamma) is the smallest). Only their product, the score's
zeta^((m - n)/scale_base), is bounded, but rotated q and k are stored separately in the
model's dtype (and k in the KV cache, so the scales cannot be re-centred per call). So a
position is refused unless both scales are normal numbers of the dtype they are stored in:
n <= :func:`xpos_max_position` = floor(scale_base * min(ln max, -ln tiny) / -ln zeta_0), with
max/tiny those of the rotated tensors' dtype (float32 for float32/float64 inputs, whose cos/sin
are float32). With gamma = 0.4 and scale_base = 512 that is 3966 in float16 (q's scale goes
subnormal, losing bits, from 3967; k's passes float16's max 65504 at 4533, and NaN logits
follow), 35694 in bfloat16 and float32. The error names the largest safe position and the
scale_base a length needs. Below that position a key can still overflow float16 when
|k| * scale > 65504 (scale up to 16383 there): in float16 the rotated keys are checked and an
overflow is an error too. Under torch.compile these checks (host syncs) are skipped: a scale
past the range is inf or 0 there.

The scaled cos/sin of q and of k are columns of RoPE's cached position table
(:meth:`XPos.table_columns`), looked up once per forward (``prepare``, an :class:`XPosState`
shared by every layer, with the rolled rows a decoding step rotates with), and rotated the
way :func:`~posenc.rotary.functional.rotation_plan` picks, as RoPE's are.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import check_positive
from ..literature import ROPE_FEATURES
from ..registry import register
from .functional import QKTables, rotate_qk
from .rope import RotaryConfig, RotaryEmbedding

__all__ = ["XPosConfig", "XPos", "XPosState", "xpos_max_position", "xpos_scale"]


@dataclass(init=False, eq=False, repr=False)  # RotaryConfig's __init__ takes the scaling parameters too
class XPosConfig(RotaryConfig):
    """RoPE's config plus ``scale_base`` (the paper's 512) and ``gamma`` (0.4)."""

    scale_base: float = 512.0
    gamma: float = 0.4

    def validate(self) -> None:
        super().validate()
        check_positive("scale_base", self.scale_base)
        check_positive("gamma", self.gamma)


def xpos_scale(positions: Tensor, rotary_dim: int, scale_base: float, gamma: float = 0.4) -> Tensor:
    """zeta_j^(m / scale_base) at positions m (B, T) -> (B, T, r/2) float64."""
    j = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=positions.device)
    zeta = (j / rotary_dim + gamma) / (1 + gamma)  # (r/2,) in (gamma/(1+gamma), 1)
    return zeta ** (positions.to(torch.float64)[..., None] / scale_base)


@functools.lru_cache(maxsize=None)
def _overflows_easily(dtype: torch.dtype) -> bool:
    """Whether rotated keys of ``dtype`` can overflow below the largest allowed position (float16)."""
    return torch.finfo(_storage_dtype(dtype)).max < 1e6


def _storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the scaled rotation is held in: the input's, but at most float32's range
    (cos/sin times the scale are float32)."""
    if not dtype.is_floating_point or torch.finfo(dtype).max > torch.finfo(torch.float32).max:
        return torch.float32
    return dtype


@functools.lru_cache(maxsize=64)  # a pure function of its arguments, asked once per layer and forward
def xpos_max_position(scale_base: float, gamma: float = 0.4, dtype: torch.dtype = torch.float32) -> int:
    """The largest position n at which every xPos scale zeta_j^(+-n / scale_base) is a normal
    number of ``dtype`` (the rotated tensors' dtype; float64 counts as float32).

    >>> xpos_max_position(512.0, 0.4, torch.float16)
    3966
    """
    check_positive("scale_base", scale_base)
    check_positive("gamma", gamma)
    fi = torch.finfo(_storage_dtype(dtype))
    budget = min(math.log(fi.max), -math.log(fi.tiny))  # ln of the largest safe scale factor
    # zeta_0 = gamma / (1 + gamma) is the smallest zeta; the 1e-12 keeps the bound strict.
    return math.floor(scale_base * budget * (1 - 1e-12) / math.log((1 + gamma) / gamma))


@register(
    "xpos",
    family="rotary",
    summary="RoPE with an exponential decay zeta^((m-n)/scale_base) on each pair's score",
    paper="Sun et al. 2022, A Length-Extrapolatable Transformer",
    claims={
        "absolute": (True, "Sun et al. 2023: a scaled rotation per position"),
        "relative": (True, "Sun et al. 2023: zeta^(i - j) R_{i-j}"),
        "linear_map": (True, "Sun et al. 2023: zeta^k R_k"),
        "bounded": (False, "Sun et al. 2023: keys scale by zeta^(-n) by design"),
        "decay": (True, "Sun et al. 2023: the scale adds decay to RoPE's"),
        "extrapolation": (True, "Sun et al. 2023"),
        "linear_attention": (True, ROPE_FEATURES),
    },
)
class XPos(RotaryEmbedding):
    """xPos as a ``rotate`` hook: q scaled by zeta^(m/scale_base), k by zeta^(-n/scale_base)."""

    Config = XPosConfig

    table_width = 4

    def table_columns(self, positions: Tensor, inv_freq: Tensor, factor: float) -> tuple[Tensor, ...]:
        """q's scaled cos/sin (zeta^(m/scale_base)) and k's (zeta^(-n/scale_base)) at ``positions``,
        (..., r/2) float32 each, kept in RoPE's table cache: angles and scales in float64, one
        rounding to float32."""
        ang = positions.to(torch.float64)[..., None] * inv_freq.to(positions.device)  # (..., r/2)
        cos, sin = ang.cos(), ang.sin()
        out = []
        for sign in (1.0, -1.0):
            scale = xpos_scale(positions, self.rotary_dim, self.config.scale_base / sign, self.config.gamma) * factor
            out += [(cos * scale).float(), (sin * scale).float()]
        return tuple(out)

    def _state(self, q_pos: Tensor, k_pos: Tensor) -> "XPosState":
        """q's tables at q_pos, k's at k_pos (one lookup when they are one tensor, as from
        :meth:`prepare`); positions checked (>= 0) there."""
        seq_len = self.current_length(q_pos, k_pos)
        q_rows = self.rows(q_pos, seq_len)
        if k_pos is q_pos:
            return XPosState(q_rows.hi, QKTables(*q_rows.columns, rolled=q_rows.rolled))
        k_rows = self.rows(k_pos, seq_len)
        his = [r.hi for r in (q_rows, k_rows) if r.hi is not None]
        hi = None if torch.compiler.is_compiling() else max(his, default=0)
        return XPosState(hi, QKTables(*q_rows.columns[:2], *k_rows.columns[2:]))

    def _check_range(self, q: Tensor, k: Tensor, hi: int) -> None:
        # See the module docstring: past this position a scale is inf or subnormal in the
        # dtype the rotated q/k are stored in (float16: NaN logits from about 4600 on).
        sb, gamma = self.config.scale_base, self.config.gamma
        dtype = _storage_dtype(torch.promote_types(q.dtype, k.dtype))
        limit = xpos_max_position(sb, gamma, dtype)
        if hi > limit:
            fi = torch.finfo(dtype)
            need = hi * math.log((1 + gamma) / gamma) / min(math.log(fi.max), -math.log(fi.tiny))
            raise ValueError(
                f"positions must be <= {limit} for xPos with scale_base={sb:g}, gamma={gamma:g} in {dtype} "
                f"(the scale zeta^(+-n/scale_base) leaves {dtype}'s normal range); got position {hi}. "
                f"Use scale_base >= {math.ceil(need * (1 + 1e-9))} for this length, or a wider dtype"
            )

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> "XPosState":
        """q's and the new keys' tables, once per forward for every layer: in self-attention
        the new keys sit at the query positions (``k_pos``, every key with the cache, is not
        rotated again)."""
        return self._state(q_pos, q_pos)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: "XPosState | None" = None) -> tuple[Tensor, Tensor]:
        """Rotate and scale q (B, H, Tq, D) at q_pos (B, Tq) and k (B, Hkv, Tk, D) at k_pos (B, Tk).

        ``state``: :meth:`prepare`'s result for this forward, for keys at the query positions
        (self-attention); None makes the tables here. Positions past the dtype's range
        (:func:`xpos_max_position`) and float16 keys that overflow are errors.
        """
        if state is None:
            state = self._state(q_pos, k_pos)
        elif k.shape[-2] != state.tables.cos_k.shape[-2]:
            raise ValueError(
                f"state is prepare()'s, for keys at the {state.tables.cos_k.shape[-2]} query positions, but k has "
                f"{k.shape[-2]}; pass state=None for keys at other positions"
            )
        if state.hi is not None and (q.dtype, k.dtype) not in state.range_checked:
            self._check_range(q, k, state.hi)
            state.range_checked.add((q.dtype, k.dtype))  # every layer of the forward alike: checked once
        rq, rk = rotate_qk(q, k, state.tables, self.config.layout, self.config.kernel)
        if not torch.compiler.is_compiling() and _overflows_easily(rk.dtype):
            # float16: k's scale (<= 16383 at the largest allowed position) times |k| may still
            # pass 65504. q's scale is <= 1, so only k can overflow; one pass, float16 only.
            made_inf = ~torch.isfinite(rk) & torch.isfinite(k)
            if bool(made_inf.any()):
                raise ValueError(
                    f"xPos rotated keys overflow {rk.dtype} (|k| * zeta^(-n/scale_base) > "
                    f"{torch.finfo(rk.dtype).max:g}) at positions up to {int(k_pos.max())} with scale_base="
                    f"{self.config.scale_base:g}; use a larger scale_base or a wider dtype"
                )
        return rq, rk


@dataclass(frozen=True, eq=False)
class XPosState:
    """Per-forward xPos state: ``tables`` holds q's scaled cos/sin (zeta^(m/scale_base)) and
    k's (zeta^(-n/scale_base)), each (B|1, T, r/2) float32, with their rolled form made once
    when the rotation plan takes it; ``hi`` the largest position (None under torch.compile,
    where the range checks are skipped)."""

    hi: int | None
    tables: QKTables
    range_checked: set = dataclasses.field(default_factory=set, repr=False)  # (q, k) dtypes checked against hi
