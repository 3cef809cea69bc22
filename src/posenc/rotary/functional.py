"""Rotating q and k: :func:`apply_rotary` / :func:`apply_rotary_qk`, and the plan that picks
the kernel for each call.

Shapes: x (B, H, T, D); positions (B, T); cos, sin (B or 1, T, r/2) float32
(:func:`~posenc.rotary.angles.angles_cos_sin`), where r = rotary_dim <= D is the number of
rotated channels (the D - r others pass through), paired in one of the
:data:`~posenc.rotary.layout.LAYOUTS`.

Kernels (``kernel=``; their arithmetic is :mod:`posenc.rotary.kernels`):

* ``"eager"``: plain PyTorch; the half layout takes the functional form when autograd
  records (the eager kernel writes in place), and a small step on CPU takes the three-op
  rolled form (:func:`~posenc.rotary.kernels.rotate_half_rolled`, the same bits).
* ``"compiled"``: the same math through ``torch.compile`` with q and k in one graph; if
  compilation fails the eager kernel is used from then on, with a warning.
* ``"triton"``: the fused Triton kernel of :mod:`posenc.rotary.triton_rope` (q and k in one
  launch, backward by -theta). Needs the optional ``triton`` package and CUDA tensors (on CPU
  only under ``TRITON_INTERPRET=1``, Triton's interpreter, for tests); float32/16, bfloat16.
* ``"auto"`` (default): ``"triton"`` for CUDA tensors when triton is installed and the input
  suits it (float32/float16/bfloat16, cos/sin without gradient); otherwise ``"compiled"`` for
  tensors of at least ``AUTO_COMPILE_MIN_NUMEL`` elements (q and k together), ``"eager"``
  below, where the call overhead of a compiled function (~0.1 ms) outweighs the fusion;
  setting it to None disables compilation. On CPU ``"auto"`` never picks Triton; a small
  float32 step there takes the fused CPU kernel (:mod:`posenc.rotary.cpu_rope`, the rolled
  form's arithmetic, q and k in one call) when it has been built, never building it itself.

``inplace=True`` (inference only: no gradient may flow) writes the rotation into q and k and
returns them; the Triton kernel does so without a temporary, the others rotate then copy back.

Inside an outer ``torch.compile`` every kernel is the plain functional form, which the
outer graph fuses with its neighbours.

:func:`rotation_plan` is the one place that decides among these ways (:class:`Rotation`:
functional, triton, compiled, fused_cpu, rolled, eager) for a call, with the reason; each way is a
straight-line function in :data:`WAYS`, and :func:`rotate_qk` is the plan then the way.
"""

from __future__ import annotations

import enum
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from ..config import check_choice
from . import cpu_rope
from .kernels import EAGER, FUNCTIONAL_QK, compile_failed, half_rolled_tables, rotate_half_rolled, run_compiled
from .layout import LAYOUTS

__all__ = [
    "KERNELS", "QKTables", "Rotation", "RotationPlan", "SMALL_STEP", "WAYS", "apply_rotary", "apply_rotary_qk",
    "rotate_qk", "rotation_plan", "triton_available",
]

KERNELS = ("auto", "eager", "compiled", "triton")

#: "auto" compiles when q and k hold at least this many elements (None: never compile).
AUTO_COMPILE_MIN_NUMEL: int | None = 1 << 18


def _check_fits(x: Tensor, cos: Tensor, sin: Tensor, name: str) -> None:
    if x.dim() != 4:
        raise ValueError(f"{name} must have shape (B, H, T, D), got {tuple(x.shape)}")
    h = cos.shape[-1]
    if 2 * h > x.shape[-1] or cos.shape[-2] != x.shape[-2] or sin.shape != cos.shape:
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)}/{tuple(sin.shape)} do not fit {name} of shape {tuple(x.shape)}"
        )


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
    FUSED_CPU = "fused_cpu"
    ROLLED = "rolled"
    EAGER = "eager"


class RotationPlan(NamedTuple):
    """Which way rotates a call, and why (a sentence for a person)."""

    way: Rotation
    reason: str


#: The plans decided so far, keyed on everything :func:`rotation_plan` reads: every decoding
#: step's new tables rotate like the last step's, so only the first call of a kind plans.
_PLANS: dict[tuple, Rotation] = {}
_MAX_PLANS = 256


