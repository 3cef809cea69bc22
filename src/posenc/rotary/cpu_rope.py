"""The fused CPU rotary kernel: a small step's rotation of q and k in one call
(``csrc/rope_cpu.cpp``), PoPE's polar turn in one pass (``csrc/pope_cpu.cpp``), and two
sequential solves with their backwards, FLOATER's RK4 (``csrc/floater_cpu.cpp``,
:class:`posenc.absolute.floater._KernelSolve`) and the recurrent encoding's GRU steps
(``csrc/gru_cpu.cpp``, :func:`posenc.absolute.recurrent.kernel_scan`): one library of the CPU
paths that PyTorch ops would split into many small ones. A kernel's backward that must itself
be differentiable replays the work as PyTorch ops (:func:`replayed_grads`).

A decoding step rotates a few positions of q and k. On CPU the eager rolled form
(:func:`~posenc.rotary.kernels.rotate_half_rolled`) is three ATen ops per tensor, and in a
model each op's fixed cost (dispatch, allocation, Python, caches cold after the layer's
matmuls) is most of the rotation's time. This kernel does q and k in one call with the same
arithmetic: x·[cos | cos] rounded, then a fused multiply-add of roll(x, D/2)·[-sin | sin], as
ATen's ``addcmul_`` computes it. Measured in the speed table's model (6 layers, width 512,
1024 cached keys, 2 threads, a decoding step 600 times beside NoPE's, three runs): RoPE
1.048-1.055x NoPE's step with the eager rolled form, 1.028-1.030x with this kernel.
PoPE's turn (:func:`posenc.rotary.pope.polar_turn`) is four ATen ops forward and about a dozen
backward, each a pass over q or k; the kernel's forward and backward are one pass each, with
ATen's vectorised exp, log1p, expm1 and hypot (``ATen/cpu/vec``), compiled for the vector width
torch dispatches for on this CPU (:func:`torch.backends.cpu.get_cpu_capability`).

It is C++, compiled with torch's :func:`torch.utils.cpp_extension.load` (a C++ compiler and
ninja) into ``$POSENC_KERNELS`` or ``~/.cache/posenc/kernels``, one folder per source, flags,
CPU capability, torch and Python version. A forward never compiles: :func:`kernel` returns the
module only when it is built (this process, or an earlier one: the library is then imported,
no compiler run), and :func:`~posenc.rotary.functional.rotation_plan` takes it only then
(float32, CPU, no autograd, a small step, every channel rotated, either layout: the half
layout's rolled form or the interleaved layout's pairs), PoPE's turn likewise (float32 CPU,
with or without autograd, outside torch.compile). ``python -m posenc.rotary.build_cpu_kernel``
builds it (``make install`` does); :func:`build` from Python.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["build", "build_directory", "kernel", "kernel_on", "replayed_grads"]

SOURCES = tuple(Path(__file__).with_name("csrc") / f for f in ("rope_cpu.cpp", "pope_cpu.cpp", "floater_cpu.cpp",
                                                                 "gru_cpu.cpp"))
_FLAGS = ("-O3",)
# ATen's Vectorized<float> (pope_cpu.cpp) at the width torch dispatches for on this CPU: the
# library is built for, and named after, this machine's capability.
_CAPABILITY_FLAGS = {
    "AVX512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-DCPU_CAPABILITY_AVX512",
               "-DCPU_CAPABILITY=AVX512"),
    "AVX2": ("-mavx2", "-mfma", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"),
}
RECORD = "kernel.json"  # the library's sha256, written after it is complete: nothing else is loaded

_module: ModuleType | None = None
_looked = False


def _flags() -> tuple[str, ...]:
    """The compiler flags: -O3, and the vector ISA of this CPU's torch capability (none where
    torch dispatches to its default kernels: ATen's vectors are then plain loops)."""
    return (*_FLAGS, *_CAPABILITY_FLAGS.get(torch.backends.cpu.get_cpu_capability(), ()))


def _name() -> str:
    """The module's name: one per sources, flags (the CPU capability among them), torch and
    Python (a library built for another torch, or for a wider CPU, would not load, or worse)."""
    tag = f"|{_flags()}|{torch.__version__}|{sys.version_info[:2]}".encode()
    return "posenc_rope_cpu_" + hashlib.sha256(b"".join(f.read_bytes() for f in SOURCES) + tag).hexdigest()[:16]


