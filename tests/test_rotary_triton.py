"""The Triton RoPE kernel: interpreter tests (in a subprocess), optional-dependency behaviour,
kernel choice, the in-place option, and `posenc speed rope`'s CUDA options on a CPU machine.

The kernel tests themselves live in ``tests/rotary_triton_cases.py`` and run here in a
subprocess with ``TRITON_INTERPRET=1``: the variable must be set before triton is first
imported (other test files may import it through torch.compile), and must not leak into them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc.rotary.angles import angles_cos_sin
from posenc.rotary.functional import _use_triton, apply_rotary, apply_rotary_qk

HERE = Path(__file__).resolve().parent
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=600)


def _inv_freq(r: int) -> torch.Tensor:
    return 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e .[test] installs it on Linux x86_64)")
def test_kernel_matches_reference_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "rotary_triton_cases.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE.parent, timeout=900)
    tail = (p.stdout + p.stderr)[-4000:]
    assert p.returncode == 0, tail
    m = re.search(r"(\d+) passed", p.stdout)
    assert m and int(m.group(1)) >= 50, tail  # the whole parametrized set ran, not a skip
    assert "failed" not in p.stdout and "skipped" not in p.stdout, tail


def test_import_posenc_does_not_import_triton():
    p = _run_python(
        "import sys, torch, posenc\n"
        "rope = posenc.build('rope', d_model=16, num_heads=2)\n"
        "q = torch.randn(1, 2, 3, 8); pos = torch.arange(3)[None]\n"
        "rope.rotate(q, q, pos, pos)\n"
        "assert 'triton' not in sys.modules, 'triton imported'\n"
        "assert 'posenc.rotary.triton_rope' not in sys.modules\n"
        "print('ok')"
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_without_triton_cpu_paths_work_and_triton_kernel_is_a_clear_error():
    p = _run_python(
        "import sys; sys.modules['triton'] = None  # as if not installed\n"
        "import torch, posenc\n"
        "from posenc.rotary.functional import triton_available\n"
        "assert not triton_available()\n"
        "q = torch.randn(1, 2, 3, 8); pos = torch.arange(3)[None]\n"
        "a = posenc.build('rope', d_model=16, num_heads=2).rotate(q, q, pos, pos)\n"
        "b = posenc.build('rope', d_model=16, num_heads=2, kernel='eager').rotate(q, q, pos, pos)\n"
        "assert torch.equal(a[0], b[0])\n"
        "try:\n"
        "    posenc.build('rope', d_model=16, num_heads=2, kernel='triton').rotate(q, q, pos, pos)\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "kernel='triton' needs the triton package" in p.stdout


def test_triton_kernel_on_cpu_without_the_interpreter_is_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(1, 2, 3, 8)
    c, s = angles_cos_sin(torch.arange(3)[None], _inv_freq(8))
    want = "needs CUDA tensors, got tensors on cpu" if HAS_TRITON else "needs the triton package"
    with pytest.raises(ValueError, match=want):
        apply_rotary_qk(q, q, c, s, c, s, kernel="triton")
    with pytest.raises(ValueError, match=want):
        apply_rotary(q, c, s, kernel="triton")


def test_auto_picks_triton_only_for_cuda_tensors():
    q = torch.randn(1, 2, 3, 8)
    c, s = angles_cos_sin(torch.arange(3)[None], _inv_freq(8))
    assert not _use_triton("auto", (q, q), (c, s))
    assert not _use_triton("eager", (q, q), (c, s))
    assert not _use_triton("compiled", (q, q), (c, s))


class _FakeCuda:
    """Stands in for a CUDA tensor in the kernel choice (which reads only these attributes)."""

    is_cuda = True

    def __init__(self, dtype=torch.bfloat16, requires_grad=False):
        self.dtype, self.requires_grad = dtype, requires_grad


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_auto_picks_triton_for_cuda_tensors_it_supports():
    t = _FakeCuda
    assert _use_triton("auto", (t(), t()), (t(torch.float32), t(torch.float32)))
    assert _use_triton("auto", (t(torch.float16), t(torch.float16)), (t(torch.float32),))
    assert _use_triton("auto", (t(requires_grad=True), t()), (t(torch.float32),))  # backward by -theta
    assert not _use_triton("auto", (t(torch.float64), t(torch.float64)), (t(torch.float32),))  # eager/compiled
    assert not _use_triton("auto", (t(), t(torch.float16)), (t(torch.float32),))  # mixed dtypes
    assert not _use_triton("auto", (t(), t()), (t(torch.float32, requires_grad=True),))  # cos/sin gradient
    assert not _use_triton("compiled", (t(), t()), (t(torch.float32),))


def test_unknown_kernel_and_layout_are_errors():
    q = torch.randn(1, 2, 3, 8)
    c, s = angles_cos_sin(torch.arange(3)[None], _inv_freq(8))
    with pytest.raises(ValueError, match="kernel.*'triton'.*got 'cuda'"):
        apply_rotary_qk(q, q, c, s, c, s, kernel="cuda")
    with pytest.raises(ValueError, match="layout.*got 'neox'"):
        apply_rotary(q, c, s, layout="neox")


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_inplace_on_cpu_kernels(layout):
    # eager only: "compiled" shares the copy-back (and compiling costs ~30 s on a small CPU)
    kernel = "eager"
    q, k = torch.randn(2, 2, 5, 10), torch.randn(2, 1, 5, 10)
    c, s = angles_cos_sin(torch.arange(5)[None], _inv_freq(6))
    want = apply_rotary_qk(q, k, c, s, c, s, layout, kernel="eager")
    q2, k2 = q.clone(), k.clone()
    with torch.inference_mode():
        got = apply_rotary_qk(q2, k2, c, s, c, s, layout, kernel=kernel, inplace=True)
    assert got[0] is q2 and got[1] is k2
    torch.testing.assert_close(q2, want[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(k2, want[1], rtol=0, atol=1e-6)
    x = q.clone()
    with torch.no_grad():
        assert apply_rotary(x, c, s, layout, kernel=kernel, inplace=True) is x
    torch.testing.assert_close(x, want[0], rtol=0, atol=1e-6)


def test_inplace_needs_no_grad_and_a_bool():
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    c, s = angles_cos_sin(torch.arange(3)[None], _inv_freq(8))
    with pytest.raises(ValueError, match="inplace=True is for inference"):
        apply_rotary_qk(q, q.detach(), c, s, c, s, kernel="eager", inplace=True)
    with pytest.raises(TypeError, match="inplace must be a bool, got 'yes'"):
        apply_rotary_qk(q.detach(), q.detach(), c, s, c, s, inplace="yes")
