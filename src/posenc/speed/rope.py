"""RoPE: posenc against transformers, Liger-Kernel, flash-attn and a plain copy of q and k.

Each row times rotating q and k (B, H, T, D) once, all rows of one (dtype, mode, T) block in
one run, and reports the median milliseconds, the effective bandwidth (bytes of q and k read
and written, twice that for forward+backward) and the ratio to the copy: ``q.clone(),
k.clone()`` (plus a clone of their gradients for forward+backward), the memory floor of any
rotation that returns new tensors. Peers get their cos/sin precomputed (their cheapest path);
posenc is timed through ``RotaryEmbedding.rotate`` including the table lookup at position
ids. ``posenc`` is the default kernel ("auto": the Triton kernel on CUDA, compiled on CPU
when torch.compile works); compilation happens in the warm-up, not in the timing.

Rows (each only where it can run; :func:`measure`'s ``impls`` picks some):

* ``copy``; ``hf``: transformers' Llama ``apply_rotary_pos_emb``; ``hf-compiled``: the same
  through ``torch.compile`` (CUDA); ``ret``: rotary-embedding-torch (CPU);
* ``liger``: Liger-Kernel's ``liger_rotary_pos_emb``; ``flash-attn``: flash-attn's
  ``apply_rotary_emb`` on its own (B, T, H, D) layout (CUDA, when installed);
* ``posenc``, ``posenc-interleaved``, ``posenc-eager``, ``posenc-eager-interleaved``,
  ``posenc-compiled``; on CUDA ``posenc-triton-table`` (cos/sin rows gathered by position in
  the kernel), ``posenc-triton-angles`` (cos/sin from float64 angles in the kernel) and
  ``posenc-inplace`` (forward only).

On CUDA the time is measured with CUDA events over a few back-to-back calls.
"""

from __future__ import annotations

import os
import statistics
from typing import Any, Callable

import torch

from .timing import time_fn

