"""``posenc example``: a short worked example, one small model per encoding family.

It builds a decoder with each chosen encoding, runs a forward pass and greedy decoding
with the KV cache, and prints the parameter count the encoding adds. Encodings are named by
spec (:mod:`posenc.variants`)::

    posenc example                               # every registered encoding
    posenc example rope rope:base=500000 t5:num_buckets=16 --length 32
"""

from __future__ import annotations

import argparse

from ..examples import run_example
from ..variants import SPEC_HELP
from .args import positive_int


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("example", help="build a tiny model per encoding and run it")
    p.add_argument("encodings", nargs="*", metavar="SPEC", help=f"encodings to show (default: all); each {SPEC_HELP}")
    p.add_argument("--length", type=positive_int, default=16, help="sequence length of the forward pass")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = run_example(args.encodings, args.length)  # a bad spec fails before any output
    print("model: decoder, d_model=64, 2 layers, 4 heads; batch of 2 random byte sequences")
    print(f"{'encoding':<22}{'family':<10}{'enc. params':>12}  logits        generated")
    for r in rows:
        print(f"{r['name']:<22}{r['family']:<10}{r['encoding_params']:>12}  {str(r['logits_shape']):<13} {r['generated']} tokens")
    return 0
