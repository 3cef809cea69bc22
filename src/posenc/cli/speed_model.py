"""Whole-model cost of every encoding: a training step and KV-cache decoding, as ratios to NoPE.

``posenc speed model``; how it is measured and the goals: :mod:`posenc.speed.model`. ``--impl``
picks the attention backend of every model. Example::

    posenc speed model --lengths 1024 2048 --batch 8 --layers 6 --width 512 --heads 8
    posenc speed model --encodings none rope alibi --lengths 256 --json out/model_speed.json
    posenc speed model --encodings none alibi t5 --lengths 512 --layers 2 --impl sdpa
"""

from __future__ import annotations

import argparse
import json

import torch

from ..backends import IMPLS
from ..registry import get_info, list_encodings
from ..speed.model import format_table, run_model_speed
from .args import add_json_option, default_device, emit_json, positive_int
from .args import device as device_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encodings", nargs="*", default=None, help="encodings to time (default: all registered)")
    p.add_argument("--lengths", nargs="+", type=positive_int, default=[1024, 2048], help="training sequence lengths")
    p.add_argument("--batch", type=positive_int, default=8, help="training batch size")
    p.add_argument("--layers", type=positive_int, default=6, help="number of layers")
    p.add_argument("--width", type=positive_int, default=512, help="model width (divisible by --heads)")
    p.add_argument("--heads", type=positive_int, default=8, help="attention heads")
    p.add_argument("--rounds", type=positive_int, default=3, help="timed training rounds after one warm-up (the median ratio to NoPE counts)")
    p.add_argument("--decode-contexts", nargs="*", type=positive_int, default=[1024, 4096],
                   help="KV-cache contexts to decode at")
    p.add_argument("--decode-tokens", type=positive_int, default=16, help="decoding steps per round: rounds x this many timed steps per model, in turn with NoPE")
    p.add_argument("--device", type=device_arg, default=default_device(), help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="model dtype (default: float32 on CPU, bfloat16 on GPU)")
    p.add_argument("--impl", choices=IMPLS, default="sdpa",
                   help="attention backend of every model: eager, sdpa, flex or auto (default: sdpa)")
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=True,
                   help="each encoding in a process of its own, one at a time, with a NoPE of its own "
                        "(default; --no-isolate: every row in this process)")
    add_json_option(p)


def run(args: argparse.Namespace) -> int:
    names = args.encodings or list_encodings()
    for n in names:
        get_info(n)  # unknown names fail listing the valid ones
    if args.width % args.heads:  # the parser checked each alone; this is the pair
        raise ValueError(f"--width ({args.width}) must be divisible by --heads ({args.heads})")
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    res = run_model_speed(
        names, args.lengths, batch=args.batch, layers=args.layers, width=args.width, heads=args.heads,
        rounds=args.rounds, decode_contexts=args.decode_contexts, decode_tokens=args.decode_tokens,
        device=args.device, dtype=dtype, impl=args.impl, isolate=args.isolate,
    )
    table = format_table(res)  # before the JSON round trip turns the int keys into strings
    if not emit_json(args.json, json.loads(json.dumps(res, default=str))):  # dtypes as their names
        print(table)
    return 0
