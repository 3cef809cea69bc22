"""``posenc plot KIND --out DIR``: the figures that explain why each scheme works.

Every figure of :data:`posenc.analysis.figures.FIGURES` draws one PNG and returns the data
behind it; this command draws one kind, or all of them, into ``DIR``.

Examples::

    posenc plot sinusoidal-heatmap --out figs
    posenc plot rope-score --out figs          # base 1e4 / 5e5 / 8e6 against a trained length
    posenc plot all --out figs                 # every kind
    posenc plot rope-score --set bases=1e4,1e6 --set train_len=8192 --out figs
"""

from __future__ import annotations

import argparse
import inspect
import sys
from typing import Any

from ..analysis.canvas import prepare_out_dir
from ..analysis.figures import FIGURES, make_plot
from .args import output_dir

__all__ = ["add_parser", "parse_options"]


def parse_options(kind: str, items: list[str]) -> dict[str, Any]:
    """``["key=value", ...]`` -> keyword arguments of figure ``kind``, typed like their defaults.

    Tuples are comma-separated (``bases=1e4,5e5``). An unknown key lists the valid ones.
    """
    params = {n: p.default for n, p in inspect.signature(FIGURES[kind].fn).parameters.items() if n != "out_dir"}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in params:
            raise ValueError(f"--set {item!r}: {kind} takes {', '.join(f'{k}={v}' for k, v in params.items())}")
        default = params[key]
        try:
            if isinstance(default, tuple):
                elem = type(default[0]) if default else float
                out[key] = tuple(elem(float(x)) if elem is int else elem(x) for x in raw.split(","))
            elif isinstance(default, int):
                out[key] = int(float(raw)) if float(raw).is_integer() else int(raw)
            else:
                out[key] = type(default)(raw)
        except ValueError:
            raise ValueError(f"--set {item!r}: {key} must be like {default!r}") from None
    return out


def _cmd_plot(args: argparse.Namespace) -> int:
    kinds = list(FIGURES) if args.kind == "all" else [args.kind]
    if args.kind != "all" and args.kind not in FIGURES:
        raise ValueError(f"unknown plot kind {args.kind!r}; valid kinds: all, {', '.join(FIGURES)}")
    if args.set and args.kind == "all":
        raise ValueError("--set applies to one plot kind, not to 'all'")
    options = parse_options(args.kind, args.set) if args.set else {}
    prepare_out_dir(args.out)
    failed = 0
    for kind in kinds:
        try:
            res = make_plot(kind, args.out, **options)
        except ValueError as e:
            if args.kind != "all":
                raise
            print(f"posenc plot: skipped {kind}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{res.path}  {res.title}")
    return 1 if failed else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plot", help="draw the figures that explain each scheme (PNG)",
        description="Kinds (or all):\n" + "\n".join(f"  {k}: {f.summary}" for k, f in FIGURES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", metavar="KIND", help="plot kind, or 'all' (see the list above)")
    p.add_argument("--out", type=output_dir, required=True, help="directory for the PNG files (created if missing)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a parameter of the plot function, e.g. --set train_len=8192 --set bases=1e4,1e6 (repeatable)",
    )
    p.set_defaults(func=_cmd_plot)
