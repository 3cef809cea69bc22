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
    "probe": "posenc.hf.cli",
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


def main(argv: Sequence[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    """Run ``posenc <argv>``; returns the exit code.

    Bad options exit 2 from argparse with one line naming the option; errors the library
    raises for bad values (ValueError, TypeError) or files (OSError) are one line and exit 2;
    Ctrl-C, at any moment, is one line ``posenc: interrupted`` and exit 130, never a traceback.
    ``parser``: one already built (the console script builds it under its own Ctrl-C guard).
    """
    command = "posenc"
    try:
        # building the parser imports every subcommand module (and torch): inside the try,
        # so a Ctrl-C there is handled like one during the work
        parser = build_parser() if parser is None else parser
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help (0) or a bad option (2, its one line already printed)
            return 0 if e.code is None else int(e.code)
        command = " ".join(["posenc", args.command, *([args.target] if getattr(args, "target", None) else [])])
        return int(args.func(args) or 0)
    except KeyboardInterrupt as e:
        detail = str(e)  # bench's Interrupted says where its checkpoint is
        print(f"posenc: interrupted{': ' + detail if detail else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and friends
        sys.stderr.close()
        return 0
    except (ValueError, TypeError, OSError) as e:
        print(f"{command}: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _one_line(e: BaseException) -> str:
    """The exception's message on one line (an OSError without one: its strerror and file)."""
    msg = str(e)
    if isinstance(e, OSError) and e.strerror:
        msg = f"{e.strerror}: {e.filename!r}" if e.filename else e.strerror
    return " ".join(msg.split()) or type(e).__name__

