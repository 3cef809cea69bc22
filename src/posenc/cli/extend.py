"""``posenc extend MODEL --to N``: the command over :func:`posenc.hf.extend.extend` (whose
docstring is the command's description)."""

from __future__ import annotations

import argparse

from .args import MAX_THREADS, STDOUT, add_json_option, emit_json, int_in, output_dir, positive_float


def _cmd(args: argparse.Namespace) -> int:
    import torch

    from ..hf.extend import ExtendSettings, extend

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    settings = ExtendSettings(to=args.to, trained_length=args.trained_length, factors=tuple(args.factors),
                              windows=args.windows, passkey_examples=args.passkey_examples,
                              data=None if args.data is None else str(args.data))
    evidence = extend(args.model, settings, args.out, install=not args.no_install, progress=not args.no_progress,
                      table=args.json != STDOUT)
    emit_json(args.json, evidence)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ..hf import extend as library

    p = subparsers.add_parser(
        "extend", help="measure training-free RoPE scalings of a checkpoint at length N and write the best as its config",
        description=library.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="a save_pretrained folder, a .gguf file, or smollm2-135m / gemma3-270m")
    p.add_argument("--to", type=int_in(2, library.MAX_TO), required=True, metavar="N",
                   help=f"the target length in tokens (> L, at most {library.MAX_TO})")
    p.add_argument("--out", type=output_dir, default=None, metavar="DIR",
                   help="write the winner here as a transformers checkpoint (default: only print the table)")
    p.add_argument("--trained-length", type=int_in(2, library.MAX_TO), default=None, metavar="L",
                   help="a shorter L than the checkpoint's own, for a quick run (a demonstration, not a measurement: "
                        "the table and --json only, not --out)")
    p.add_argument("--factors", type=positive_float, nargs="+", default=[1.0, 2.0], metavar="M",
                   help="factor multipliers: each scaling at M * N / L (default 1 2)")
    p.add_argument("--windows", type=int_in(1, library.MAX_COUNT), default=1, metavar="W",
                   help=f"perplexity windows of N tokens (default 1, at most {library.MAX_COUNT})")
    p.add_argument("--passkey-examples", type=int_in(1, library.MAX_COUNT), default=1, metavar="E",
                   help=f"passkey examples per depth (default 1, at most {library.MAX_COUNT})")
    p.add_argument("--data", default=None, metavar="PATH", help="corpus (default: the Python standard library's sources)")
    p.add_argument("--threads", type=int_in(1, MAX_THREADS), metavar="N", help="CPU threads for torch (default: torch's)")
    p.add_argument("--no-install", action="store_true", help="refuse to install a named model's package")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_json_option(p, "the evidence (extend.json's content: the settings, the rule, every candidate's numbers)")
    p.set_defaults(func=_cmd)
