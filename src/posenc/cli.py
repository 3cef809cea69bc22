"""The ``posenc`` command line: a thin layer over the library.

Examples::

    posenc list                      # every encoding, its family, summary and paper
    posenc example                   # a worked example: a small model per family

Each subcommand lives in the module that owns its work; this file only wires them up.
Subcommand modules expose ``add_parser(subparsers)`` that registers the parser and sets
``func`` to a function taking the parsed args and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# name -> module that provides add_parser(subparsers). Order is the order of --help.
SUBCOMMANDS: dict[str, str] = {
    "list": "posenc.cli",
    "example": "posenc.examples",
    "speed": "posenc.speed",
    "check": "posenc.analysis.checks",
    "plot": "posenc.analysis.plots",
    "bench": "posenc.bench",
    "report": "posenc.analysis.report",
}


def _cmd_list(args: argparse.Namespace) -> int:
    from .registry import get_info, list_encodings

    names = list_encodings(args.family)
    width = max(len(n) for n in names)
    for name in names:
        info = get_info(name)
        print(f"{name:<{width}}  [{info.family}] {info.summary}")
        if not args.short:
            print(f"{'':<{width}}    paper: {info.paper}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from .registry import FAMILIES

    p = subparsers.add_parser("list", help="list the registered encodings with their papers")
    p.add_argument("--family", choices=FAMILIES, default=None, help="only this family")
    p.add_argument("--short", action="store_true", help="one line per encoding, without the paper")
    p.set_defaults(func=_cmd_list)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posenc", description="Transformer positional encodings: list, check, plot, benchmark."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, PermissionError) as e:
        print(f"posenc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and friends
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"posenc {args.command}: interrupted", file=sys.stderr)
        return 130
