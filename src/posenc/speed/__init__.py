"""``posenc speed TARGET``: side-by-side timing benchmarks (ratios measured in one run).

Each target is a module of this package exposing ``add_arguments(parser)`` and
``run(args) -> int``; the scripts in ``benchmarks/`` call the same functions.
Timing helpers shared by all targets live in :mod:`posenc.speed.timing`.
"""

from __future__ import annotations

import argparse
import importlib

# target name -> module (relative to this package)
TARGETS: dict[str, str] = {
    "rope": "rope",
    "relative": "relative",
    "model": "model",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("speed", help="time encodings side by side against baselines")
    sub = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    for name, module in TARGETS.items():
        mod = importlib.import_module(f"{__name__}.{module}")
        tp = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        mod.add_arguments(tp)
        tp.set_defaults(func=mod.run)
