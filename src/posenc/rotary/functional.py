"""Applying rotations: the kernels, the angle tables and checkpoint layout conversion.

Shapes: x (B, H, T, D); positions (B, T); cos, sin (B or 1, T, r/2) float32, where
r = rotary_dim <= D is the number of rotated channels (the D - r others pass through).

Two layouts pair the r rotated channels differently (Su et al. 2021, RoFormer):

* ``"half"`` (GPT-NeoX, Hugging Face Llama ``rotate_half``): pair j is (x_j, x_{j + r/2});
* ``"interleaved"`` (GPT-J, Meta Llama, RoFormer): pair j is (x_{2j}, x_{2j+1}).

Both rotate pair j by angle m * theta_j at position m:
(a, b) -> (a cos - b sin, b cos + a sin). The arithmetic is float32 (float64 for float64
inputs) whatever the input dtype, with one rounding to the input dtype at the end, so a
bfloat16 input is rotated to within one bfloat16 ulp of the exact result.

Kernels (``kernel=``):

* ``"eager"``: plain PyTorch; the interleaved layout is one complex multiplication
  (``view_as_complex``), the half layout writes both halves in place when no gradient is
  needed.
* ``"compiled"``: the same math through ``torch.compile`` (Inductor fuses the whole rotation,
  the pass-through channels and the dtype casts into one loop: about one read and one write
  of x). Compiled once per shape and dtype; if compilation fails the eager kernel is used
  from then on, with a warning.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import Tensor

from ..config import check_choice, check_int

__all__ = ["LAYOUTS", "KERNELS", "apply_rotary", "angles_cos_sin", "convert_qk_layout"]

LAYOUTS = ("half", "interleaved")
KERNELS = ("eager", "compiled")


def angles_cos_sin(positions: Tensor, inv_freq: Tensor, attention_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """cos and sin of m * theta_i, times ``attention_factor``: (...,) x (r/2,) -> (..., r/2) float32.

    Angles are float64: in float32, m * theta_0 at m = 2^20 is off by up to 2^-4 rad (half an
    ulp of 2^20), which no later rounding can repair.
    """
    ang = positions.to(torch.float64)[..., None] * inv_freq.to(device=positions.device, dtype=torch.float64)
    cos, sin = ang.cos(), ang.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.float(), sin.float()


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# ---- eager kernels -----------------------------------------------------------------------
def _half_functional(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # Autograd-friendly form; also the body that torch.compile fuses into one loop.
    h = cos.shape[-1]
    r = 2 * h
    cos, sin = cos[:, None], sin[:, None]  # (B|1, 1, T, r/2)
    xf = x[..., :r].to(_compute_dtype(x))
    x1, x2 = xf[..., :h], xf[..., h:]
    rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)  # (B, H, T, r)
    return rot if r == x.shape[-1] else torch.cat([rot, x[..., r:]], dim=-1)


def _interleaved_functional(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    h = cos.shape[-1]
    r = 2 * h
    cos, sin = cos[:, None], sin[:, None]  # (B|1, 1, T, r/2)
    xf = x[..., :r].to(_compute_dtype(x)).unflatten(-1, (h, 2))  # (B, H, T, r/2, 2)
    a, b = xf[..., 0], xf[..., 1]
    rot = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2).to(x.dtype)  # (B, H, T, r)
    return rot if r == x.shape[-1] else torch.cat([rot, x[..., r:]], dim=-1)


def _half_eager(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        return _half_functional(x, cos, sin)
    h = cos.shape[-1]
    r = 2 * h
    cos, sin = cos[:, None].to(_compute_dtype(x)), sin[:, None].to(_compute_dtype(x))  # (B|1, 1, T, r/2)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if r < x.shape[-1]:
        out[..., r:] = x[..., r:]  # pass-through channels, bit for bit
    same = x.dtype == _compute_dtype(x)
    xf = x[..., :r] if same else x[..., :r].to(_compute_dtype(x))
    x1, x2 = xf[..., :h], xf[..., h:]
    # Write each half in place: 4 passes over half of x instead of the 7 of the functional form.
    o1 = out[..., :h] if same else torch.empty_like(x1)
    o2 = out[..., h:r] if same else torch.empty_like(x2)
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1.0)
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin)
    if not same:
        out[..., :h], out[..., h:r] = o1, o2  # one rounding to x.dtype
    return out


def _interleaved_eager(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    h = cos.shape[-1]
    r = 2 * h
    cdt = _compute_dtype(x)
    # Pair j is (x_2j, x_2j+1) = one complex number; rotating it is multiplying by e^(i m theta_j).
    e = torch.complex(cos.to(cdt), sin.to(cdt))[:, None]  # (B|1, 1, T, r/2)
    xr = x[..., :r].to(cdt)
    if xr.stride(-1) != 1 or any(s % 2 for s in xr.stride()[:-1]):
        xr = xr.contiguous()
    z = torch.view_as_complex(xr.unflatten(-1, (h, 2)))  # (B, H, T, r/2) complex
    rot = torch.view_as_real(z * e).flatten(-2).to(x.dtype)  # (B, H, T, r)
    return rot if r == x.shape[-1] else torch.cat([rot, x[..., r:]], dim=-1)


_EAGER: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "half": _half_eager,
    "interleaved": _interleaved_eager,
}
_FUNCTIONAL: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "half": _half_functional,
    "interleaved": _interleaved_functional,
}

# ---- compiled kernel ---------------------------------------------------------------------
_compiled: dict[str, Callable] = {}
_compile_failed = False


def _compiled_kernel(layout: str) -> Callable | None:
    if _compile_failed:
        return None
    if layout not in _compiled:
        # Static shapes: on CPU a shape-specialised loop is ~2x faster than a dynamic one.
        _compiled[layout] = torch.compile(_FUNCTIONAL[layout], dynamic=False, fullgraph=True)
    return _compiled[layout]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half", kernel: str = "eager") -> Tensor:
    """Rotate the first r = 2 * cos.shape[-1] channels of ``x`` (B, H, T, D) in ``layout``.

    ``cos``/``sin``: (B or 1, T, r/2), as made by :func:`angles_cos_sin`. Returns a new tensor
    of x's dtype; channels r.. are copied unchanged.
    """
    global _compile_failed
    if x.dim() != 4:
        raise ValueError(f"x must have shape (B, H, T, D), got {tuple(x.shape)}")
    h = cos.shape[-1]
    if 2 * h > x.shape[-1] or cos.shape[-2] != x.shape[-2] or sin.shape != cos.shape:
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)}/{tuple(sin.shape)} do not fit x of shape {tuple(x.shape)}"
        )
    if kernel == "compiled" and not torch.compiler.is_compiling():
        fn = _compiled_kernel(layout)
        if fn is not None:
            try:
                return fn(x, cos, sin)
            except Exception as e:  # no C++ compiler, unsupported platform, ...
                _compile_failed = True
                warnings.warn(f"posenc: compiled rotary kernel unavailable ({type(e).__name__}: {e}); using eager")
    if torch.compiler.is_compiling():
        return _FUNCTIONAL[layout](x, cos, sin)  # let an outer torch.compile fuse it
    return _EAGER[layout](x, cos, sin)


def _layout_permutation(head_dim: int, rotary_dim: int, to: str) -> Tensor:
    # interleaved channel 2j -> half channel j; 2j+1 -> j + r/2 (pass-through channels stay).
    to_half = torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2), torch.arange(rotary_dim, head_dim)])
    return to_half if to == "half" else torch.argsort(to_half)


def convert_qk_layout(
    weight: Tensor, num_heads: int, head_dim: int, rotary_dim: int | None = None, to: str = "half"
) -> Tensor:
    """Permute a q or k projection between RoPE layouts, so that attention scores are unchanged.

    ``weight``: (num_heads * head_dim, ...) — an ``nn.Linear`` weight (out, in) or bias (out,).
    ``to="half"`` converts a checkpoint trained with interleaved pairs (GPT-J, Meta's Llama
    release) to the half layout (GPT-NeoX, Hugging Face Llama); ``to="interleaved"`` is the
    inverse. Within each head, interleaved channel 2j becomes half channel j and 2j+1 becomes
    j + r/2; channels past ``rotary_dim`` stay. Apply it to both q and k projections.
    """
    check_choice("to", to, LAYOUTS)
    check_int("num_heads", num_heads, minimum=1)
    check_int("head_dim", head_dim, minimum=1)
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    check_int("rotary_dim", rotary_dim, minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (it is split into pairs), got {rotary_dim}")
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim ({head_dim}), got {rotary_dim}")
    if weight.dim() < 1 or weight.shape[0] != num_heads * head_dim:
        raise ValueError(
            f"weight must have num_heads * head_dim = {num_heads * head_dim} rows, got shape {tuple(weight.shape)}"
        )
    perm = _layout_permutation(head_dim, rotary_dim, to).to(weight.device)
    w = weight.reshape(num_heads, head_dim, *weight.shape[1:])  # (H, D, ...)
    return w[:, perm].reshape(weight.shape)
