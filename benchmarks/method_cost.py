"""What a training-free attention method costs on SmolLM2-135M: one forward's time and peak memory
by length, for the model as it is and under each method of ``posenc.methods.METHODS`` at its
recommended settings for the length (``recommended(L, N)``, L = 8192), side by side.

    .venv/bin/python benchmarks/method_cost.py --out benchmarks/results/method_cost_cpu.json
    .venv/bin/python benchmarks/method_cost.py --lengths 2048 4096 --out /tmp/cost.json   # a quick look

Each (length, row) runs in a fresh process: the model is loaded, a 16-token forward warms it up,
then one forward over ``length`` tokens of real text (``HFCausalLM.token_losses``: the decoder,
then the LM head in chunks) is timed, and the peak resident set is read before and after it
(``ru_maxrss``; the growth is the forward's own memory). The rows of a length run in the order
plain, each method, plain again, so the two plain forwards bracket the methods and show the
drift of the machine. The ratio is a method's time over the mean of the two plain ones.
Each result is appended to ``--out`` as it is made, so an interrupted run resumes (``--resume``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

NAME = "smollm2-135m"
L = 8192


def _one(length: int, method: str, threads: int) -> dict:
    """The measurement of one (length, row), in this process."""
    import torch

    from posenc.hf.checkpoint import load_model, load_tokenizer, open_checkpoint
    from posenc.hf.evaluation import HFCausalLM, token_stream
    from posenc.hf.models import resolve_model
    from posenc.hf.patch import patch_model
    from posenc.methods import METHODS

    torch.set_num_threads(threads)
    ckpt = open_checkpoint(resolve_model(NAME))
    model = load_model(ckpt, torch.float32, progress=False).eval()
    ids = token_stream(load_tokenizer(ckpt), None, length + 1)[None, :length]  # (1, length)
    params = {}
    if method != "none":
        params = METHODS[method].recommended(L, length)
        patch_model(model, method=method, **params)
    lm = HFCausalLM(model)
    with torch.inference_mode():
        lm.token_losses(ids[:, :16])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        losses = lm.token_losses(ids)
        seconds = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(length=length, method=method, params=params, seconds=round(seconds, 2),
                peak_mib=round(after / 1024, 1), growth_mib=round((after - before) / 1024, 1),
                ppl=round(float(losses.double().mean().exp()), 4))


def main() -> int:
    from posenc.methods import METHODS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--resume", action="store_true", help="keep the rows already in --out")
    p.add_argument("--one", nargs=2, metavar=("LENGTH", "METHOD"), help=argparse.SUPPRESS)  # the child process
    args = p.parse_args()
    if args.one:
        print(json.dumps(_one(int(args.one[0]), args.one[1], args.threads)))
        return 0
    import torch

    done = json.loads(args.out.read_text())["rows"] if args.resume and args.out.exists() else []
    from posenc.speed.timing import describe_machine

    data = dict(command="python " + " ".join(sys.argv), trained_length=L, model=NAME,
                machine=f"{describe_machine()}, {args.threads} thread{'s' if args.threads > 1 else ''}",
                load_before=os.getloadavg(), rows=done)
    t_start = time.perf_counter()
    for n in args.lengths:
        order = ["none", *args.methods, "none"]
        for i, method in enumerate(order):
            key = (n, method, i == len(order) - 1)
            if any((r["length"], r["method"], r.get("second", False)) == key for r in done):
                continue
            out = subprocess.run([sys.executable, __file__, "--one", str(n), method, "--threads", str(args.threads),
                                  "--out", str(args.out)], capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1]) | dict(second=key[2])
            done.append(row)
            print(f"{n:>6} {method:<12} {row['seconds']:>8.1f} s  peak {row['peak_mib']:>7.0f} MiB  "
                  f"growth {row['growth_mib']:>7.0f} MiB  ppl {row['ppl']}", file=sys.stderr, flush=True)
            data |= dict(rows=done, load_after=os.getloadavg(), wall_s=round(time.perf_counter() - t_start))
            args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