__all__ = ["DTYPES", "MODES", "IMPLS", "CUDA_TOKENS", "resolve", "batch_for", "measure", "time_cuda"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODES = ("fwd", "fwd+bwd")
IMPLS = (
    "copy", "hf", "hf-compiled", "ret", "liger", "flash-attn",
    "posenc", "posenc-eager", "posenc-interleaved", "posenc-eager-interleaved", "posenc-compiled",
    "posenc-triton-table", "posenc-triton-angles", "posenc-inplace",
)
# Defaults per device type: (lengths, batch or None = TOKENS // T, heads, head_dim, modes)
CPU_DEFAULTS = dict(lengths=[512, 2048, 8192], batch=4, heads=8, head_dim=64, modes=["fwd"])
CUDA_DEFAULTS = dict(lengths=[1024, 4096, 16384, 32768], batch=None, heads=32, head_dim=128, modes=list(MODES))
#: on CUDA, B = CUDA_TOKENS // T unless a batch is given: q alone is 512 MiB in bfloat16 at
#: H = 32, D = 128, far above any L2, so the copy reaches the DRAM bandwidth.
CUDA_TOKENS = 1 << 16


def resolve(device: str, **given: Any) -> dict[str, Any]:
    """The settings to time on ``device``: lengths, batch, heads, head_dim and modes, each from
    ``given`` unless it is None there, else the device type's default (:data:`CPU_DEFAULTS`,
    :data:`CUDA_DEFAULTS`). A batch of None means :func:`batch_for` each length."""
    base = CUDA_DEFAULTS if torch.device(device).type == "cuda" else CPU_DEFAULTS
    unknown = set(given) - set(base)
    if unknown:
        raise TypeError(f"resolve: unknown settings {sorted(unknown)}; known: {', '.join(base)}")
    out = {name: list(value) if isinstance(value, list) else value for name, value in base.items()}
    out.update({name: value for name, value in given.items() if value is not None})
    return out


def batch_for(batch: int | None, T: int) -> int:
    """B for length T: ``batch``, or CUDA_TOKENS // T (at least 1) when it is None."""
    return batch if batch is not None else max(1, CUDA_TOKENS // T)


def _cuda_peers(q, k, pos, dtype) -> dict[str, Callable]:
    """transformers (eager and compiled), Liger-Kernel and flash-attn, each where importable."""
    fns: dict[str, Callable] = {}
    D = q.shape[-1]
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float32, device=q.device) / D)
    emb = torch.cat([pos[:1, :, None].float() * inv] * 2, -1)  # (1, T, D), HF's convention
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        fns["hf"] = lambda: apply_rotary_pos_emb(q, k, cos, sin)
        hf_c = torch.compile(apply_rotary_pos_emb, fullgraph=True)
        fns["hf-compiled"] = lambda: hf_c(q, k, cos, sin)
    except ImportError:
        pass
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        fns["liger"] = lambda: liger_rotary_pos_emb(q, k, cos, sin)
    except ImportError:
        pass
    try:
        from flash_attn.layers.rotary import apply_rotary_emb

        # flash-attn's layout is (B, T, H, D) with cos/sin (T, D/2): give it its own contiguous copies.
        qf = q.detach().transpose(1, 2).contiguous().requires_grad_(q.requires_grad)
        kf = k.detach().transpose(1, 2).contiguous().requires_grad_(k.requires_grad)
        cf, sf = cos[0, :, : D // 2].contiguous(), sin[0, :, : D // 2].contiguous()
        fns["flash-attn"] = lambda: (apply_rotary_emb(qf, cf, sf), apply_rotary_emb(kf, cf, sf))
        fns["flash-attn"].inputs = (qf, kf)  # the tensors its backward differentiates
    except ImportError:
        pass
    return fns


def _candidates(B: int, H: int, T: int, D: int, dtype: torch.dtype, device: str = "cpu", grad: bool = False) -> dict:
    """name -> zero-argument function rotating q and k (B, H, T, D); ``fn.inputs`` = (q, k) leaves."""
    import posenc
    from ..rotary.functional import triton_available

    dev = torch.device(device)
    q = torch.randn(B, H, T, D, dtype=dtype, device=dev, requires_grad=grad)
    k = torch.randn(B, H, T, D, dtype=dtype, device=dev, requires_grad=grad)
    pos = torch.arange(T, device=dev).expand(B, T)  # as SequenceInfo.from_offset makes them
    qc, kc = q.detach(), k.detach()
    fns: dict = {"copy": (lambda: (qc.clone(), kc.clone())) if not grad else
                 (lambda: (qc.clone(), kc.clone(), qc.clone(), kc.clone()))}  # + the gradients' copy
    fns["copy"].inputs = None
    if dev.type == "cuda":
        fns.update(_cuda_peers(q, k, pos, dtype))
    else:
        try:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
            emb = torch.cat([pos[..., None].float() * inv] * 2, -1)  # (B, T, D)
            cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
            fns["hf"] = lambda: apply_rotary_pos_emb(q, k, cos, sin)
        except ImportError:
            pass
        try:
            from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb

            freqs = RotaryEmbedding(dim=D)(torch.arange(T), seq_len=T)  # precomputed (T, D)
            fns["ret"] = lambda: (apply_rotary_emb(freqs, q), apply_rotary_emb(freqs, k))
        except ImportError:
            pass
    kernels = [("auto", ""), ("eager", "-eager")] + ([("compiled", "-compiled")] if dev.type == "cuda" else [])
    for layout in ("half", "interleaved"):
        for kernel, suffix in kernels:
            if layout == "interleaved" and kernel == "compiled":
                continue
            rope = posenc.build("rope", d_model=H * D, num_heads=H, layout=layout, kernel=kernel)
            name = "posenc" + suffix + ("" if layout == "half" else "-interleaved")
            fns[name] = lambda rope=rope: rope.rotate(q, k, pos, pos)
    # The Triton rows on CUDA, or on CPU under Triton's interpreter (tests: tiny shapes only).
    if triton_available() and (dev.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
        from ..rotary import triton_rope as tr
        from ..rotary.angles import angles_cos_sin

        rope = posenc.build("rope", d_model=H * D, num_heads=H)
        inv_freq, factor = rope.frequencies()
        inv_freq = inv_freq.to(dev)  # float64 on the device: no host copy per call
        table = angles_cos_sin(torch.arange(T, device=dev), inv_freq, factor)  # 2 x (T, D/2) float32
        p1 = pos[:1]  # (1, T): the same positions for the batch
        fns["posenc-triton-table"] = lambda: tr.rotary_qk_table(q, k, *table, p1, p1, check_positions=False)  # arange: in range
        fns["posenc-triton-angles"] = lambda: tr.rotary_qk_angles(q, k, inv_freq, p1, p1, factor)
        if not grad:
            cos, sin = rope.cos_sin(pos)
            qi, ki = qc.clone(), kc.clone()  # its own buffers: the other rows keep their inputs
            fns["posenc-inplace"] = lambda: tr.rotary_qk(qi, ki, cos, sin, cos, sin, inplace=True)
    for name, fn in fns.items():
        if not hasattr(fn, "inputs"):
            fn.inputs = (q, k)
    return fns


def _with_backward(fn: Callable, grads_like: Callable) -> Callable:
    """fn's forward and the gradient of q and k for fixed output gradients (no .grad accumulation)."""
    if fn.inputs is None:
        return fn
    state: dict = {}

    def run():
        out = fn()
        if "g" not in state:
            state["g"] = grads_like(out)
        return torch.autograd.grad(out, fn.inputs, state["g"])

    return run


def time_cuda(fn: Callable[[], object], *, warmup: int = 3, repeat: int = 5, inner: int = 5) -> float:
    """Median seconds per call of ``fn`` on the current CUDA stream: CUDA events around
    ``inner`` back-to-back calls (launch overhead hidden as in a model), ``repeat`` times."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(times)


def measure(
    device: str,
    *,
    lengths: list[int],
    batch: int | None,
    heads: int,
    head_dim: int,
    modes: list[str],
    dtypes: list[str] = ("float32", "bfloat16"),
    impls: list[str] | None = None,
    repeat: int = 5,
) -> list[dict]:
    """One record per (dtype, mode, T, impl): median ms, GB/s and the ratio to the copy in the same
    block. ``impls``: the rows to time (default every one available here; the copy always);
    a row asked for that cannot run here is left out (see :func:`resolve` for the defaults)."""
    cuda = torch.device(device).type == "cuda"
    timer = (lambda f: time_cuda(f, repeat=repeat)) if cuda else (lambda f: time_fn(f, warmup=2, repeat=repeat))
    rows = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        for mode in modes:
            grad = mode == "fwd+bwd"
            for T in lengths:
                B = batch_for(batch, T)
                with torch.inference_mode(not grad):
                    fns = _candidates(B, heads, T, head_dim, dtype, device, grad)
                    names = [n for n in fns if impls is None or n in impls or n == "copy"]
                    if grad:
                        fns = {n: _with_backward(fns[n], lambda out: tuple(torch.randn_like(o) for o in out))
                               for n in names}
                    times = {n: timer(fns[n]) for n in names}
                    times["copy"] = min(times["copy"], timer(fns["copy"]))  # bracket the block
                moved = 2 * 2 * B * heads * T * head_dim * dtype.itemsize * (2 if grad else 1)
                rows += [
                    dict(dtype=dname, mode=mode, T=T, B=B, impl=n, ms=1e3 * times[n],
                         gbps=moved / times[n] / 1e9, x_copy=times[n] / times["copy"])
                    for n in names
                ]
                if cuda:
                    del fns
                    torch.cuda.empty_cache()
    return rows
