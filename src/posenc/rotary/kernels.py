"""The rotation kernels: the arithmetic of rotating x (B, H, T, D) by cos/sin (B|1, T, r/2).

Which kernel runs a call is decided elsewhere (:func:`posenc.rotary.functional.rotation_plan`);
each kernel here is straight-line code for one layout (:mod:`posenc.rotary.layout`). The
arithmetic is float32 (float64 for float64 inputs) whatever the input dtype, with one rounding
to the input dtype at the end, so a bfloat16 input is rotated to within one bfloat16 ulp of
the exact result.

* functional (:data:`FUNCTIONAL_QK`): autograd-friendly, the bodies ``torch.compile`` fuses;
* eager (:data:`EAGER`): the interleaved layout is one complex multiplication
  (``view_as_complex``); the half layout writes both halves into a fresh tensor, for calls
  autograd does not record (about five passes over x: eager PyTorch cannot fuse the rotation);
* rolled (:func:`rotate_half_rolled`): the half layout in three ops, for small steps on CPU;
* compiled (:func:`run_compiled`): the functional form through ``torch.compile`` with q and k
  in one graph. Inductor fuses the rotation, the pass-through channels and both dtype casts
  into one loop per tensor: one read and one write of x, float32 only in registers (each half
  is rounded to x's dtype *before* the ``cat``, else Inductor materializes a float32 copy and
  casts it in a second loop). Static shapes first; a second shape recompiles once with dynamic
  lengths. If compilation fails (no C++ compiler, no Triton, ...) the eager kernel is used from
  then on, with a warning (:func:`compile_failed`).

The fused Triton kernel is :mod:`posenc.rotary.triton_rope` (optional, imported on demand).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import Tensor

__all__ = ["EAGER", "FUNCTIONAL_QK", "compile_failed", "half_rolled_tables", "rotate_half_rolled", "run_compiled"]


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# ---- functional kernels (autograd; the bodies torch.compile fuses) -------------------------
def _half_functional(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    h = cos.shape[-1]
    r = 2 * h
    cos, sin = cos[:, None], sin[:, None]  # (B|1, 1, T, r/2)
    xf = x[..., :r].to(_compute_dtype(x))
    x1, x2 = xf[..., :h], xf[..., h:]
    # Round each half to x.dtype before the cat: Inductor then writes the output directly
    # (a cat of float32 halves is materialized in float32 and cast in a second loop).
    o1 = (x1 * cos - x2 * sin).to(x.dtype)  # (B, H, T, r/2)
    o2 = (x2 * cos + x1 * sin).to(x.dtype)
    return torch.cat([o1, o2] if r == x.shape[-1] else [o1, o2, x[..., r:]], dim=-1)  # (B, H, T, D)


def _interleaved_functional(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    h = cos.shape[-1]
    r = 2 * h
    cos, sin = cos[:, None], sin[:, None]  # (B|1, 1, T, r/2)
    xf = x[..., :r].to(_compute_dtype(x)).unflatten(-1, (h, 2))  # (B, H, T, r/2, 2)
    a, b = xf[..., 0], xf[..., 1]
    pairs = [(a * cos - b * sin).to(x.dtype), (b * cos + a * sin).to(x.dtype)]  # rounded before the stack, as above
    rot = torch.stack(pairs, dim=-1).flatten(-2)  # (B, H, T, r)
    return rot if r == x.shape[-1] else torch.cat([rot, x[..., r:]], dim=-1)


# One function per layout for q and k together: one compiled graph (one guard check) per call.
# Separate functions, not a closure, because torch.compile caches per code object.
def _half_qk(q: Tensor, k: Tensor, cq: Tensor, sq: Tensor, ck: Tensor, sk: Tensor) -> tuple[Tensor, Tensor]:
    return _half_functional(q, cq, sq), _half_functional(k, ck, sk)


def _interleaved_qk(q: Tensor, k: Tensor, cq: Tensor, sq: Tensor, ck: Tensor, sk: Tensor) -> tuple[Tensor, Tensor]:
    return _interleaved_functional(q, cq, sq), _interleaved_functional(k, ck, sk)


# ---- eager kernels -----------------------------------------------------------------------
def _half_eager(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # Writes into a fresh tensor: for calls autograd does not record (see functional.rotation_plan).
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


def half_rolled_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin (B|1, T, r/2) -> ``[cos | cos]`` and ``[-sin | sin]``, (B|1, 1, T, r), for
    :func:`rotate_half_rolled`."""
    return torch.cat([cos, cos], dim=-1)[:, None], torch.cat([-sin, sin], dim=-1)[:, None]


def rotate_half_rolled(x: Tensor, cos2: Tensor, sin2: Tensor) -> Tensor:
    """The half layout with every channel rotated (r = D), from :func:`half_rolled_tables`:
    ``x·[cos | cos] + roll(x, D/2)·[-sin | sin]``, since roll(x, D/2) = [x2 | x1].

    Three tensor ops against the eager kernel's ten or so, for small inputs (a decoding step,
    a few tokens), where each op's fixed cost outweighs its arithmetic: about 12 us against
    72 us for one (1, 8, 1, 64) tensor on a 2-core CPU, with the same products and sums, so
    the same bits as the eager kernel. Computed in float32 (float64 for float64 x), rounded
    once to x's dtype. The tables are built once per forward (:meth:`~posenc.rotary.functional.QKTables.rolled_pairs`).
    """
    dt = x.dtype
    xf = x if dt is torch.float32 or dt is torch.float64 else x.float()  # _compute_dtype, inline: a step's every us counts
    out = xf * cos2
    out.addcmul_(xf.roll(x.shape[-1] // 2, dims=-1), sin2)  # into the product: one allocation fewer
    return out if out.dtype is dt else out.to(dt)


EAGER: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "half": _half_eager,
    "interleaved": _interleaved_eager,
}
FUNCTIONAL_QK: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "half": _half_qk,
    "interleaved": _interleaved_qk,
}

# ---- compiled kernel ---------------------------------------------------------------------
_compiled: dict[str, Callable] = {}
_compile_failed = False


def compile_failed() -> bool:
    """Whether compiling the kernel failed once in this process (the eager kernel runs since)."""
    return _compile_failed


def _compiled_kernel(layout: str) -> Callable:
    if layout not in _compiled:
        # dynamic=None: the first shape gets a static loop (fastest on CPU); a second shape
        # recompiles once with its varying sizes symbolic, so decoding does not recompile per step.
        _compiled[layout] = torch.compile(FUNCTIONAL_QK[layout], fullgraph=True)
    return _compiled[layout]


def run_compiled(layout: str, args: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """The compiled kernel's result; the eager kernel's (from now on) if compilation fails."""
    global _compile_failed
    try:
        return _compiled_kernel(layout)(*args)
    except Exception as e:  # no C++ compiler, no Triton, unsupported platform, ...
        _compile_failed = True
        warnings.warn(f"posenc: compiled rotary kernel unavailable ({type(e).__name__}: {e}); using eager")
        q, k, cq, sq, ck, sk = args
        return EAGER[layout](q, cq, sq), EAGER[layout](k, ck, sk)
