"""``posenc extend MODEL --to N``: the command over :func:`posenc.hf.extend.extend` (whose
docstring is the command's description)."""

from __future__ import annotations

import argparse
import os

from .args import MAX_THREADS, STDOUT, add_json_option, device, emit_json, int_in, output_dir, positive_float, unit_float


def cpu_or_cuda(value: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` present on this machine (:func:`posenc.cli.args.device`,
    without ``mps``: the real-model commands run on CPU or CUDA)."""
    if value.split(":")[0] not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {value!r}")
    return device(value)


def _name_in(names):
    """A type accepting ``none`` or one of ``names()`` (read when parsing: registered ones count)."""

    def parse(value: str) -> str:
        valid = list(names())
        if value != "none" and value not in valid:
            raise argparse.ArgumentTypeError(f"must be none or one of {', '.join(valid)}, got {value!r}")
        return value

    return parse


def _targets(value: str) -> tuple[str, ...]:
    """``--export``: a comma list of :data:`posenc.hf.export.TARGETS`."""
    from ..hf.export import parse_targets

    try:
        return parse_targets(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--export ")) from None


def _cmd(args: argparse.Namespace) -> int:
    import torch

    from ..hf.extend import ExtendSettings, extend
    from ..hf.extend_grid import from_flag

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    settings = ExtendSettings(to=args.to, trained_length=args.trained_length, factors=tuple(args.factors),
                              windows=args.windows, passkey_examples=args.passkey_examples,
                              data=None if args.data is None else str(args.data),
                              scalings=from_flag("--scalings", args.scalings), methods=from_flag("--methods", args.methods),
                              method_grid=args.method_grid,
                              depths=tuple(dict.fromkeys(args.depths)), device=args.device, dtype=args.dtype)
    evidence = extend(args.model, settings, args.out, install=not args.no_install, progress=not args.no_progress,
                      table=args.json != STDOUT, export=args.export, gguf=args.gguf)
    # Under torchrun every rank holds the evidence; rank 0 writes it (extend has left the group
    # by now, so the rank is torchrun's RANK).
    if int(os.environ.get("RANK", "0")) == 0:
        emit_json(args.json, evidence)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ..hf import extend as library
    from ..hf.checkpoint import DTYPES
    from ..hf.extend_grid import METHOD_GRIDS, method_names, scaling_names

    p = subparsers.add_parser(
        "extend", help="measure training-free RoPE scalings of a checkpoint at length N and write the best as its config",
        description=library.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="a save_pretrained folder, a .gguf file, or smollm2-135m / gemma3-270m")
    p.add_argument("--to", type=int_in(2, library.MAX_TO), required=True, metavar="N",
                   help=f"the target length in tokens (> L, at most {library.MAX_TO})")
    p.add_argument("--out", type=output_dir, default=None, metavar="DIR",
                   help="write the winner here as a transformers checkpoint (default: only print the table)")
    p.add_argument("--export", type=_targets, default=("hf",), metavar="TARGETS",
                   help="what --out gets, a comma list of hf (the transformers checkpoint), vllm (vllm.json, vllm.sh: "
                        "the serve line) and llama.cpp (llama.cpp.sh: the flags; with --gguf a GGUF); default hf")
    p.add_argument("--gguf", default=None, metavar="PATH",
                   help="a GGUF of the same checkpoint: --export llama.cpp writes a copy with the winner's rope metadata")
    p.add_argument("--trained-length", type=int_in(2, library.MAX_TO), default=None, metavar="L",
                   help="a shorter L than the checkpoint's own, for a quick run (a demonstration, not a measurement: "
                        "the table and --json only, not --out)")
    p.add_argument("--factors", type=positive_float, nargs="+", default=[1.0, 2.0], metavar="M",
                   help="factor multipliers: each scaling at M * N / L (default 1 2)")
    p.add_argument("--scalings", type=_name_in(scaling_names), nargs="+", default=None, metavar="NAME",
                   help=f"the RoPE scalings in the grid (default: all: {', '.join(scaling_names())}; none: no scaling)")
    p.add_argument("--methods", type=_name_in(method_names), nargs="+", default=None, metavar="NAME",
                   help=f"the attention methods in the grid, each at its paper's recommended settings (default: all "
                        f"the model type supports: {', '.join(method_names())}; none: no method)")
    p.add_argument("--method-grid", choices=METHOD_GRIDS, default="recommended",
                   help="recommended: each method at its paper's parameters (default); small: also at the few "
                        "neighbours its paper or code varies (a window halved or doubled, a larger group, leaky "
                        "ReRoPE: 3 or 4 rows a method)")
    p.add_argument("--depths", type=unit_float, nargs="+", default=list(library.DEPTHS), metavar="D",
                   help="passkey key depths in [0, 1] (0: start, 1: end; default 0 0.5 1)")
    p.add_argument("--device", type=cpu_or_cuda, default="cpu",
                   help="cpu, cuda or cuda:N: where the model runs (default cpu)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                   help="the model's dtype (default float32; bfloat16 and float16 halve the memory)")
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
