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
  (``view_as_complex``), the half layout writes both halves into a fresh tensor when no
  gradient is recorded (about five passes over x: eager PyTorch cannot fuse the rotation),
  else takes the functional form; a small step on CPU takes the three-op rolled form
  (:func:`rotate_half_rolled`, the same bits).
* ``"compiled"``: the same math through ``torch.compile`` with q and k in one graph. Inductor
  fuses the rotation, the pass-through channels and both dtype casts into one loop per
  tensor: one read and one write of x, float32 only in registers (each half is rounded to
  x's dtype *before* the ``cat``, else Inductor materializes a float32 copy and casts it in
  a second loop). Static shapes first; a second shape recompiles once with dynamic lengths.
  If compilation fails (no C++ compiler, no Triton, ...) the eager kernel is used from then
  on, with a warning.
* ``"triton"``: the fused Triton kernel of :mod:`posenc.rotary.triton_rope` (q and k in one
  launch, backward by -theta). Needs the optional ``triton`` package and CUDA tensors (on CPU
  only under ``TRITON_INTERPRET=1``, Triton's interpreter, for tests); float32/16, bfloat16.
* ``"auto"`` (default): ``"triton"`` for CUDA tensors when triton is installed and the input
  suits it (float32/float16/bfloat16, cos/sin without gradient); otherwise ``"compiled"`` for
  tensors of at least ``AUTO_COMPILE_MIN_NUMEL`` elements (q and k together), ``"eager"``
  below, where the call overhead of a compiled function (~0.1 ms) outweighs the fusion;
  setting it to None disables compilation. On CPU ``"auto"`` never picks Triton.

``inplace=True`` (inference only: no gradient may flow) writes the rotation into q and k and
returns them; the Triton kernel does so without a temporary, the others rotate then copy back.

Inside an outer ``torch.compile`` every kernel is the plain functional form, which the
outer graph fuses with its neighbours.

:func:`rotation_plan` is the one place that decides among these ways (:class:`Rotation`:
functional, triton, compiled, rolled, eager) for a call, with the reason; each way is a
straight-line function in :data:`WAYS`, and :func:`rotate_qk` is the plan then the way.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from ..config import check_choice, check_int

__all__ = [
    "LAYOUTS", "KERNELS", "QKTables", "Rotation", "RotationPlan", "SMALL_STEP", "WAYS", "apply_rotary", "apply_rotary_qk",
    "angles_cos_sin", "convert_qk_layout", "rotate_qk", "rotation_plan", "triton_available",
]

LAYOUTS = ("half", "interleaved")
KERNELS = ("auto", "eager", "compiled", "triton")

#: "auto" compiles when q and k hold at least this many elements (None: never compile).
AUTO_COMPILE_MIN_NUMEL: int | None = 1 << 18


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
    # Writes into a fresh tensor: for calls autograd does not record (see rotation_plan).
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
    once to x's dtype. The tables are built once per forward (:meth:`QKTables.rolled`).
    """
    cdt = _compute_dtype(x)
    xf = x if x.dtype == cdt else x.to(cdt)
    out = torch.addcmul(xf * cos2, xf.roll(x.shape[-1] // 2, dims=-1), sin2)
    return out if out.dtype == x.dtype else out.to(x.dtype)


_EAGER: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "half": _half_eager,
    "interleaved": _interleaved_eager,
}
_FUNCTIONAL_QK: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "half": _half_qk,
    "interleaved": _interleaved_qk,
}

# ---- compiled kernel ---------------------------------------------------------------------
_compiled: dict[str, Callable] = {}
_compile_failed = False


def _compiled_kernel(layout: str) -> Callable:
    if layout not in _compiled:
        # dynamic=None: the first shape gets a static loop (fastest on CPU); a second shape
        # recompiles once with its varying sizes symbolic, so decoding does not recompile per step.
        _compiled[layout] = torch.compile(_FUNCTIONAL_QK[layout], fullgraph=True)
    return _compiled[layout]


def _check_fits(x: Tensor, cos: Tensor, sin: Tensor, name: str) -> None:
    if x.dim() != 4:
        raise ValueError(f"{name} must have shape (B, H, T, D), got {tuple(x.shape)}")
    h = cos.shape[-1]
    if 2 * h > x.shape[-1] or cos.shape[-2] != x.shape[-2] or sin.shape != cos.shape:
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)}/{tuple(sin.shape)} do not fit {name} of shape {tuple(x.shape)}"
        )


def _run_compiled(layout: str, args: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """The compiled kernel's result; the eager kernel's (from now on) if compilation fails."""
    global _compile_failed
    try:
        return _compiled_kernel(layout)(*args)
    except Exception as e:  # no C++ compiler, no Triton, unsupported platform, ...
        _compile_failed = True
        warnings.warn(f"posenc: compiled rotary kernel unavailable ({type(e).__name__}: {e}); using eager")
        q, k, cq, sq, ck, sk = args
        return _EAGER[layout](q, cq, sq), _EAGER[layout](k, ck, sk)


def triton_available() -> bool:
    """Whether the optional ``triton`` package is installed (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def _use_triton(kernel: str, tensors: tuple[Tensor, ...], tables: tuple[Tensor, ...]) -> bool:
    """``kernel="triton"``: yes, or a ValueError saying why it cannot run here.
    ``"auto"``: yes for CUDA inputs the kernel handles when triton is installed."""
    if kernel == "triton":
        if not triton_available():
            raise ValueError("kernel='triton' needs the triton package (pip install triton); "
                             "use kernel='auto', 'eager' or 'compiled'")
        dev = tensors[0].device
        if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
            raise ValueError(f"kernel='triton' needs CUDA tensors, got tensors on {dev}; "
                             "use kernel='auto', 'eager' or 'compiled' on CPU (or TRITON_INTERPRET=1 in tests)")
        return True
    if kernel != "auto" or not tensors[0].is_cuda or not triton_available():
        return False
    from .triton_rope import SUPPORTED_DTYPES

    return (
        all(t.dtype in SUPPORTED_DTYPES and t.dtype == tensors[0].dtype for t in tensors)
        and not any(t.requires_grad for t in tables)
    )


def _check_inplace(inplace: bool, *xs: Tensor) -> None:
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    if inplace and torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        raise ValueError(
            "inplace=True is for inference: q and k must not require grad "
            "(use torch.no_grad() or torch.inference_mode(), or inplace=False)"
        )
    if inplace and len(xs) == 2 and xs[0].numel() and xs[0].data_ptr() == xs[1].data_ptr():
        # Not a cache key: q and k starting at one address would be written twice.
        raise ValueError("inplace=True needs q and k in separate memory, got one tensor (or view) for both")


# ---- the rotation plan ---------------------------------------------------------------------
#: Steps of at most this many positions (q's and k's) rotate with the three-op rolled form on
#: CPU: q and k of (1, 8, T, 64), no autograd, one thread: 0.023 ms against the eager kernel's
#: 0.23 ms at T=1, 0.066 against 0.19 at T=64, 0.16 against 0.20 at T=256 (the margin closes).
SMALL_STEP = 64


class Rotation(enum.Enum):
    """The ways to rotate q and k (see the module docstring and :func:`rotation_plan`)."""

    FUNCTIONAL = "functional"
    TRITON = "triton"
    COMPILED = "compiled"
    ROLLED = "rolled"
    EAGER = "eager"


class RotationPlan(NamedTuple):
    """Which way rotates a call, and why (a sentence for a person)."""

    way: Rotation
    reason: str


@dataclass(eq=False)
class QKTables:
    """cos/sin (B|1, T, r/2) float32 for q and for k, with the rolled form of each
    (:func:`half_rolled_tables`) made on first use and kept: a forward's state makes them once
    for every layer. ``keys_at_queries``: k's tables are q's (self-attention), made once."""

    cos_q: Tensor
    sin_q: Tensor
    cos_k: Tensor
    sin_k: Tensor
    keys_at_queries: bool = False
    _rolled: tuple | None = field(default=None, repr=False)

    @classmethod
    def shared(cls, cos: Tensor, sin: Tensor) -> "QKTables":
        """The tables of keys at the query positions."""
        return cls(cos, sin, cos, sin, keys_at_queries=True)

    def rolled(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """((cos2, sin2) of q, (cos2, sin2) of k), (B|1, 1, T, r)."""
        if self._rolled is None:
            q = half_rolled_tables(self.cos_q, self.sin_q)
            self._rolled = (q, q if self.keys_at_queries else half_rolled_tables(self.cos_k, self.sin_k))
        return self._rolled


def rotation_plan(kernel: str, layout: str, q: Tensor, k: Tensor, tables: QKTables) -> RotationPlan:
    """The one place that decides how q (B, H, Tq, D) and k (B, Hkv, Tk, D) are rotated.

    Raises ``ValueError`` for ``kernel="triton"`` where it cannot run.
    """
    if torch.compiler.is_compiling():
        return RotationPlan(Rotation.FUNCTIONAL, "inside torch.compile: the functional form, fused by the outer graph")
    cos_sin = (tables.cos_q, tables.sin_q, tables.cos_k, tables.sin_k)
    if _use_triton(kernel, (q, k), cos_sin):
        return RotationPlan(Rotation.TRITON, f"kernel={kernel!r} on CUDA: one Triton launch for q and k")
    numel = q.numel() + k.numel()
    big = kernel == "auto" and AUTO_COMPILE_MIN_NUMEL is not None and numel >= AUTO_COMPILE_MIN_NUMEL
    if (kernel == "compiled" or big) and not _compile_failed:
        return RotationPlan(Rotation.COMPILED, f"kernel={kernel!r}, {numel} elements: the compiled kernel")
    records = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, *cos_sin))
    if (
        layout == "half" and kernel in ("auto", "eager") and q.device.type == "cpu" and not records
        and max(q.shape[2], k.shape[2]) <= SMALL_STEP and 2 * tables.cos_q.shape[-1] == q.shape[-1]
    ):
        return RotationPlan(Rotation.ROLLED, "a small step on CPU, every channel rotated: the three-op rolled form")
    if layout == "half" and records:
        return RotationPlan(Rotation.FUNCTIONAL, "autograd records: the functional form (the eager kernel writes in place)")
    return RotationPlan(Rotation.EAGER, "the eager kernel")


# The ways, one straight-line function each: (q, k, tables, layout) -> (q', k').
def _triton(q: Tensor, k: Tensor, t: QKTables, layout: str, inplace: bool = False) -> tuple[Tensor, Tensor]:
    from .triton_rope import rotary_qk

    return rotary_qk(q, k, t.cos_q, t.sin_q, t.cos_k, t.sin_k, layout, inplace=inplace)


def _functional(q: Tensor, k: Tensor, t: QKTables, layout: str) -> tuple[Tensor, Tensor]:
    return _FUNCTIONAL_QK[layout](q, k, t.cos_q, t.sin_q, t.cos_k, t.sin_k)


def _rolled(q: Tensor, k: Tensor, t: QKTables, layout: str) -> tuple[Tensor, Tensor]:
    (cq, sq), (ck, sk) = t.rolled()
    return rotate_half_rolled(q, cq, sq), rotate_half_rolled(k, ck, sk)


def _compiled_way(q: Tensor, k: Tensor, t: QKTables, layout: str) -> tuple[Tensor, Tensor]:
    return _run_compiled(layout, (q, k, t.cos_q, t.sin_q, t.cos_k, t.sin_k))


def _eager(q: Tensor, k: Tensor, t: QKTables, layout: str) -> tuple[Tensor, Tensor]:
    return _EAGER[layout](q, t.cos_q, t.sin_q), _EAGER[layout](k, t.cos_k, t.sin_k)


WAYS: dict[Rotation, Callable[[Tensor, Tensor, QKTables, str], tuple[Tensor, Tensor]]] = {
    Rotation.FUNCTIONAL: _functional,
    Rotation.TRITON: _triton,
    Rotation.COMPILED: _compiled_way,
    Rotation.ROLLED: _rolled,
    Rotation.EAGER: _eager,
}


def rotate_qk(
    q: Tensor, k: Tensor, tables: QKTables, layout: str = "half", kernel: str = "auto", inplace: bool = False
) -> tuple[Tensor, Tensor]:
    """Rotate q (B, H, Tq, D) by q's tables and k (B, Hkv, Tk, D) by k's, the way
    :func:`rotation_plan` picks. Returns new tensors of q's and k's dtypes, or q and k
    themselves, rotated, with ``inplace=True`` (inference only)."""
    check_choice("kernel", kernel, KERNELS)
    check_choice("layout", layout, LAYOUTS)
    _check_fits(q, tables.cos_q, tables.sin_q, "q")
    _check_fits(k, tables.cos_k, tables.sin_k, "k")
    _check_inplace(inplace, q, k)
    way = rotation_plan(kernel, layout, q, k, tables).way
    if inplace and way is Rotation.TRITON:  # the Triton kernel writes q and k without a temporary
        return _triton(q, k, tables, layout, inplace=True)
    out = WAYS[way](q, k, tables, layout)
    if inplace:
        q.copy_(out[0]), k.copy_(out[1])
        return q, k
    return out


def apply_rotary_qk(
    q: Tensor,
    k: Tensor,
    cos_q: Tensor,
    sin_q: Tensor,
    cos_k: Tensor,
    sin_k: Tensor,
    layout: str = "half",
    kernel: str = "auto",
    inplace: bool = False,
) -> tuple[Tensor, Tensor]:
    """Rotate q (B, H, Tq, D) by cos_q/sin_q (B|1, Tq, r/2) and k (B, Hkv, Tk, D) by cos_k/sin_k.

    The same as two :func:`apply_rotary` calls, but the compiled kernel handles both tensors
    in one call (one guard check) and the Triton kernel in one launch. Returns new tensors of
    q's and k's dtypes, or q and k themselves, rotated, with ``inplace=True`` (inference only).
    """
    return rotate_qk(q, k, QKTables(cos_q, sin_q, cos_k, sin_k), layout, kernel, inplace)


def apply_rotary(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half", kernel: str = "auto", inplace: bool = False
) -> Tensor:
    """Rotate the first r = 2 * cos.shape[-1] channels of ``x`` (B, H, T, D) in ``layout``.

    ``cos``/``sin``: (B or 1, T, r/2), as made by :func:`angles_cos_sin`. Returns a new tensor
    of x's dtype (channels r.. copied unchanged), or x itself, rotated, with ``inplace=True``.
    """
    # An empty k (B, 0, 0, D): every way then rotates x alone (Triton launches programs for x only).
    k = x.new_empty(x.shape[0], 0, 0, x.shape[-1])
    c0 = cos.new_empty(1, 0, cos.shape[-1])
    return rotate_qk(x, k, QKTables(cos, sin, c0, c0), layout, kernel, inplace)[0]


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
