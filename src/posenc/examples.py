"""``posenc example``: a short worked example, one small model per encoding family.

It builds a decoder with each chosen encoding, runs a forward pass and greedy decoding
with the KV cache, and prints the parameter count the encoding adds.
"""

from __future__ import annotations

import argparse

import torch

from .cli_args import positive_int
from .model import ModelConfig, Transformer
from .registry import get_info, list_encodings


def run_example(names: list[str] | None = None, length: int = 16) -> list[dict]:
    """Build a tiny decoder per encoding; return one summary dict per encoding."""
    names = names or list_encodings()
    rows = []
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (2, length))
    for name in names:
        info = get_info(name)
        model = Transformer(ModelConfig(encoding=name, d_model=64, n_layer=2, n_head=4)).eval()
        with torch.no_grad():
            logits = model(tokens)
            gen = model.generate(tokens[:, :4], 4)
        rows.append(
            dict(
                name=name,
                family=info.family,
                encoding_params=model.num_parameters(encodings_only=True),
                logits_shape=tuple(logits.shape),
                generated=gen.shape[1],
            )
        )
    return rows


def _cmd(args: argparse.Namespace) -> int:
    print("model: decoder, d_model=64, 2 layers, 4 heads; batch of 2 random byte sequences")
    print(f"{'encoding':<22}{'family':<10}{'enc. params':>12}  logits        generated")
    for r in run_example(args.encodings, args.length):
        print(f"{r['name']:<22}{r['family']:<10}{r['encoding_params']:>12}  {str(r['logits_shape']):<13} {r['generated']} tokens")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("example", help="build a tiny model per encoding and run it")
    p.add_argument("encodings", nargs="*", help="encodings to show (default: all)")
    p.add_argument("--length", type=positive_int, default=16, help="sequence length of the forward pass")
    p.set_defaults(func=_cmd)
