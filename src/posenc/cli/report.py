"""``posenc report --out DIR``: one self-contained HTML page of checks, figures and benchmarks.

The page is :func:`posenc.analysis.report.build_report`'s: a real model first (``--probe``,
``--model-bench``, ``--model``), then the benchmark (``--bench``), the property table of
``posenc check`` and the figures that concern what the page is about.

Examples::

    posenc report --out report
    posenc report --out report --bench bench_out
    posenc report --out report --probe out/probe_smollm2 --model-bench out/bench_smollm2
    posenc report --out report --encodings none sinusoidal rope --plots rope-score alibi
"""

from __future__ import annotations

import argparse

from ..analysis.figures import FIGURES
from ..analysis.probes import Probe
from ..analysis.report import build_report
from .args import existing_dir, int_at_least, output_dir

__all__ = ["add_parser"]


def _cmd_report(args: argparse.Namespace) -> int:
    for k in args.plots or []:  # before anything is written
        if k not in FIGURES:
            raise ValueError(f"--plots: unknown plot kind {k!r}; valid kinds: {', '.join(FIGURES)}")
    probe = Probe(train_len=args.train_len)
    path = build_report(args.out, args.encodings, args.plots, args.bench, probe, model=args.model,
                        probes=args.probe, model_bench=args.model_bench)
    print(f"wrote {path}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="write one self-contained HTML page: real model, benchmark, checks, figures")
    p.add_argument("--out", type=output_dir, required=True, help="directory for report.html (and figures/)")
    p.add_argument("--probe", type=existing_dir, nargs="+", default=None, metavar="PROBE_DIR",
                   help="output folder(s) of `posenc probe` to show first (probe.json and its figures)")
    p.add_argument("--model-bench", type=existing_dir, default=None, metavar="MODEL_BENCH_DIR",
                   help="output folder of `posenc bench --model` to show first (the checkpoint beyond its length)")
    p.add_argument("--bench", type=existing_dir, default=None, help="output directory of `posenc bench` to embed (results.json, PNGs)")
    p.add_argument("--model", type=existing_dir, default=None, metavar="MODEL_DIR",
                   help="a local Hugging Face checkpoint to probe first (posenc probe: layer 0, q·k against distance)")
    p.add_argument("--encodings", nargs="+", default=None, metavar="NAME", help="encodings to check (default: all)")
    p.add_argument("--plots", nargs="+", default=None, metavar="KIND",
                   help="plot kinds to include (default: those about the encodings and the model on the page)")
    p.add_argument("--train-len", type=int_at_least(8), default=128, help="training length L of the checks (default 128)")
    p.set_defaults(func=_cmd_report)
