"""`posenc speed rope` options and the rotary kernel choice (Triton kernel, in place; issue 12)."""

from __future__ import annotations

import os

import torch

from posenc.rotary.angles import angles_cos_sin
from posenc.rotary.functional import apply_rotary_qk

from . import Case

A = "speed rope"
K = "rotary kernel"

# `--device cuda` is refused only where CUDA is missing; on a GPU machine an index past the
# last device is (the same check, the same one line).
_BAD_CUDA = "cuda" if not torch.cuda.is_available() else "cuda:99"


def _qk(requires_grad: bool = False):
    q = torch.randn(1, 2, 3, 8, requires_grad=requires_grad)
    c, s = angles_cos_sin(torch.arange(3)[None], 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    return q, c, s


def _triton_on_cpu():
    q, c, s = _qk()
    saved = os.environ.pop("TRITON_INTERPRET", None)  # the interpreter is for tests only
    try:
        apply_rotary_qk(q, q, c, s, c, s, kernel="triton")
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def _unknown_kernel():
    q, c, s = _qk()
    apply_rotary_qk(q, q, c, s, c, s, kernel="cuda")


def _inplace_with_grad():
    q, c, s = _qk(requires_grad=True)
    apply_rotary_qk(q, q.detach(), c, s, c, s, inplace=True)


def _inplace_not_bool():
    q, c, s = _qk()
    apply_rotary_qk(q, q, c, s, c, s, inplace="yes")


def _inplace_same_tensor():
    q, c, s = _qk()
    with torch.no_grad():
        apply_rotary_qk(q, q, c, s, c, s, inplace=True)


def _auto_on_cpu() -> str:
    q, c, s = _qk()
    out = apply_rotary_qk(q, q, c, s, c, s, kernel="auto")
    want = apply_rotary_qk(q, q, c, s, c, s, kernel="eager")
    # the fused CPU kernel (when built) rounds as ATen's addcmul_ does on an FMA CPU: within a rounding elsewhere
    same = all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(out, want))
    return f"kernel='auto' on CPU tensors never picks Triton: {'same result as eager' if same else 'DIFFERS'}"


CASES = [
    Case(A, "--lengths 0", r"argument --lengths: must be a positive int, got 0",
         argv=["speed", "rope", "--lengths", "0"]),
    Case(A, "--head-dim 63 (odd)", r"argument --head-dim: must be an even positive int, got 63",
         argv=["speed", "rope", "--head-dim", "63"]),
    Case(A, "--repeat 0", r"argument --repeat: must be a positive int, got 0", argv=["speed", "rope", "--repeat", "0"]),
    Case(A, "--batch 0", r"argument --batch: must be a positive int, got 0", argv=["speed", "rope", "--batch", "0"]),
    Case(A, "--device banana", r"argument --device: must be one of cpu, cuda, mps \(or cuda:N\), got 'banana'",
         argv=["speed", "rope", "--device", "banana"]),
    Case(A, "--device cuda without CUDA (cuda:99 with it)",
         r"argument --device: (CUDA is not available on this machine|CUDA device index must be in)",
         argv=["speed", "rope", "--device", _BAD_CUDA],
         doc="without CUDA: posenc speed rope: error: argument --device: CUDA is not available on this machine, "
             "got 'cuda'; use --device cpu; with it: argument --device: CUDA device index must be in [0, N-1] "
             "on this machine, got 'cuda:99'"),
    Case(K, "kernel='triton' on CPU tensors (outside TRITON_INTERPRET=1)",
         r"kernel='triton' needs (CUDA tensors, got tensors on cpu|the triton package)", run=_triton_on_cpu,
         doc="with triton installed: kernel='triton' needs CUDA tensors, got tensors on cpu; use kernel='auto', "
             "'eager' or 'compiled' on CPU (or TRITON_INTERPRET=1 in tests). Without it: kernel='triton' needs the "
             "triton package (pip install triton); use kernel='auto', 'eager' or 'compiled'"),
    Case(K, "an unknown kernel name", r"kernel must be one of .*'triton'.*got 'cuda'", run=_unknown_kernel),
    Case(K, "inplace=True while q requires grad", r"inplace=True is for inference", run=_inplace_with_grad),
    Case(K, "inplace given a string", r"inplace must be a bool, got 'yes'", run=_inplace_not_bool, error=TypeError),
    Case(K, "inplace=True with q and k the same tensor", r"inplace=True needs q and k in separate memory",
         run=_inplace_same_tensor),
    Case(K, "kernel='auto' on CPU tensors", r"never picks Triton: same result as eager", run=_auto_on_cpu, error=None),
]


