"""``posenc example``: a short worked example, one small model per encoding family.

It builds a decoder with each chosen encoding, runs a forward pass and greedy decoding
with the KV cache, and prints the parameter count the encoding adds. Encodings are named by
spec (:mod:`posenc.variants`)::

    posenc example                               # every registered encoding
    posenc example rope rope:base=500000 t5:num_buckets=16 --length 32
"""

from __future__ import annotations

import argparse

import torch

from .cli.args import positive_int
from .model import Transformer
from .model_config import ModelConfig
from .registry import get_info, list_encodings
from .variants import SPEC_HELP, parse_variant


def run_example(names: list[str] | None = None, length: int = 16) -> list[dict]:
    """Build a tiny decoder per encoding spec; return one summary dict per encoding.

    ``length`` (>= 1) is the forward pass's sequence length; decoding starts from its first
    ``min(4, length)`` tokens. Specs are checked before any model is built.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an int >= 1, got {length!r}")
    variants = [parse_variant(n) for n in (names or list_encodings())]
    rows = []
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (2, length))
    for v in variants:
        info = get_info(v.name)
        model = Transformer(ModelConfig(encoding=v.name, encoding_config=v.config_dict(), d_model=64, n_layer=2,
                                        n_head=4)).eval()
        with torch.no_grad():
            logits = model(tokens)
            gen = model.generate(tokens[:, :4], 4)
        rows.append(
            dict(
                name=v.label,
                family=info.family,
                encoding_params=model.num_parameters(encodings_only=True),
                logits_shape=tuple(logits.shape),
                generated=gen.shape[1],
            )
        )
    return rows


def _cmd(args: argparse.Namespace) -> int:
    rows = run_example(args.encodings, args.length)  # a bad spec fails before any output
    print("model: decoder, d_model=64, 2 layers, 4 heads; batch of 2 random byte sequences")
    print(f"{'encoding':<22}{'family':<10}{'enc. params':>12}  logits        generated")
    for r in rows:
        print(f"{r['name']:<22}{r['family']:<10}{r['encoding_params']:>12}  {str(r['logits_shape']):<13} {r['generated']} tokens")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("example", help="build a tiny model per encoding and run it")
    p.add_argument("encodings", nargs="*", metavar="SPEC", help=f"encodings to show (default: all); each {SPEC_HELP}")
    p.add_argument("--length", type=positive_int, default=16, help="sequence length of the forward pass")
    p.set_defaults(func=_cmd)
