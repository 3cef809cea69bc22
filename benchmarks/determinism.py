"""What a bench run's bits depend on: one quick-preset run in fresh processes, under changes.

    python benchmarks/determinism.py --out benchmarks/results/determinism.json

Trains the quick preset's copy / none / seed 0 run (500 steps, no evaluation) once per row
below, each in a fresh interpreter with its own environment and thread count, and records the
final training loss bit for bit (``float.hex``) and a sha256 of the final weights. The first row
is the reference; its loss is also compared with the committed table's run
(benchmarks/results/bench_quick.json). docs/bench.md "Determinism: what holds" renders it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK, ENCODING, SEED = "copy", "none", 0

# (what changes, extra environment, torch threads)
ROWS: tuple[tuple[str, dict[str, str], int], ...] = (
    ("nothing (the reference)", {}, 1),
    ("nothing: the same command again", {}, 1),
    ("PYTHONHASHSEED=4242 (the reference runs with 0)", {"PYTHONHASHSEED": "4242"}, 1),
    ("MKL_ENABLE_INSTRUCTIONS=AVX (MKL's own dispatch)", {"MKL_ENABLE_INSTRUCTIONS": "AVX"}, 1),
    ("kernels pinned to AVX2: ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 DNNL_MAX_CPU_ISA=AVX2",
     {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}, 1),
    ("2 torch threads instead of 1", {}, 2),
    ("ATEN_CPU_CAPABILITY=default (ATen's unvectorized kernels)", {"ATEN_CPU_CAPABILITY": "default"}, 1),
)

_RUN = """
import hashlib, json, sys, torch
from posenc.bench.build import build_batches, build_model, train_config
from posenc.bench.settings import settings_for
from posenc.bench.train import train
torch.set_num_threads({threads})
s = settings_for("quick", encodings=["{encoding}"], tasks=["{task}"], seeds=1, steps={steps})
model = build_model(s, "{encoding}", "{task}", {seed})
r = train(model, build_batches(s, "{task}", {seed}, None), train_config(s, {seed}), progress=False)
h = hashlib.sha256(b"".join(v.contiguous().numpy().tobytes() for v in model.state_dict().values())).hexdigest()
print(json.dumps(dict(loss=r.last_loss, capability=torch.backends.cpu.get_cpu_capability(), weights=h)))
"""


def run_row(env: dict[str, str], threads: int, steps: int) -> dict:
    full = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS=str(threads)) | env
    code = _RUN.format(threads=threads, task=TASK, encoding=ENCODING, seed=SEED, steps=steps)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the run failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the results file to write (JSON)")
    p.add_argument("--steps", type=int, default=500, help="training steps (default 500, the quick preset's)")
    args = p.parse_args(argv)
    import torch

    from posenc.speed.timing import describe_machine

    torch.set_num_threads(1)  # as the reference row, for describe_machine
    committed = json.loads((ROOT / "benchmarks" / "results" / "bench_quick.json").read_text())
    ref_loss = next(r["train_loss"] for r in committed["runs"]
                    if (r["task"], r["encoding"], r["seed"]) == (TASK, ENCODING, SEED))
    rows = []
    for what, env, threads in ROWS:
        got = run_row(env, threads, args.steps)
        rows.append(dict(change=what, env=env, threads=threads, loss=got["loss"], loss_hex=float(got["loss"]).hex(),
                         weights=got["weights"], capability=got["capability"]))
        print(f"{what}: {got['loss']!r}", file=sys.stderr)
    out = dict(run=dict(preset="quick", task=TASK, encoding=ENCODING, seed=SEED, steps=args.steps), committed_loss=ref_loss,
               rows=rows, machine=describe_machine(), python=sys.version.split()[0])
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
