"""The ``posenc`` command line: a thin layer over the library.

Examples::

    posenc list                      # every encoding, its family, summary and paper
    posenc list --tasks              # the benchmark tasks
    posenc example                   # a worked example: a small model per family
    posenc --import mymod bench ...  # encodings and tasks registered in mymod.py, everywhere
    posenc --version

Each subcommand is one module of this package (:data:`SUBCOMMANDS`), thin: it parses and
calls the library, which never imports this package. A subcommand module exposes
``add_parser(subparsers)``, which registers its parser and sets ``func`` to a function taking
the parsed args and returning an exit code; this file only wires them up and turns errors into
one line. Argparse types: :mod:`posenc.cli.args`.

User code: ``--import MODULE`` and the ``posenc.plugins`` entry points are imported before the
subcommands are built (:mod:`posenc.cli.plugins`), so what they register is visible to every
subcommand.

Conventions shared by the subcommands: ``--json [PATH]`` writes the results as JSON to PATH
(the table is still printed) or, without PATH, to stdout in place of the table
(:func:`posenc.cli.args.add_json_option`); encodings are named by spec, ``NAME`` or
``NAME:KEY=VALUE,...`` (:mod:`posenc.variants`), where a subcommand takes encodings.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from .._optional import MissingExtra
from ..text import one_line, plain
from .plugins import load_plugins

# name -> module that provides add_parser(subparsers). Order is the order of --help.
SUBCOMMANDS: dict[str, str] = {
    "list": "posenc.cli.list_",
    "example": "posenc.cli.example",
    "speed": "posenc.cli.speed",
    "check": "posenc.cli.check",
    "plot": "posenc.cli.plot",
    "bench": "posenc.cli.bench",
    "report": "posenc.cli.report",
    "probe": "posenc.cli.probe",
    "extend": "posenc.cli.extend",
    "rope": "posenc.cli.rope",
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``posenc`` parser, after loading user code (:func:`load_plugins`) named in ``argv``
    (default ``sys.argv[1:]``), so that subcommands see what it registers."""
    from .. import __version__

    load_plugins(argv)
    parser = argparse.ArgumentParser(
        prog="posenc", description="Transformer positional encodings: list, check, plot, benchmark."
    )
    import torch

    parser.add_argument("--version", action="version", version=f"posenc {__version__} (torch {torch.__version__})")
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=[],
                        help="import this module first (a name or a path to a .py file; repeatable), so that the "
                             "encodings and tasks it registers are visible to every subcommand")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        importlib.import_module(module).add_parser(sub)
    for p in all_parsers(parser):  # descriptions come from docstrings: --help shows them as plain text
        p.description = plain(p.description)
        for action in p._actions:
            action.help = plain(action.help)
    return parser


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it (``posenc speed model`` included)."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                found.extend(all_parsers(sub))
    return found


def main(argv: Sequence[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    """Run ``posenc <argv>``; returns the exit code.

    Bad options exit 2 from argparse with one line naming the option; errors the library
    raises for bad values (ValueError, TypeError), files (OSError) or a missing optional package
    (:class:`posenc._optional.MissingExtra`) are one line and exit 2;
    Ctrl-C, at any moment, is one line ``posenc: interrupted`` and exit 130, never a traceback.
    ``parser``: one already built (the console script builds it under its own Ctrl-C guard).
    """
    command = "posenc"
    # torch's profiler (kineto) logs two lines per profiled call to stderr at its top severity
    # (USDT, level 5) unless KINETO_LOG_LEVEL is above it; read once, when the profiler is first
    # used. `posenc speed` measures CPU peak memory with the profiler: 32 lines per length.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    try:
        # building the parser imports every subcommand module (and torch) and user modules
        # (--import): inside the try, so a Ctrl-C there is handled like one during the work
        parser = build_parser(argv) if parser is None else parser
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
    except (ValueError, TypeError, OSError, MissingExtra) as e:
        print(f"{command}: error: {one_line(e)}", file=sys.stderr)
        return 2

