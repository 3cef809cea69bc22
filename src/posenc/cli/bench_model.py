"""``posenc bench --model MODEL``: the bench's flags applied to a checkpoint evaluated as it is
(the parser is :mod:`posenc.cli.bench`'s; the work is :mod:`posenc.hf.bench_model`'s)."""

from __future__ import annotations

import argparse

#: where ``bench --model`` evaluates without ``--device``: the CPU, where its cost estimate, its
#: figures in docs/real_models.md and their resumes were made (``--device cuda`` for a GPU)
MODEL_DEVICE = "cpu"


def run_from_args(args: argparse.Namespace) -> int:
    """``posenc bench --model MODEL ...`` (called by :mod:`posenc.cli.bench`)."""
    from ..hf.bench_model import run_model_bench
    from ..hf.bench_settings import EVAL_FIELDS, model_settings
    from ..hf.bench_table import format_model_table

    # the bench's size flags arrive as set_<field>; the evaluation ones apply here, the rest
    # (model size, training) do not: refused, so a flag is never silently ignored
    given = {k.removeprefix("set_"): v for k, v in vars(args).items() if k.startswith("set_") and v is not None}
    unused = [f"--{name}" for name in ("encodings", "seeds") if getattr(args, name, None) is not None]
    unused += [f"--{name.replace('_', '-')}" for name in given if name not in EVAL_FIELDS]
    if unused:
        raise ValueError(f"{', '.join(unused)} do(es) not apply with --model (a checkpoint is evaluated, not trained); "
                         f"evaluation settings that do: {', '.join('--' + f.replace('_', '-') for f in EVAL_FIELDS)}")
    s, _ = model_settings(args.preset, args.model, tasks=args.tasks,
                          data=None if args.data is None else str(args.data), bf16=args.bf16,
                          corpus=args.corpus or "code", raised_base=args.raised_base,
                          overrides={k: tuple(v) if isinstance(v, list) else v for k, v in given.items()},
                          trained_length=getattr(args, "trained_length", None),
                          install=not getattr(args, "no_install", False))
    results = run_model_bench(s, args.out, resume=args.resume, overwrite=args.overwrite,
                              progress=not args.no_progress, device=args.device or MODEL_DEVICE)
    print(format_model_table(results))
    print(f"wrote {args.out}/results.json, results.csv and plots/")
    return 0
