"""The fused CPU rotary kernel (posenc.rotary.cpu_rope): the eager rolled form's bits, q and k
in one call, taken by the plan only when built, and never built by a forward."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import posenc
from posenc.rotary import cpu_rope, functional
from posenc.rotary.functional import QKTables, Rotation, rotation_plan
from posenc.rotary.kernels import half_rolled_tables, rotate_half_rolled


def _tables(B: int, T: int, D: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = torch.rand(B, T, D // 2, generator=g) * 2 - 1, torch.rand(B, T, D // 2, generator=g) * 2 - 1
    return half_rolled_tables(cos, sin)  # (B, 1, T, D)


@pytest.mark.parametrize("D", [2, 6, 16, 18, 64, 128])
@pytest.mark.parametrize("table_batch", [1, 3])
def test_fused_kernel_is_the_rolled_form(cpu_kernel, D, table_batch):
    """Against rotate_half_rolled (x·[cos | cos], then addcmul_ of roll(x, D/2)·[-sin | sin]):
    q a projection's transposed view, k with fewer heads (grouped-query), tables of one row or
    one per batch row, q's and k's apart (xPos), several positions."""
    g = torch.Generator().manual_seed(D)
    B, H, Hkv, T = 3, 4, 2, 5
    q = torch.randn(B, T, H, D, generator=g).transpose(1, 2)  # (B, H, T, D), not contiguous
    k = torch.randn(B, Hkv, T, D, generator=g) * 1e3
    cq, sq = _tables(table_batch, T, D, g)
    ck, sk = _tables(table_batch, T, D, g)
    fq, fk = cpu_kernel.rotate_half_qk(q, k, cq, sq, ck, sk)
    eq, ek = rotate_half_rolled(q, cq, sq), rotate_half_rolled(k, ck, sk)
    for fused, eager in ((fq, eq), (fk, ek)):
        assert fused.shape == eager.shape and fused.dtype == torch.float32 and fused.is_contiguous()
        # one product rounded, then a fused multiply-add: the bits of ATen's addcmul_ on an FMA
        # CPU (this machine's); within a rounding of it on any other
        torch.testing.assert_close(fused, eager, rtol=1e-6, atol=1e-6 * eager.abs().max().item())


def test_fused_kernel_against_the_rotation_formula(cpu_kernel):
    """Each output pair (x_j, x_j+D/2) is the rotation of the input pair by the angle whose
    cos and sin the table holds (float64 reference, per element)."""
    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 3, 4, 8
    h = D // 2
    x = torch.randn(B, H, T, D, generator=g)
    ang = torch.rand(B, T, h, generator=g, dtype=torch.float64) * 6.28
    c2, s2 = half_rolled_tables(ang.cos().float(), ang.sin().float())
    out, _ = cpu_kernel.rotate_half_qk(x, x, c2, s2, c2, s2)
    xd, c, s = x.double(), ang.cos().float().double(), ang.sin().float().double()
    for b in range(B):
        for hh in range(H):
            for t in range(T):
                for j in range(h):
                    a, bb, cj, sj = xd[b, hh, t, j].item(), xd[b, hh, t, j + h].item(), c[b, t, j].item(), s[b, t, j].item()
                    want = (a * cj - bb * sj, bb * cj + a * sj)
                    got = (out[b, hh, t, j].item(), out[b, hh, t, j + h].item())
                    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_fused_kernel_refuses_what_it_does_not_read(cpu_kernel):
    x, c2 = torch.randn(1, 2, 3, 8), torch.ones(1, 1, 3, 8)
    with pytest.raises(RuntimeError, match="float32"):
        cpu_kernel.rotate_half_qk(x.double(), x, c2, c2, c2, c2)
    with pytest.raises(RuntimeError, match="must fit"):
        cpu_kernel.rotate_half_qk(x, x, c2[..., :2, :], c2[..., :2, :], c2, c2)


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_the_plan_takes_the_fused_kernel_for_small_float32_steps_only(cpu_kernel, name, spy):
    """auto, CPU, float32, no autograd, a small step: FUSED_CPU, the same result as the eager
    rolled form; kernel="eager", bfloat16 or float64, autograd, or partial rotary take another way."""
    H, D = 2, 16
    enc = posenc.build(name, d_model=H * D, num_heads=H)
    pos = torch.tensor([[40, 41], [7, 8]])
    q, k = torch.randn(2, H, 2, D), torch.randn(2, H, 2, D)
    calls = spy(cpu_kernel, "rotate_half_qk")
    with torch.no_grad():
        state = enc.prepare(pos, pos)
        assert rotation_plan("auto", "half", q, k, state.tables).way is Rotation.FUSED_CPU
        fq, fk = enc.rotate(q, k, pos, pos, state=state)
        assert calls == [1]
        rq, rk = functional.WAYS[Rotation.ROLLED](q, k, state.tables, "half")
        assert rotation_plan("eager", "half", q, k, state.tables).way is Rotation.ROLLED
        for dt in (torch.bfloat16, torch.float64):
            assert rotation_plan("auto", "half", q.to(dt), k.to(dt), state.tables).way is Rotation.ROLLED
    torch.testing.assert_close(fq, rq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fk, rk, rtol=1e-6, atol=1e-6)
    assert rotation_plan("auto", "half", q.requires_grad_(), k, state.tables).way is Rotation.FUNCTIONAL


def test_an_unbuilt_kernel_is_never_built_by_a_forward(no_cpu_kernel, spy):
    """Not built: the plan takes the eager rolled form, and the kept plan follows when the
    kernel appears (the plans are keyed on it)."""
    rope = posenc.build("rope", d_model=32, num_heads=2)
    pos = torch.tensor([[3]])
    q = torch.randn(1, 2, 1, 16)
    built = spy(cpu_rope, "build")
    with torch.no_grad():
        state = rope.prepare(pos, pos)
        assert state.tables.way("auto", "half", q, q) is Rotation.ROLLED
        rope.rotate(q, q, pos, pos, state=state)
    assert built == []


def test_the_kept_plan_follows_the_kernel_appearing(cpu_kernel, monkeypatch):
    q = torch.randn(1, 2, 1, 16)
    c, s = torch.ones(1, 1, 8), torch.zeros(1, 1, 8)
    with torch.no_grad():
        monkeypatch.setattr(cpu_rope, "_module", None)
        monkeypatch.setattr(cpu_rope, "_looked", True)
        assert QKTables.shared(c, s).way("auto", "half", q, q) is Rotation.ROLLED
        monkeypatch.setattr(cpu_rope, "_module", cpu_kernel)
        assert QKTables.shared(c, s).way("auto", "half", q, q) is Rotation.FUSED_CPU


def test_a_foreign_or_truncated_library_is_never_loaded(cpu_kernel, tmp_path, monkeypatch):
    """kernel() imports the library only when its record's sha256 matches its bytes: a file
    without a record, or the real library truncated (whose loading can crash the process with
    SIGBUS), reads as not built, in a fresh process too."""
    import subprocess
    import sys

    monkeypatch.setenv("POSENC_KERNELS", str(tmp_path))
    monkeypatch.setattr(cpu_rope, "_module", None)
    monkeypatch.setattr(cpu_rope, "_looked", False)
    folder, real = cpu_rope.build_directory(), Path(cpu_kernel.__file__)
    assert folder.parent == tmp_path
    folder.mkdir()
    so = folder / f"{folder.name}.so"
    so.write_bytes(b"not a shared library")
    assert cpu_rope.kernel() is None
    so.write_bytes(real.read_bytes()[:1000])  # truncated, with the real library's record
    (folder / cpu_rope.RECORD).write_bytes((real.parent / cpu_rope.RECORD).read_bytes())
    monkeypatch.setattr(cpu_rope, "_looked", False)
    assert cpu_rope.kernel() is None
    probe = "from posenc.rotary import cpu_rope; print(cpu_rope.kernel())"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "POSENC_KERNELS": str(tmp_path)})
    assert run.returncode == 0 and run.stdout.strip() == "None", run.stderr


def test_the_build_directory_is_one_per_source_torch_and_python(monkeypatch, tmp_path):
    monkeypatch.setenv("POSENC_KERNELS", str(tmp_path))
    here = cpu_rope.build_directory()
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert cpu_rope.build_directory() != here and cpu_rope.build_directory().parent == tmp_path


@pytest.mark.parametrize("table_batch", [1, 3])
def test_fused_interleaved_kernel_is_the_eager_complex_product(cpu_kernel, table_batch):
    """The interleaved layout: pairs (x_2j, x_2j+1) turned by cos/sin (B|1, T, D/2), against the
    eager kernel's complex product and, per element, the rotation formula in float64."""
    g = torch.Generator().manual_seed(table_batch)
    B, H, Hkv, T, D = 3, 4, 2, 5, 16
    q = torch.randn(B, T, H, D, generator=g).transpose(1, 2)
    k = torch.randn(B, Hkv, T, D, generator=g)
    ang = torch.rand(table_batch, T, D // 2, generator=g, dtype=torch.float64) * 6.28
    cos, sin = ang.cos().float(), ang.sin().float()
    tables = QKTables(cos, sin, cos, sin)
    fq, fk = cpu_kernel.rotate_interleaved_qk(q, k, cos, sin, cos, sin)
    eq, ek = functional.WAYS[Rotation.EAGER](q, k, tables, "interleaved")
    torch.testing.assert_close(fq, eq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fk, ek, rtol=1e-6, atol=1e-6)
    a, b = q.double()[..., 0::2], q.double()[..., 1::2]
    c, s = cos.double()[:, None], sin.double()[:, None]
    torch.testing.assert_close(fq.double()[..., 0::2], a * c - b * s, rtol=0, atol=1e-6)
    torch.testing.assert_close(fq.double()[..., 1::2], b * c + a * s, rtol=0, atol=1e-6)


def test_the_plan_takes_the_fused_kernel_for_the_interleaved_layout(cpu_kernel, spy):
    """rope_axial (interleaved pairs) decoding: FUSED_CPU, its rotation equal to the eager kernel's."""
    enc = posenc.build("rope_axial", d_model=64, num_heads=2, grid_width=8)
    pos = torch.tensor([[40]])
    q, k = torch.randn(1, 2, 1, 32), torch.randn(1, 2, 1, 32)
    calls = spy(cpu_kernel, "rotate_interleaved_qk")
    with torch.no_grad():
        state = enc.prepare(pos, pos)
        fq, fk = enc.rotate(q, k, pos, pos, state=state)
        assert calls == [1]
        eq, ek = functional.WAYS[Rotation.EAGER](q, k, state, "interleaved")
    torch.testing.assert_close(fq, eq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fk, ek, rtol=1e-6, atol=1e-6)


def test_an_install_without_the_source_has_no_kernel(tmp_path, monkeypatch):
    """A source file missing (an install without the package data): not built, no error."""
    monkeypatch.setattr(cpu_rope, "SOURCES", (*cpu_rope.SOURCES[:1], tmp_path / "missing.cpp"))
    monkeypatch.setattr(cpu_rope, "_module", None)
    monkeypatch.setattr(cpu_rope, "_looked", False)
    assert cpu_rope.kernel() is None


@pytest.mark.parametrize("n", [1, 64, 65, 1000])
def test_check_positions_reads_small_and_large_alike(n):
    """check_positions reads a decoding step's few positions on the host and a long one's
    min/max on the device: the same largest position, the same refusals, either way."""
    from posenc.limits import MAX_POSITION, check_positions

    pos = torch.arange(n)[None] + 7
    assert check_positions(pos) == n + 6
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):
        check_positions(torch.cat([pos, torch.tensor([[-1]])], 1))
    with pytest.raises(ValueError, match="must be <= "):
        check_positions(torch.cat([pos, torch.tensor([[MAX_POSITION + 1]])], 1))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("D", [4, 6, 18, 64])
