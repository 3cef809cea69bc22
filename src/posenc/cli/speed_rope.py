"""RoPE: posenc against transformers, Liger-Kernel, flash-attn and a plain copy of q and k.

``posenc speed rope``; what each row times: :mod:`posenc.speed.rope`. Example::

    posenc speed rope                         # CPU: T = 512, 2048, 8192; float32 and bfloat16
    posenc speed rope --lengths 512 --dtypes float32 --repeat 3
    posenc speed rope --json > rope.json
    posenc speed rope --device cuda           # T = 1k..32k, B*T = 64k tokens, H = 32, D = 128,
                                              # forward and forward+backward
"""

from __future__ import annotations

import argparse
import sys

import torch

from ..speed.rope import CUDA_TOKENS, DTYPES, IMPLS, MODES, measure, resolve
from ..speed.timing import describe_machine
from .args import add_json_option, default_device, emit_json, even_positive_int, positive_int
from .args import device as device_arg

SETTINGS = ("lengths", "batch", "heads", "head_dim", "modes")  # their defaults depend on the device


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=device_arg, default=default_device(),
                   help="cpu or cuda[:N] (default: cuda when available); the defaults below depend on it")
    p.add_argument("--lengths", type=positive_int, nargs="+", default=None,
                   help="sequence lengths T (default: 512 2048 8192 on CPU, 1024 4096 16384 32768 on CUDA)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help=f"batch size B (default: 4 on CPU, {CUDA_TOKENS} // T on CUDA)")
    p.add_argument("--heads", type=positive_int, default=None, help="heads H (default: 8 on CPU, 32 on CUDA)")
    p.add_argument("--head-dim", type=even_positive_int, default=None,
                   help="head dim D, even (default: 64 on CPU, 128 on CUDA)")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["float32", "bfloat16"], help="dtypes to time")
    p.add_argument("--modes", nargs="+", choices=MODES, default=None,
                   help="fwd, fwd+bwd (default: fwd on CPU, both on CUDA)")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=None,
                   help="implementations to time (default: all available; the copy is always timed)")
    p.add_argument("--repeat", type=positive_int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)")
    add_json_option(p)


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    s = resolve(args.device, **{name: getattr(args, name) for name in SETTINGS})
    rows = measure(args.device, **s, dtypes=args.dtypes, impls=args.impls, repeat=args.repeat)
    missing = set(args.impls or ()) - {r["impl"] for r in rows}
    if missing:
        print(f"posenc speed rope: not available on {args.device} here: {', '.join(sorted(missing))}", file=sys.stderr)
    shape = dict(B=s["batch"] if s["batch"] is not None else f"{CUDA_TOKENS} // T", H=s["heads"], D=s["head_dim"])
    if emit_json(args.json, {"target": "rope", "device": args.device, "machine": describe_machine(), **shape, "rows": rows}):
        return 0
    print(f"# RoPE speed: rotate q and k (B={shape['B']}, H={s['heads']}, T, D={s['head_dim']}) on {args.device}; "
          f"median of {args.repeat}; {describe_machine()}")
    print(f"{'dtype':<9} {'mode':<8} {'T':>6}  {'impl':<26} {'ms':>9} {'GB/s':>8} {'x copy':>7}")
    for r in rows:
        print(f"{r['dtype']:<9} {r['mode']:<8} {r['T']:>6}  {r['impl']:<26} {r['ms']:>9.3f} {r['gbps']:>8.1f} "
              f"{r['x_copy']:>7.2f}")
    return 0
