"""``posenc list``: the registered encodings with their papers, or the benchmark tasks.

(The module is ``list_``: a submodule named ``list`` would become the ``posenc.cli`` package's
attribute ``list`` and hide the builtin there.)
"""

from __future__ import annotations

import argparse

from ..registry import FAMILIES, get_info, list_encodings


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("list", help="list the registered encodings with their papers")
    p.add_argument("--family", choices=FAMILIES, default=None, help="only this family")
    p.add_argument("--short", action="store_true", help="one line per encoding, without the paper")
    p.add_argument("--tasks", action="store_true", help="list the benchmark tasks (posenc bench --tasks) instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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


def _list_tasks() -> int:
    from ..bench.tasks import get_task, task_names

    names = task_names()
    width = max(len(n) for n in names)
    for name in names:
        print(f"{name:<{width}}  {get_task(name).describe()}")
    return 0
