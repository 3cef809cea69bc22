"""RoPE: posenc against transformers, rotary-embedding-torch and a plain copy of q and k.

Example::

    posenc speed rope                         # T = 512, 2048, 8192; float32 and bfloat16
    posenc speed rope --lengths 512 --dtypes float32 --repeat 3
    posenc speed rope --json > rope.json

Each row times rotating q and k (B, H, T, D) once, all rows of one (dtype, T) block in one
run, and reports the median milliseconds and the ratio to the copy (``q.clone(), k.clone()``:
the memory floor of any rotation that returns new tensors). Peers get their cos/sin
precomputed (their cheapest path); posenc is timed through ``RotaryEmbedding.rotate``
including the table lookup at position ids. ``posenc`` is the default kernel ("auto":
compiled when torch.compile works); compilation happens in the warm-up, not in the timing.
"""

from __future__ import annotations

import argparse
import json

import torch

from .timing import describe_machine, time_fn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
IMPLS = ("copy", "hf", "ret", "posenc", "posenc-eager", "posenc-interleaved", "posenc-eager-interleaved")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192], help="sequence lengths T")
    p.add_argument("--batch", type=int, default=4, help="batch size B")
    p.add_argument("--heads", type=int, default=8, help="heads H")
    p.add_argument("--head-dim", type=int, default=64, help="head dim D")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES), help="dtypes to time")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=None,
                   help="implementations to time (default: all available; the copy is always timed)")
    p.add_argument("--repeat", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")


def _candidates(B: int, H: int, T: int, D: int, dtype: torch.dtype) -> dict:
    import posenc

    q, k = torch.randn(B, H, T, D, dtype=dtype), torch.randn(B, H, T, D, dtype=dtype)
    pos = torch.arange(T).expand(B, T)  # as SequenceInfo.from_offset makes them
    fns: dict = {"copy": lambda: (q.clone(), k.clone())}
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
    for layout in ("half", "interleaved"):
        for kernel in ("auto", "eager"):
            rope = posenc.build("rope", d_model=H * D, num_heads=H, layout=layout, kernel=kernel)
            name = "posenc" + ("" if kernel == "auto" else f"-{kernel}") + ("" if layout == "half" else "-interleaved")
            fns[name] = lambda rope=rope: rope.rotate(q, k, pos, pos)
    return fns


def measure(args: argparse.Namespace) -> list[dict]:
    """One record per (dtype, T, impl): median ms and the ratio to the copy in the same block."""
    rows = []
    with torch.inference_mode():
        for dname in args.dtypes:
            for T in args.lengths:
                fns = _candidates(args.batch, args.heads, T, args.head_dim, DTYPES[dname])
                names = [n for n in fns if args.impls is None or n in args.impls or n == "copy"]
                times = {n: time_fn(fns[n], warmup=2, repeat=args.repeat) for n in names}
                times["copy"] = min(times["copy"], time_fn(fns["copy"], warmup=1, repeat=args.repeat))  # bracket
                rows += [
                    dict(dtype=dname, T=T, impl=n, ms=1e3 * times[n], x_copy=times[n] / times["copy"])
                    for n in names
                ]
    return rows


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = measure(args)
    shape = dict(B=args.batch, H=args.heads, D=args.head_dim)
    if args.json:
        print(json.dumps({"target": "rope", "machine": describe_machine(), **shape, "rows": rows}, indent=1))
        return 0
    print(f"# RoPE speed: rotate q and k (B={args.batch}, H={args.heads}, T, D={args.head_dim}); "
          f"median of {args.repeat}; {describe_machine()}")
    print(f"{'dtype':<9} {'T':>6}  {'impl':<26} {'ms':>9} {'x copy':>7}")
    for r in rows:
        print(f"{r['dtype']:<9} {r['T']:>6}  {r['impl']:<26} {r['ms']:>9.3f} {r['x_copy']:>7.2f}")
    return 0
