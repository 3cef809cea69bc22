"""Relative attention terms: skew/gather scores vs a materialized (T, T, D) table, and biased SDPA.

``posenc speed relative``; the rows and the goals: :mod:`posenc.speed.relative`. Example::

    posenc speed relative --lengths 512 1024 2048 4096 --json out/relative_speed.json
    posenc speed relative --lengths 256 --repeat 3          # a quick look
    posenc speed relative --lengths 256 --json > rel.json    # JSON only, on stdout

Progress lines go to stderr, so stdout holds only the table (or the JSON).
"""

from __future__ import annotations

import argparse

from ..speed.relative import DTYPES, format_table, run_relative_speed
from .args import add_json_option, default_device, emit_json, even_positive_int, int_at_least, positive_int
from .args import device as device_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", type=int_at_least(2), nargs="+", default=[512, 1024, 2048, 4096],
                   help="sequence lengths T (>= 2)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch size B")
    p.add_argument("--heads", type=positive_int, default=8, help="heads H")
    p.add_argument("--head-dim", type=even_positive_int, default=64, help="head dim D (even: rotary pairs)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="tensor dtype")
    p.add_argument("--device", type=device_arg, default=default_device(), help="cpu, cuda or cuda:N")
    p.add_argument("--repeat", type=positive_int, default=5, help="timed repetitions per row (median reported)")
    p.add_argument("--einsum-max-length", type=positive_int, default=None,
                   help="skip the (T, T, D) einsum above this T (it needs T*T*D*4 bytes)")
    add_json_option(p)


def run(args: argparse.Namespace) -> int:
    report = run_relative_speed(
        args.lengths, batch=args.batch, heads=args.heads, head_dim=args.head_dim, dtype=DTYPES[args.dtype],
        device=args.device, repeat=args.repeat, einsum_max_length=args.einsum_max_length,
    )
    if not emit_json(args.json, report):
        print(format_table(report))
    return 0