def _kernel_folder_is_a_file():
    import tempfile

    from posenc.rotary import cpu_rope

    with tempfile.NamedTemporaryFile() as f:
        saved, kept = os.environ.get("POSENC_KERNELS"), (cpu_rope._module, cpu_rope._looked)
        os.environ["POSENC_KERNELS"] = f.name
        try:
            cpu_rope.build()
        finally:
            cpu_rope._module, cpu_rope._looked = kept
            if saved is None:
                del os.environ["POSENC_KERNELS"]
            else:
                os.environ["POSENC_KERNELS"] = saved


def _kernel_not_built() -> str:
    from posenc.rotary import cpu_rope

    saved = cpu_rope._module, cpu_rope._looked
    cpu_rope._module, cpu_rope._looked = None, True
    try:
        q, c, s = _qk()
        with torch.no_grad():
            out = apply_rotary_qk(q, q, c, s, c, s)
            want = apply_rotary_qk(q, q, c, s, c, s, kernel="eager")
    finally:
        cpu_rope._module, cpu_rope._looked = saved
    same = torch.equal(out[0], want[0])
    return f"a small CPU step without the fused kernel built rotates in eager PyTorch: {'same result' if same else 'DIFFERS'}"


def _kernel_truncated() -> str:
    import tempfile
    from pathlib import Path

    from posenc.rotary import cpu_rope

    real = cpu_rope.kernel()
    saved = cpu_rope._module, cpu_rope._looked, os.environ.get("POSENC_KERNELS")
    with tempfile.TemporaryDirectory() as root:
        os.environ["POSENC_KERNELS"] = root
        cpu_rope._module, cpu_rope._looked = None, False
        try:
            folder = cpu_rope.build_directory()
            folder.mkdir()
            if real is not None:  # the real library cut short, beside its own record
                (folder / f"{folder.name}.so").write_bytes(Path(real.__file__).read_bytes()[:1000])
                (folder / cpu_rope.RECORD).write_bytes((Path(real.__file__).parent / cpu_rope.RECORD).read_bytes())
            else:
                (folder / f"{folder.name}.so").write_bytes(b"\x7fELF")
            got = cpu_rope.kernel()
        finally:
            cpu_rope._module, cpu_rope._looked = saved[:2]
            if saved[2] is None:
                del os.environ["POSENC_KERNELS"]
            else:
                os.environ["POSENC_KERNELS"] = saved[2]
    return f"a truncated kernel library is {'not loaded: small CPU steps rotate in eager PyTorch' if got is None else 'LOADED'}"


CASES += [
    Case(K, "the fused CPU kernel's library truncated on disk", r"is not loaded: small CPU steps rotate in eager",
         run=_kernel_truncated, error=None),
    Case(K, "POSENC_KERNELS names a file (building the fused CPU kernel)",
         r"cannot create the kernel folder .*; set POSENC_KERNELS to a writable folder", run=_kernel_folder_is_a_file,
         error=RuntimeError,
         doc="cannot create the kernel folder <POSENC_KERNELS>/posenc_rope_cpu_<hash> (NotADirectoryError: Not a "
             "directory); set POSENC_KERNELS to a writable folder"),
    Case(K, "the fused CPU kernel not built", r"rotates in eager PyTorch: same result", run=_kernel_not_built,
         error=None),
]
