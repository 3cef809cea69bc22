"""The ``posenc`` command line: a thin layer over the library.

Examples::

    posenc list                      # every encoding, its family, summary and paper
    posenc list --tasks              # the benchmark tasks
    posenc example                   # a worked example: a small model per family
    posenc --import mymod bench ...  # encodings and tasks registered in mymod.py, everywhere
    posenc --version

Each subcommand lives in the module that owns its work; this file only wires them up.
Subcommand modules expose ``add_parser(subparsers)`` that registers the parser and sets
``func`` to a function taking the parsed args and returning an exit code.

User code: ``--import MODULE`` (repeatable, before the subcommand; a module name or a path to
a ``.py`` file) and every entry point of the ``posenc.plugins`` group are imported before the
subcommands are built, so the encodings (``@posenc.register``) and tasks
(``@posenc.bench.tasks.register_task``) they register are visible to every subcommand.

Conventions shared by the subcommands: ``--json [PATH]`` writes the results as JSON to PATH
(the table is still printed) or, without PATH, to stdout in place of the table
(:func:`posenc.cli.args.add_json_option`); encodings are named by spec, ``NAME`` or
``NAME:KEY=VALUE,...`` (:mod:`posenc.variants`), where a subcommand takes encodings.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Sequence

from .._optional import MissingExtra
from ..text import plain

# name -> module that provides add_parser(subparsers). Order is the order of --help.
SUBCOMMANDS: dict[str, str] = {
    "list": "posenc.cli",
    "example": "posenc.examples",
    "speed": "posenc.speed",
    "check": "posenc.analysis.runner",
    "plot": "posenc.analysis.plots",
    "bench": "posenc.cli.bench",
    "report": "posenc.analysis.report",
    "probe": "posenc.hf.cli",
    "extend": "posenc.hf.extend",
}


PLUGIN_GROUP = "posenc.plugins"


def _cmd_list(args: argparse.Namespace) -> int:
    from ..registry import get_info, list_encodings

    if args.tasks:
        return _list_tasks()
    names = list_encodings(args.family)
    width = max(len(n) for n in names)
    for name in names:
        info = get_info(name)
        print(f"{name:<{width}}  [{info.family}] {info.summary}")
        if not args.short:
            print(f"{'':<{width}}    paper: {info.paper}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ..registry import FAMILIES

    p = subparsers.add_parser("list", help="list the registered encodings with their papers")
    p.add_argument("--family", choices=FAMILIES, default=None, help="only this family")
    p.add_argument("--short", action="store_true", help="one line per encoding, without the paper")
    p.add_argument("--tasks", action="store_true", help="list the benchmark tasks (posenc bench --tasks) instead")
    p.set_defaults(func=_cmd_list)


def _list_tasks() -> int:
    from ..bench.tasks import get_task, task_names

    names = task_names()
    width = max(len(n) for n in names)
    for name in names:
        if name == "lm":
            print(f"{name:<{width}}  byte-level language modelling, perplexity at multiples of --lm-length")
            continue
        task = get_task(name)
        doc = (type(task).__doc__ or "").strip().splitlines()
        where = type(task).__module__
        print(f"{name:<{width}}  {doc[0] if doc else '(no docstring)'}  [{where}, min length {task.min_length}]")
    return 0


def user_modules(argv: Sequence[str]) -> list[str]:
    """The values of ``--import`` given before the subcommand in ``argv``."""
    found, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--import":
            if i + 1 < len(argv):
                found.append(argv[i + 1])
            i += 2  # a missing value is argparse's error, reported when parsing
        elif tok.startswith("--import="):
            found.append(tok.split("=", 1)[1])
            i += 1
        elif tok.startswith("-"):
            i += 1  # another top-level option (--help, --version)
        else:  # the subcommand: what follows is its own, where --import would be unrecognized
            late = [t for t in argv[i + 1:] if t == "--import" or t.startswith("--import=")]
            if late:
                raise ValueError(f"--import must come before the subcommand (posenc --import MODULE {tok} ...), "
                                 f"got it after {tok!r}")
            break
    return found


def import_user_module(spec: str) -> ModuleType:
    """Import ``spec``: a module name (searched on ``sys.path``, then in the current
    directory, as ``python -m`` would) or a path to a ``.py`` file.

    Every failure is a ``ValueError`` naming the module: not found, or the exception its
    code raised (with the file and line where it was raised).
    """
    if not spec:
        raise ValueError("--import must be a module name or a path to a .py file, got ''")
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        return _import_file(spec)
    if not all(part.isidentifier() for part in spec.split(".")):
        raise ValueError(f"--import must be a module name (dotted identifiers) or a path to a .py file, got {spec!r}")
    try:
        return _run_import(spec, lambda: importlib.import_module(spec))
    except ModuleNotFoundError as e:
        missing_self = e.name is not None and (spec == e.name or spec.startswith(e.name + "."))
        cwd = os.getcwd()
        if not missing_self or cwd in sys.path:
            raise ValueError(f"--import {spec}: {e}") from None
    sys.path.insert(0, cwd)  # `posenc` as a console script does not search the current directory
    try:
        return _run_import(spec, lambda: importlib.import_module(spec))
    except ModuleNotFoundError as e:
        raise ValueError(f"--import {spec}: {e} (searched sys.path and the current directory; "
                         "a file can be given as a path, e.g. ./mymod.py)") from None


def _import_file(spec: str) -> ModuleType:
    path = Path(spec).expanduser().resolve()
    if not path.is_file() or path.suffix != ".py":
        raise ValueError(f"--import must be a module name or an existing .py file, got {spec!r} "
                         f"({'missing' if not path.exists() else 'not a .py file'})")
    for module in list(sys.modules.values()):  # imported before (main called twice in one process)
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path:
            return module
    name = path.stem if path.stem.isidentifier() else "posenc_user_module"
    if name in sys.modules:
        raise ValueError(f"--import {spec}: a module named {name!r} is already imported; rename the file")
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name

    def load() -> ModuleType:
        module_spec.loader.exec_module(module)
        return module

    try:
        return _run_import(spec, load)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def _run_import(spec: str, load) -> ModuleType:
    """``load()``, with an exception from the module's own code turned into one ValueError."""
    try:
        return load()
    except ModuleNotFoundError:
        raise
    except (Exception, SystemExit) as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
        raise ValueError(f"--import {spec}: the module raised {type(e).__name__}: {one_line(e)}{where}") from None


def load_plugins(argv: Sequence[str] | None = None) -> None:
    """Import the ``posenc.plugins`` entry points, then each ``--import`` module of ``argv``."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            ep.load()
        except Exception as e:
            raise ValueError(f"entry point {ep.name!r} ({ep.value}) of group {PLUGIN_GROUP!r} failed to load: "
                             f"{type(e).__name__}: {one_line(e)}") from None
    for spec in user_modules(sys.argv[1:] if argv is None else argv):
        import_user_module(spec)


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


def one_line(e: BaseException) -> str:
    """The exception's message on one line (an OSError without one: its strerror and file)."""
    msg = str(e)
    if isinstance(e, OSError) and e.strerror:
        msg = f"{e.strerror}: {e.filename!r}" if e.filename else e.strerror
    return " ".join(msg.split()) or type(e).__name__

