"""User code the command line imports before it builds the subcommands: ``--import MODULE``
(repeatable, before the subcommand; a module name or a path to a ``.py`` file) and every entry
point of the ``posenc.plugins`` group. So the encodings (``@posenc.register``) and tasks
(``@posenc.bench.tasks.register_task``) they register are visible to every subcommand.

Every failure is one ``ValueError`` naming the module, which ``posenc`` prints as one line.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Sequence

from ..text import one_line

__all__ = ["PLUGIN_GROUP", "user_modules", "import_user_module", "load_plugins"]

# every entry point of this group is imported before the subcommands are built
PLUGIN_GROUP = "posenc.plugins"


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
