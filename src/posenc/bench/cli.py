"""``posenc bench``: train small Transformers per encoding and test them beyond the training length.

Examples::

    posenc bench --preset quick --out runs/quick             # < 10 min on a laptop CPU
    posenc bench --preset full --seeds 3 --out runs/full     # the paper-sized sweep
    posenc bench --encodings none rope alibi --tasks copy lm --out runs/x
    posenc bench --preset quick --out runs/quick --resume    # continue an interrupted run
    posenc bench --model ./ckpt --out runs/ckpt              # a local HF checkpoint beyond its length
    torchrun --nproc_per_node 2 -m posenc bench --preset quick --out runs/ddp
"""

from __future__ import annotations

import argparse
import sys

from ..cli_args import device, existing_dir, existing_path, output_dir, positive_int
from .tasks import TASK_NAMES


def _cmd(args: argparse.Namespace) -> int:
    import torch

    from .report import format_table
    from .runner import run_bench, settings_for

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.model is not None:  # a Hugging Face checkpoint, evaluated without training
        from ..hf.bench_model import run_from_args

        return run_from_args(args)
    settings = settings_for(
        args.preset, encodings=args.encodings, tasks=args.tasks, seeds=args.seeds,
        data=None if args.data is None else str(args.data), steps=args.steps, bf16=args.bf16 or None,
    )
    if args.data is not None and "lm" not in settings.tasks:
        print("posenc bench: --data is only used by the 'lm' task, which is not selected", file=sys.stderr)
    if "lm" in settings.tasks and args.data is not None:
        from .data import load_corpus

        load_corpus(args.data, max_bytes=1)  # fail on a missing or empty path before any training
    # Ctrl-C: train() saves its checkpoint and raises Interrupted (a KeyboardInterrupt) saying
    # how to go on; posenc.cli.main prints it as one line and exits 130.
    results = run_bench(settings, args.out, resume=args.resume, overwrite=args.overwrite,
                        progress=not args.no_progress, device=args.device)
    if results is not None:
        print(format_table(results))
        print(f"wrote {args.out}/results.json, results.csv and plots/")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from .runner import PRESETS

    p = subparsers.add_parser(
        "bench", help="train small models per encoding; evaluate beyond the training length",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="quick", choices=list(PRESETS),
                   help="sizes and lists: micro (seconds), quick (minutes on a CPU), full (hours)")
    p.add_argument("--encodings", nargs="+", metavar="NAME", help="encodings to compare (default: the preset's)")
    p.add_argument("--tasks", nargs="+", metavar="TASK", help=f"tasks (default: the preset's); any of {', '.join(TASK_NAMES)}")
    p.add_argument("--seeds", type=positive_int, help="number of seeds per (task, encoding) (default: the preset's)")
    p.add_argument("--data", type=existing_path, metavar="PATH", help="text file or folder for the lm task (default: the Python stdlib sources)")
    p.add_argument("--steps", type=positive_int, help="override the preset's number of training steps")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast in training (with --model: load the checkpoint in bfloat16)")
    p.add_argument("--device", type=device, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--threads", type=positive_int, metavar="N",
                   help="CPU threads for torch (default: torch's); 1 is fastest for these tiny models on a busy machine")
    p.add_argument("--model", type=existing_dir, metavar="MODEL_DIR",
                   help="evaluate this local Hugging Face checkpoint (passkey, lm) past its trained length, with every RoPE scaling; see docs/hf.md")
    p.add_argument("--out", type=output_dir, required=True, metavar="DIR", help="output directory (locked while a run writes it)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true", help="continue the earlier run in --out")
    g.add_argument("--overwrite", action="store_true", help="delete the earlier run in --out and start over")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd)
