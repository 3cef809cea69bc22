"""``posenc speed TARGET``: side-by-side timing benchmarks (ratios measured in one run).

Each target is a module of this package exposing ``add_arguments(parser)`` and
``run(args) -> int``, and calling :mod:`posenc.speed`; its docstring's first line is its help.
The scripts in ``benchmarks/`` call the same functions.
"""

from __future__ import annotations

import argparse
import importlib

# target name -> module
TARGETS: dict[str, str] = {
    "rope": "posenc.cli.speed_rope",
    "relative": "posenc.cli.speed_relative",
    "model": "posenc.cli.speed_model",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("speed", help="time encodings side by side against baselines")
    sub = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    for name, module in TARGETS.items():
        mod = importlib.import_module(module)
        tp = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(tp)
        tp.set_defaults(func=mod.run)
