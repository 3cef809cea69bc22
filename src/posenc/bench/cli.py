"""``posenc bench``: train small Transformers per encoding and test them beyond the training length.

Examples::

    posenc bench --preset quick --out runs/quick             # < 10 min on a laptop CPU
    posenc bench --preset full --seeds 3 --out runs/full     # the paper-sized sweep
    posenc bench --encodings none rope alibi --tasks copy lm --out runs/x
    posenc bench --encodings rope rope:base=500000 t5:num_buckets=64 --tasks reverse --out runs/v
    posenc bench --preset micro --d-model 32 --layers 2 --synthetic-length 10 --tasks sort --out runs/s
    posenc --import mytasks bench --tasks mytask --encodings myenc alibi --out runs/mine
    posenc bench --preset quick --out runs/quick --resume    # continue an interrupted run
    posenc bench --model ./ckpt --out runs/ckpt              # a local HF checkpoint beyond its length
    torchrun --nproc_per_node 2 -m posenc bench --preset quick --out runs/ddp
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any

from .._optional import require
from ..cli_args import (
    device, existing_dir, existing_path, int_at_least, nonnegative_int, output_dir, positive_float, positive_int,
    unit_float,
)
from ..variants import SPEC_HELP
from .tasks import PASSKEY_DIGITS, task_names


def _scaling(value: str) -> str:
    """A training-free RoPE scaling the bench evaluates (``posenc.bench.evaluate.SCALINGS``)."""
    from .evaluate import SCALINGS

    if value not in SCALINGS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(SCALINGS)}, got {value!r}")
    return value


# BenchSettings field -> (flags, argparse type, nargs, help). Every other field of BenchSettings
# gets a generic --field-name flag typed from its annotation (_generic_flags), so every setting
# can be given on the command line; the ranges are checked by these types at parse time and by
# BenchSettings itself.
SIZE_FLAGS: dict[str, tuple[tuple[str, ...], Any, str | None, str]] = {
    "d_model": (("--d-model",), positive_int, None, "model width"),
    "n_layer": (("--layers", "--n-layer"), positive_int, None, "Transformer layers"),
    "n_head": (("--heads", "--n-head"), positive_int, None, "attention heads (must divide --d-model)"),
    "steps": (("--steps",), positive_int, None, "training steps"),
    "batch_size": (("--batch-size",), positive_int, None, "global batch of the task runs (examples per step)"),
    "lr": (("--lr",), positive_float, None, "peak learning rate"),
    "warmup_steps": (("--warmup-steps",), nonnegative_int, None, "linear warmup steps"),
    "synthetic_length": (("--synthetic-length",), positive_int, None,
                         "L of the synthetic (and registered) tasks: train on sizes 1..L, test 1..2L"),
    "eval_examples": (("--eval-examples",), positive_int, None, "examples per length in a synthetic task's test"),
    "passkey_length": (("--passkey-length",), int_at_least(PASSKEY_DIGITS + 1), None,
                       f"L of passkey: train on contexts of {PASSKEY_DIGITS + 1}..L tokens"),
    "passkey_eval_factors": (("--passkey-eval-factors",), positive_float, "+", "passkey test lengths, as multiples of L"),
    "passkey_depths": (("--passkey-depths",), unit_float, "+", "passkey key depths in [0, 1] (0: start, 1: end)"),
    "passkey_examples": (("--passkey-examples",), positive_int, None, "passkey examples per (length, depth)"),
    "lm_length": (("--lm-length",), int_at_least(2), None, "L of lm: training windows of L bytes"),
    "lm_batch_size": (("--lm-batch-size",), positive_int, None, "lm windows per step"),
    "lm_eval_factors": (("--lm-eval-factors",), positive_int, "+", "lm test lengths, as multiples of L"),
    "lm_train_bytes": (("--lm-train-bytes",), positive_int, None, "bytes of the corpus read for lm training"),
    "lm_eval_tokens": (("--lm-eval-tokens",), positive_int, None, "bytes scored at every lm test length"),
    "scalings": (("--scalings",), _scaling, "*",
                 "training-free RoPE scalings evaluated beyond L (none given: no scaled rows)"),
    "eval_seed": (("--eval-seed",), nonnegative_int, None, "seed of the test problems (the same for every run)"),
}
# Fields with their own flags (--encodings, --tasks, --seeds, --data, --bf16) or none.
_OWN_FLAGS = ("encodings", "tasks", "seeds", "data", "bf16")


def _cmd(args: argparse.Namespace) -> int:
    import torch

    from .report import format_table
    from .runner import run_bench
    from .settings import settings_for

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for module in ("safetensors", "matplotlib"):  # checkpoints and plots/: before any training
        require(module, extra="bench")
    if args.model is not None:  # a Hugging Face checkpoint, evaluated without training
        from ..hf.bench_model import run_from_args

        return run_from_args(args)
    settings = settings_for(
        args.preset, encodings=args.encodings, tasks=args.tasks, seeds=args.seeds,
        data=None if args.data is None else str(args.data), bf16=args.bf16 or None,
        **_overrides(args),
    )
    check_models(settings)
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
    from .settings import PRESETS

    p = subparsers.add_parser(
        "bench", help="train small models per encoding; evaluate beyond the training length",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="quick", choices=list(PRESETS),
                   help="sizes and lists: micro (seconds), quick (minutes on a CPU), full (hours)")
    p.add_argument("--encodings", nargs="+", metavar="SPEC",
                   help=f"encodings to compare (default: the preset's); each {SPEC_HELP}")
    p.add_argument("--tasks", nargs="+", metavar="TASK",
                   help=f"tasks (default: the preset's); any of {', '.join(task_names())} (more with posenc --import)")
    p.add_argument("--seeds", type=positive_int, help="number of seeds per (task, encoding) (default: the preset's)")
    p.add_argument("--data", type=existing_path, metavar="PATH", help="text file or folder for the lm task (default: the Python stdlib sources)")
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
    sizes = p.add_argument_group("sizes and lengths (default: the preset's)")
    for field, (flags, type_, nargs, help_) in SIZE_FLAGS.items():
        sizes.add_argument(*flags, dest=f"set_{field}", type=type_, nargs=nargs, metavar=_metavar(type_),
                           help=help_)
    _generic_flags(sizes, p)
    p.set_defaults(func=_cmd)


def _metavar(type_: Any) -> str:
    """N for the int parsers of cli_args (positive_int, int_at_least_6, ...), X otherwise."""
    return "N" if "int" in type_.__name__ else "X"


def _generic_flags(group: argparse._ArgumentGroup, parser: argparse.ArgumentParser) -> None:
    """A ``--field-name`` flag for every BenchSettings field without one in SIZE_FLAGS, typed
    from its annotation (a setting added to BenchSettings is settable at once)."""
    from ..variants import parse_typed
    from .settings import BenchSettings

    hints = typing.get_type_hints(BenchSettings)
    for f in dataclasses.fields(BenchSettings):
        flag = "--" + f.name.replace("_", "-")
        # a flag another part of posenc added by hand (argparse keeps them in this mapping) wins
        if f.name in SIZE_FLAGS or f.name in _OWN_FLAGS or flag in parser._option_string_actions:
            continue
        tp = hints[f.name]
        is_tuple = typing.get_origin(tp) is tuple
        item = typing.get_args(tp)[0] if is_tuple else tp

        def parse(text: str, key: str = f.name, item: Any = item) -> Any:
            try:
                return parse_typed(key, text, item)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        parse.__name__ = getattr(item, "__name__", "value")
        group.add_argument(flag, dest=f"set_{f.name}", type=parse, nargs="*" if is_tuple else None, metavar="X",
                           help=f"BenchSettings.{f.name} (default: the preset's)")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The BenchSettings fields given on the command line (lists as tuples)."""
    out = {}
    for key, value in vars(args).items():
        if key.startswith("set_") and value is not None:
            out[key[4:]] = tuple(value) if isinstance(value, list) else value
    return out


def check_models(settings: Any) -> None:
    """Build every encoding's model once, before any training, so that a setting no model
    accepts (--heads not dividing --d-model, rope:rotary_dim above the head size, a position
    table longer than its limit) is an error now rather than after hours of other runs."""
    from .build import build_model

    if settings.d_model % settings.n_head:
        raise ValueError(f"--d-model ({settings.d_model}) must be divisible by --heads ({settings.n_head})")
    # the task whose evaluation reaches furthest sizes the position tables
    task = max(settings.tasks, key=settings.max_positions)
    for encoding in settings.encodings:
        try:
            build_model(settings, encoding, task, 0)
        except (TypeError, ValueError) as e:
            raise ValueError(f"encoding {encoding!r} cannot be built with these settings: {e}") from None
