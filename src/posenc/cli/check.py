"""``posenc check``: run the checks on registered encodings and print the table.

The checks are :mod:`posenc.analysis.checks`, run by :mod:`posenc.analysis.runner`.

Examples::

    posenc check                      # every registered encoding
    posenc check sinusoidal learned   # some of them
    posenc check --json               # machine-readable
"""

from __future__ import annotations

import argparse
import sys

from ..analysis.checks import ERROR, LEGEND, format_claims, format_differ, format_table, results_to_json
from ..analysis.probes import Probe
from ..analysis.runner import run_checks
from ..files import finite_or_none
from .args import add_json_option, emit_json, int_at_least, positive_int

__all__ = ["add_parser"]


def _cmd_check(args: argparse.Namespace) -> int:
    if args.d_model % args.heads:  # each was checked by the parser; this is the pair
        raise ValueError(f"--d-model ({args.d_model}) must be divisible by --heads ({args.heads})")
    probe = Probe(d_model=args.d_model, num_heads=args.heads, train_len=args.train_len)
    results = run_checks(args.names, probe)
    # strict JSON: a non-finite measurement is null
    if not emit_json(args.json, finite_or_none(results_to_json(results))):
        print(format_table(results))
        print()
        print(LEGEND if args.legend else "(posenc check --legend explains the columns and symbols)")
        differ = [(n, k, r) for n, rs in results.items() for k, r in rs.items() if r.verdict == "differs"]
        print(f"{sum(r.verdict == 'agrees' for rs in results.values() for r in rs.values())} cells agree with "
              f"the literature, {len(differ)} differ" + (":" if differ else "."))
        for text in format_differ(results):
            print(text)
        print()
        print(format_claims())
    errors = [f"{n}.{k}: {r.detail}" for n, rs in results.items() for k, r in rs.items() if r.status == ERROR]
    for e in errors:
        print(f"posenc check: probe error in {e}", file=sys.stderr)
    return 1 if errors else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check", help="measure each encoding's claimed properties by running it")
    p.add_argument("names", nargs="*", metavar="NAME", help="encodings to check (default: all registered)")
    add_json_option(p, "every cell (status, value, detail, data, expected, source, verdict)")
    p.add_argument("--d-model", type=int_at_least(2), default=64, help="probe model width C (default 64)")
    p.add_argument("--heads", type=positive_int, default=4, help="probe heads H, dividing --d-model (default 4)")
    p.add_argument("--train-len", type=int_at_least(8), default=128, help="training length L the curves are judged against (default 128)")
    p.add_argument("--legend", action="store_true", help="print what each column and symbol of the table means")
    p.set_defaults(func=_cmd_check)