@dataclass(eq=False)
class QKTables:
    """cos/sin (B|1, T, r/2) float32 for q and for k. ``keys_at_queries``: k's tables are q's
    (self-attention). ``rolled``: the rolled pairs (:func:`~posenc.rotary.kernels.half_rolled_tables`)
    when a table holds them already (:class:`~posenc.rotary.rope.TableRows`): (cos2, sin2) of
    q, then of k unless ``keys_at_queries``, each (B|1, 1, T, r); None builds them from the
    cos/sin above on first use. Either way a forward's state makes them once for every layer."""

    cos_q: Tensor
    sin_q: Tensor
    cos_k: Tensor
    sin_k: Tensor
    keys_at_queries: bool = False
    rolled: tuple[Tensor, ...] | None = field(default=None, repr=False)
    _pairs: tuple[Tensor, ...] | None = field(default=None, repr=False)
    _signature: tuple | None = field(default=None, repr=False)

    @classmethod
    def shared(cls, cos: Tensor, sin: Tensor, rolled: tuple[Tensor, ...] | None = None) -> "QKTables":
        """The tables of keys at the query positions (``rolled``: q's pair, see above)."""
        return cls(cos, sin, cos, sin, keys_at_queries=True, rolled=rolled)

    def rolled_pairs(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(cos2, sin2) of q, then of k, (B|1, 1, T, r) each: looked up or built once."""
        if self._pairs is None:
            pairs = self.rolled if self.rolled is not None else half_rolled_tables(self.cos_q, self.sin_q)
            if self.keys_at_queries:
                pairs = (*pairs[:2], *pairs[:2])
            elif self.rolled is None:
                pairs = (*pairs, *half_rolled_tables(self.cos_k, self.sin_k))
            self._pairs = pairs
        return self._pairs

    def way(self, kernel: str, layout: str, q: Tensor, k: Tensor, inplace: bool = False) -> Rotation:
        """The way :func:`rotation_plan` picks for q and k, after the checks of the arguments,
        decided once per kind of call and kept (``_PLANS``), keyed on everything the checks
        and the plan read: the tables' shapes and grad, q's and k's shapes, dtypes, device and
        grad, the grad mode, the module settings the plan reads. A decoding step's new tables
        then rotate without planning again. An explicit ``kernel="triton"`` is checked every
        call (what it needs, triton and CUDA or the interpreter, can change under it)."""
        if inplace is not False:
            _check_inplace(inplace, q, k)  # reads the tensors' addresses: never kept
        if kernel == "triton" or torch.compiler.is_compiling():
            return self._decide(kernel, layout, q, k)
        if self._signature is None:
            tables = (self.cos_q, self.sin_q, self.cos_k, self.sin_k)
            self._signature = (*(t.shape for t in tables), *(t.dtype for t in tables), any(t.requires_grad for t in tables))
        key = (self._signature, kernel, layout, inplace, q.shape, k.shape, q.dtype, k.dtype, q.device,
               torch.is_grad_enabled(), q.requires_grad, k.requires_grad, compile_failed(), AUTO_COMPILE_MIN_NUMEL,
               SMALL_STEP, cpu_rope.kernel() is not None)
        way = _PLANS.get(key)
        if way is None:
            way = self._decide(kernel, layout, q, k)
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = way
        return way

    def _decide(self, kernel: str, layout: str, q: Tensor, k: Tensor) -> Rotation:
        check_choice("kernel", kernel, KERNELS)
        check_choice("layout", layout, LAYOUTS)
        _check_fits(q, self.cos_q, self.sin_q, "q")
        _check_fits(k, self.cos_k, self.sin_k, "k")
        return rotation_plan(kernel, layout, q, k, self).way


def _fused_cpu_fits(kernel: str, q: Tensor, k: Tensor, tables: tuple[Tensor, ...]) -> bool:
    """Whether a small CPU step (checked by the caller) can take the fused CPU kernel: ``auto``,
    float32 throughout, the kernel built (:func:`~posenc.rotary.cpu_rope.kernel`)."""
    return (kernel == "auto" and all(t.dtype == torch.float32 for t in (q, k, *tables))
            and cpu_rope.kernel() is not None)


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
    if (kernel == "compiled" or big) and not compile_failed():
        return RotationPlan(Rotation.COMPILED, f"kernel={kernel!r}, {numel} elements: the compiled kernel")
    records = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, *cos_sin))
    # A small step on CPU without autograd, every channel of q and k rotated: each op's fixed
    # cost outweighs its arithmetic, so the fewest calls win.
    small_step = (
        q.device.type == "cpu" and not records and max(q.shape[2], k.shape[2]) <= SMALL_STEP
        and 2 * tables.cos_q.shape[-1] == q.shape[-1] and 2 * tables.cos_k.shape[-1] == k.shape[-1]
    )
    if small_step and _fused_cpu_fits(kernel, q, k, cos_sin):
        return RotationPlan(Rotation.FUSED_CPU, "a small float32 step on CPU, every channel rotated, the fused "
                                                "CPU kernel built: q and k in one call")
    if small_step and layout == "half" and kernel in ("auto", "eager"):
        return RotationPlan(Rotation.ROLLED, "a small step on CPU, every channel rotated: the three-op rolled form")
    if layout == "half" and records:
        return RotationPlan(Rotation.FUNCTIONAL, "autograd records: the functional form (the eager kernel writes in place)")
    return RotationPlan(Rotation.EAGER, "the eager kernel")


# The ways, one straight-line function each: (q, k, tables, layout) -> (q', k').
def _triton(q: Tensor, k: Tensor, t: QKTables, layout: str, inplace: bool = False) -> tuple[Tensor, Tensor]:
    from .triton_rope import rotary_qk

    return rotary_qk(q, k, t.cos_q, t.sin_q, t.cos_k, t.sin_k, layout, inplace=inplace)


def _functional(q: Tensor, k: Tensor, t: QKTables, layout: str) -> tuple[Tensor, Tensor]:
    return FUNCTIONAL_QK[layout](q, k, t.cos_q, t.sin_q, t.cos_k, t.sin_k)


def _rolled(q: Tensor, k: Tensor, t: QKTables, layout: str) -> tuple[Tensor, Tensor]:
    # q and k apart: three ops each. Side by side (cat, then split) is two ops fewer in the
    # rotation but slower in a model: a decoding step of the speed table's model (6 layers,
    # width 512, 1024 cached keys, 2 threads) took 1.058-1.067x NoPE's that way, 1.046-1.056x so.
    cq, sq, ck, sk = t.rolled_pairs()
    return rotate_half_rolled(q, cq, sq), rotate_half_rolled(k, ck, sk)


def _fused_cpu(q: Tensor, k: Tensor, t: QKTables, layout: str) -> tuple[Tensor, Tensor]:
    # One C++ call for q and k (cpu_rope): the half layout's rolled form, the interleaved one's
    # pairs. It reads rows with a contiguous last dim, which a projection's view has (anything
    # else takes the eager way of its layout).
    half = layout == "half"
    tables = t.rolled_pairs() if half else (t.cos_q, t.sin_q, t.cos_k, t.sin_k)
    if any(x.stride(-1) != 1 for x in (q, k, *tables)):
        return (_rolled if half else _eager)(q, k, t, layout)
    ext = cpu_rope.kernel()
    return (ext.rotate_half_qk if half else ext.rotate_interleaved_qk)(q, k, *tables)


def _compiled_way(q: Tensor, k: Tensor, t: QKTables, layout: str) -> tuple[Tensor, Tensor]:
    return run_compiled(layout, (q, k, t.cos_q, t.sin_q, t.cos_k, t.sin_k))


def _eager(q: Tensor, k: Tensor, t: QKTables, layout: str) -> tuple[Tensor, Tensor]:
    return EAGER[layout](q, t.cos_q, t.sin_q), EAGER[layout](k, t.cos_k, t.sin_k)


WAYS: dict[Rotation, Callable[[Tensor, Tensor, QKTables, str], tuple[Tensor, Tensor]]] = {
    Rotation.FUNCTIONAL: _functional,
    Rotation.TRITON: _triton,
    Rotation.COMPILED: _compiled_way,
    Rotation.FUSED_CPU: _fused_cpu,
    Rotation.ROLLED: _rolled,
    Rotation.EAGER: _eager,
}


def rotate_qk(
    q: Tensor, k: Tensor, tables: QKTables, layout: str = "half", kernel: str = "auto", inplace: bool = False
) -> tuple[Tensor, Tensor]:
    """Rotate q (B, H, Tq, D) by q's tables and k (B, Hkv, Tk, D) by k's, the way
    :func:`rotation_plan` picks. Returns new tensors of q's and k's dtypes, or q and k
    themselves, rotated, with ``inplace=True`` (inference only)."""
    way = tables.way(kernel, layout, q, k, inplace)
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

    ``cos``/``sin``: (B or 1, T, r/2), as made by :func:`~posenc.rotary.angles.angles_cos_sin`. Returns a new tensor
    of x's dtype (channels r.. copied unchanged), or x itself, rotated, with ``inplace=True``.
    """
    # An empty k (B, 0, 0, D): every way then rotates x alone (Triton launches programs for x only).
    k = x.new_empty(x.shape[0], 0, 0, x.shape[-1])
    c0 = cos.new_empty(1, 0, cos.shape[-1])
    return rotate_qk(x, k, QKTables(cos, sin, c0, c0), layout, kernel, inplace)[0]