@pytest.mark.parametrize("tables", [(1, 1), (3, 1), (1, "H"), (3, "H")])
def test_per_head_kernel_is_rotate_heads(cpu_kernel, layout, D, tables):
    """rotate_heads_qk (rope_mixed's per-head tables, either layout) against axial._rotate_heads:
    tables of one row or one per batch row, shared or per head, q a projection's transposed
    view, k with fewer heads; within a rounding (one product rounded, then a fused multiply-add)."""
    from posenc.rotary.axial import _rotate_heads

    g = torch.Generator().manual_seed(D)
    B, H, Hkv, T = 3, 4, 2, 5
    tb, th = tables
    q = torch.randn(B, T, H, D, generator=g).transpose(1, 2)
    k = torch.randn(B, Hkv, T, D, generator=g) * 1e3
    ang_q = torch.rand(tb, H if th == "H" else 1, T, D // 2, generator=g, dtype=torch.float64) * 60
    ang_k = torch.rand(tb, Hkv if th == "H" else 1, T, D // 2, generator=g, dtype=torch.float64) * 60
    cq, sq, ck, sk = ang_q.cos().float(), ang_q.sin().float(), ang_k.cos().float(), ang_k.sin().float()
    fq, fk = cpu_kernel.rotate_heads_qk(q, k, cq, sq, ck, sk, layout == "interleaved")
    for fused, eager in ((fq, _rotate_heads(q, cq, sq, layout)), (fk, _rotate_heads(k, ck, sk, layout))):
        assert fused.shape == eager.shape and fused.is_contiguous()
        torch.testing.assert_close(fused, eager, rtol=1e-6, atol=2e-6 * eager.abs().max().item())
    with pytest.raises(RuntimeError, match="must fit x"):
        cpu_kernel.rotate_heads_qk(q, k, cq[..., :1], sq[..., :1], ck, sk, True)


@pytest.mark.parametrize("name,config", [("rope_mixed", {}), ("fope", {}), ("fope", {"coef_heads": 2})])
def test_rope_mixed_and_fope_take_the_kernel_without_autograd_only(cpu_kernel, name, config, monkeypatch):
    """rope_mixed (per-head tables) and FoPE (one coefficient set) rotate a no-grad float32
    step in one kernel call, the eager form's values within a rounding; FoPE with two sets, and
    any call under autograd, keep the eager form (and their gradients)."""
    from posenc.rotary import axial, fope

    enc = posenc.build(name, d_model=64, num_heads=4, **config)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 3, 16, generator=g), torch.randn(2, 4, 3, 16, generator=g)
    pos = torch.tensor([[5, 6, 7], [40, 41, 42]])
    calls = []

    class Spy:  # the built kernel, its functions' names noted as they are taken
        def __getattr__(self, fn):
            calls.append(fn)
            return getattr(cpu_kernel, fn)

    monkeypatch.setattr(cpu_rope, "_module", Spy())
    monkeypatch.setattr(cpu_rope, "_looked", True)
    with torch.no_grad():
        fused = enc.rotate(q, k, pos, pos, enc.prepare(pos, pos))
    assert calls == (["rotate_heads_qk" if name == "rope_mixed" else "rotate_half_qk"]
                     if config.get("coef_heads", 1) == 1 else [])
    calls.clear()
    qg = q.clone().requires_grad_()  # under autograd: the eager form, with the kernel built
    out = enc.rotate(qg, k, pos, pos, enc.prepare(pos, pos))
    out[0].sum().backward()
    assert qg.grad is not None and not calls
    monkeypatch.setattr(axial, "_fused_heads", lambda *a: None)
    monkeypatch.setattr(fope, "_fused", lambda *a: None)
    with torch.no_grad():
        eager = enc.rotate(q, k, pos, pos, enc.prepare(pos, pos))
    for a, b in zip(fused, eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_fope_inv_freq_is_kept_per_setting(monkeypatch):
    """FoPE's kept frequencies are computed once per device and settings: a changed base gives
    the new frequencies, not the kept ones."""
    from posenc.rotary.fope import fope_kept_frequencies

    enc = posenc.build("fope", d_model=64, num_heads=4)
    first = enc.inv_freq()
    assert enc.inv_freq() is first
    enc.config.base = 500.0
    want = fope_kept_frequencies(16, 500.0, enc.config.max_position_embeddings, enc.config.num_inv_freq)
    assert torch.equal(enc.inv_freq(), want) and not torch.equal(want, first[: want.numel()])


def test_kernel_on_takes_the_library_for_cpu_work_only(cpu_kernel):
    """kernel_on: the built library for a CPU tensor; None for one elsewhere (meta stands in for
    a GPU here) and inside a torch.compile trace, whose graph a C++ call would break."""
    assert cpu_rope.kernel_on(torch.zeros(2)) is cpu_kernel
    assert cpu_rope.kernel_on(torch.zeros(2, device="meta")) is None
    seen = []

    @torch.compile(backend="eager", fullgraph=False)
    def traced(x):
        seen.append(cpu_rope.kernel_on(x))
        return x + 1

    traced(torch.zeros(2))
    assert seen == [None]
