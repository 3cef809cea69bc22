"""KERPLE: kernelized relative positional embedding (Chi et al. 2022, "KERPLE: Kernelized
Relative Positional Embedding for Length Extrapolation", NeurIPS 2022).

Each head h adds a conditionally positive definite kernel of the distance to the logits:

* ``log``:   -r1_h * log(1 + r2_h * |i - j|),   r1, r2 > 0;
* ``power``: -r1_h * |i - j| ** r2_h,           r1 > 0, 0 < r2 <= 2.

r1 and r2 are learned per head. As in the paper's code, their values are clamped to
[eps, inf) (and r2 to [eps, 2] for ``power``) before use, and initialised uniformly: for
``log`` r1 ~ U(0, 2), r2 ~ U(0, 1); for ``power`` r1 ~ U(0, 1), r2 ~ U(0, 2). The paper's
code re-clamps the stored values in place at every forward (projected gradient descent);
here the clamp is applied to the value used and its gradient passes straight through, so a
parameter that crosses the floor is not frozen by a zero gradient, and the forward stays a
pure function of the parameters (functional calls, compilation).

Shapes: positions (B, T); bias (B or 1, H, Tq, Tk).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_choice, check_range
from ..encoding import Dims, PositionalEncoding
from ..literature import NOT_A_FEATURE_MAP, NO_ABSOLUTE
from ..positions import relative_positions
from ..limits import MAX_INIT_STD
from ..registry import register
from ..terms import BiasTerm
from ._bias import bias_dtype

__all__ = ["KerpleConfig", "Kerple", "kerple_bias"]

VARIANTS = ("log", "power")
MAX_KERNEL_INIT = MAX_INIT_STD  # r1, r2 at init: 1e4 keeps -r1 log(1 + r2 d) finite for d < 2^40


def _clamp_straight_through(p: Tensor, low: float, high: float | None = None) -> Tensor:
    """``p.clamp(low, high)`` in value (exactly: p - p is 0), identity in gradient."""
    return p.clamp(min=low, max=high).detach() + (p - p.detach())


def kerple_bias(q_pos: Tensor, k_pos: Tensor, r1: Tensor, r2: Tensor, variant: str = "log") -> Tensor:
    """KERPLE bias from per-head r1, r2 (H,), in their dtype: (B, Tq), (B, Tk) -> (B, H, Tq, Tk).

    No clamping here: r1, r2 are used as given (the module clamps them first).
    """
    check_choice("variant", variant, VARIANTS)
    dist = relative_positions(q_pos, k_pos).abs()[:, None].to(r1.dtype)  # (B, 1, Tq, Tk)
    return _kernel(dist, r1[None, :, None, None], r2[None, :, None, None], variant)


def _kernel(dist: Tensor, r1: Tensor, r2: Tensor, variant: str) -> Tensor:
    """The kernel of |i - j| (float, broadcasting with r1, r2): pointwise."""
    if variant == "log":
        return -r1 * torch.log1p(r2 * dist)
    # d ** r2 at d = 0 is 0, but its gradient in r2 is 0 * log(0) = nan: take the power of 1
    # there and put the 0 back.
    nonzero = dist > 0
    return -r1 * torch.where(nonzero, torch.where(nonzero, dist, 1.0) ** r2, 0.0)


@dataclass
class KerpleConfig(EncodingConfig):
    """Bounds: ``eps`` in (0, 1]; ``r1_init`` in [eps, 1e4]; ``r2_init`` in [eps, 1e4] (``log``)
    or [eps, 2] (``power``). Past 1e4 the bias reaches float32's range at long distances
    (r1 = 1e300 is inf in float32, and inf * log(1) = NaN at distance 0)."""

    variant: str = "log"
    eps: float = 1e-2  # floor of r1 and r2 (the paper's code uses 1e-2)
    r1_init: float | None = None  # None: the paper's uniform init (see the module docstring)
    r2_init: float | None = None

    def validate(self) -> None:
        check_choice("variant", self.variant, VARIANTS)
        check_range("eps", self.eps, 0.0, 1.0, low_inclusive=False)
        if self.r1_init is not None:
            check_range("r1_init", self.r1_init, self.eps, MAX_KERNEL_INIT)
        if self.r2_init is not None:
            check_range("r2_init", self.r2_init, self.eps, 2.0 if self.variant == "power" else MAX_KERNEL_INIT)


@register(
    "kerple",
    family="relative",
    summary="learned per-head CPD kernel of |i - j| on the logits: -r1 log(1 + r2 d) or -r1 d^r2",
    paper="Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation",
    claims={
        "absolute": (False, NO_ABSOLUTE),
        "relative": (True, "Chi et al. 2022: a kernel of i - j"),
        "bounded": (False, "Chi et al. 2022: -r1 log(1 + r2 |i - j|) grows without end"),
        "decay": (True, "Chi et al. 2022: conditionally positive definite kernels decay"),
        "extrapolation": (True, "Chi et al. 2022"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
)
class Kerple(PositionalEncoding):
    """Logit bias ``-r1 log(1 + r2 |i-j|)`` (``log``) or ``-r1 |i-j|^r2`` (``power``), per head."""

    Config = KerpleConfig

    def __init__(self, config: KerpleConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        H = dims.num_heads
        r1_max, r2_max = (2.0, 1.0) if config.variant == "log" else (1.0, 2.0)

        def init(value: float | None, high: float) -> nn.Parameter:
            return nn.Parameter(torch.full((H,), value) if value is not None else torch.rand(H) * high)

        self.r1 = init(config.r1_init, r1_max)
        self.r2 = init(config.r2_init, r2_max)

    def kernel_parameters(self) -> tuple[Tensor, Tensor]:
        """(r1, r2) as used in the bias: clamped to the kernel's valid range, float32 or wider."""
        c = self.config
        dtype = bias_dtype(self.r1, self.r2)
        r1 = _clamp_straight_through(self.r1.to(dtype), c.eps)
        r2 = _clamp_straight_through(self.r2.to(dtype), c.eps, 2.0 if c.variant == "power" else None)
        return r1, r2

    def logit_bias(self) -> BiasTerm:
        r1, r2 = self.kernel_parameters()
        variant = self.config.variant

        def fn(h: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
            return _kernel((q_pos - k_pos).abs().to(r1.dtype), r1[h], r2[h], variant)

        return BiasTerm(fn, self.dims.num_heads, toeplitz=True)