def build_directory() -> Path:
    """Where the kernel is built: ``$POSENC_KERNELS`` if set (and not empty), else
    ``~/.cache/posenc/kernels``, then one folder per :func:`_name`."""
    env = os.environ.get("POSENC_KERNELS")
    root = Path(env) if env else Path.home() / ".cache" / "posenc" / "kernels"
    return root / _name()


def _import(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _verified(folder: Path, name: str) -> Path | None:
    """The library in ``folder`` when its record says it is complete (sha256 of its bytes): a
    truncated or foreign file is never loaded (loading a truncated library can crash the process)."""
    so = folder / f"{name}.so"
    try:
        digest = json.loads((folder / RECORD).read_text())["sha256"]
        return so if hashlib.sha256(so.read_bytes()).hexdigest() == digest else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kernel() -> ModuleType | None:
    """The built kernel's module, or None when it is not built. Looks on disk once per process
    (and again after :func:`build`); never compiles."""
    global _module, _looked
    if not _looked:
        _looked = True
        if not all(f.is_file() for f in SOURCES):  # an install without the package data: nothing to match a build against
            return None
        name = _name()
        path = _verified(build_directory(), name)
        if path is not None:
            try:
                _module = _import(path, name)
            except ImportError:  # built for something else: build() replaces it
                _module = None
    return _module


def kernel_on(x: torch.Tensor) -> ModuleType | None:
    """:func:`kernel` for work on ``x``: the built module when ``x`` is on CPU and no
    torch.compile trace is running (a C++ call would break the graph); None otherwise, and the
    caller runs its PyTorch ops. The callers check what else their kernel reads (dtypes, shapes)."""
    if torch.compiler.is_compiling() or not x.is_cpu:
        return None
    return kernel()


def build(verbose: bool = False) -> ModuleType:
    """Compile the kernel library (about 40 s on a 2-core CPU) into :func:`build_directory`, or load it
    when it is built already; from then on the rotation plan can take it. The compiler works in
    a folder of this process's own, and the library and its record are moved in when complete,
    so an interrupted build or a second process building at once leaves nothing half-written.
    Raises RuntimeError saying what is missing (a writable folder, a C++ compiler, ninja) when it
    cannot be built."""
    global _module, _looked
    _module, _looked = None, False  # look again, in the folder POSENC_KERNELS names now
    if kernel() is not None:
        return _module
    from torch.utils.cpp_extension import load  # imports setuptools: only when building

    folder, name = build_directory(), _name()
    work = folder.parent / f".{name}.tmp.{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        work.mkdir(exist_ok=True)
    except OSError as e:
        raise RuntimeError(f"cannot create the kernel folder {folder} ({type(e).__name__}: {e.strerror or e}); "
                           "set POSENC_KERNELS to a writable folder") from e
    try:
        module = load(name, sources=[str(f) for f in SOURCES], extra_cflags=list(_flags()), build_directory=str(work), verbose=verbose)
        so = work / f"{name}.so"
        (work / RECORD).write_text(json.dumps({"sha256": hashlib.sha256(so.read_bytes()).hexdigest()}))
        os.replace(so, folder / f"{name}.so")
        os.replace(work / RECORD, folder / RECORD)  # last: the library is complete before it is named
    except (OSError, RuntimeError, ImportError) as e:
        raise RuntimeError(f"the fused CPU rotary kernel could not be built in {folder} ({type(e).__name__}: {e}); "
                           "it needs a C++ compiler and ninja. Without it small CPU steps rotate with the "
                           "eager rolled form, and PoPE's turn, FLOATER's solve and the GRU run as PyTorch ops") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _module, _looked = module, True
    return _module


def replayed_grads(outputs: torch.Tensor, inputs: tuple, grad: torch.Tensor) -> tuple:
    """For a kernel's autograd Function whose backward must itself be differentiable
    (``create_graph``): the gradients of ``outputs``, a replay of the kernel's work as PyTorch
    ops, with respect to ``inputs`` (None for those that need none), as a graph."""
    need = [t for t in inputs if t.requires_grad]
    grads = iter(torch.autograd.grad(outputs, need, grad, create_graph=True, allow_unused=True) if need else ())
    return tuple(next(grads) if t.requires_grad else None for t in inputs)
