"""RoPE: posenc against transformers, rotary-embedding-torch and a plain copy of q and k.

Example::

    posenc speed rope                         # T = 512, 2048, 8192; float32 and bfloat16
    posenc speed rope --lengths 512 --dtypes float32 --repeat 3

Each row times rotating q and k (B, H, T, D) once, in one run, and reports milliseconds and
the ratio to the copy (``q.clone(), k.clone()``: the memory floor of any rotation that
returns new tensors). Peers get their cos/sin precomputed (their cheapest path); posenc is
timed through ``RotaryEmbedding.rotate`` including the table lookup at position ids.
"""

from __future__ import annotations

import argparse

import torch

from .timing import describe_machine, time_fn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192], help="sequence lengths T")
    p.add_argument("--batch", type=int, default=4, help="batch size B")
    p.add_argument("--heads", type=int, default=8, help="heads H")
    p.add_argument("--head-dim", type=int, default=64, help="head dim D")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES), help="dtypes to time")
    p.add_argument("--impls", nargs="+", default=None,
                   help="subset of: copy hf ret posenc-eager posenc-compiled posenc-eager-interleaved "
                        "posenc-compiled-interleaved (default: all available)")
    p.add_argument("--repeat", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")


def _candidates(B: int, H: int, T: int, D: int, dtype: torch.dtype) -> dict:
    import posenc

    q, k = torch.randn(B, H, T, D, dtype=dtype), torch.randn(B, H, T, D, dtype=dtype)
    pos = torch.arange(T).expand(B, T)
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
        from rotary_embedding_torch import RotaryEmbedding

        ret = RotaryEmbedding(dim=D)
        freqs = ret(torch.arange(T), seq_len=T)  # precomputed (T, D)
        from rotary_embedding_torch import apply_rotary_emb

        fns["ret"] = lambda: (apply_rotary_emb(freqs, q), apply_rotary_emb(freqs, k))
    except ImportError:
        pass
    for layout in ("half", "interleaved"):
        for kernel in ("eager", "compiled"):
            rope = posenc.build("rope", d_model=H * D, num_heads=H, layout=layout, kernel=kernel)
            name = f"posenc-{kernel}" + ("" if layout == "half" else "-interleaved")
            fns[name] = (lambda rope=rope: rope.rotate(q, k, pos, pos))
    return fns


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# RoPE speed, B={args.batch} H={args.heads} D={args.head_dim}; {describe_machine()}")
    print(f"{'dtype':<9} {'T':>6}  {'impl':<28} {'ms':>9} {'x copy':>7}")
    with torch.inference_mode():
        for dname in args.dtypes:
            for T in args.lengths:
                fns = _candidates(args.batch, args.heads, T, args.head_dim, DTYPES[dname])
                names = [n for n in fns if args.impls is None or n in args.impls]
                if "copy" not in names:
                    names.insert(0, "copy")
                times = {n: time_fn(fns[n], warmup=2, repeat=args.repeat) for n in names}
                for n in names:
                    print(f"{dname:<9} {T:>6}  {n:<28} {1e3 * times[n]:>9.3f} {times[n] / times['copy']:>7.2f}")
    return 0
