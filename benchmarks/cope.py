"""CoPE's attention, forward + backward, by length: the fused path that counts block by block
(``posenc.backends.fused.fused_attention(..., counts=[e])``) against the dense term it
replaced (``CountTerm.dense`` passed to the same function as a bias, autograd keeping its
(T, T) gates, counts and interpolation) and against plain causal SDPA (NoPE), side by side.

    .venv/bin/python benchmarks/cope.py --out benchmarks/results/cope_cpu.json
    .venv/bin/python benchmarks/cope.py --lengths 1024 2048 --rounds 2 --out /tmp/cope.json   # a quick look

One attention call, B=1, H=8, D=64, float32, causal; e (16, 64) (x-transformers' max_pos).
Two gate regimes: ``half`` (q, k standard normal: scaled logits about N(0, 1), gates about one
half, as at initialisation: the counts reach 15 about 30 keys before a query) and ``shut``
(every logit shifted by -8: gates about 3e-4, so no count reaches 15 within 8192 keys and the
block counts every key, the fused path's worst case). Times are medians over ``--rounds``
rounds, each timing the three paths in turn; peak memory is torch's own allocations during one
forward + backward (``posenc.speed.timing.peak_memory``: the profiler's memory events). The
dense path is skipped where its (T, T) tensors would exceed ``--max-dense-gib`` (it keeps about
ten float32 (H, T, T) tensors): the length where it runs out of memory first is stated, not
crashed into. Each length is written to ``--out`` when done; ``--resume`` keeps those.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from posenc.backends.fused import fused_attention
from posenc.speed.timing import describe_machine, peak_memory
from posenc.terms import CountTerm

B, H, D, M = 1, 8, 64, 16
DENSE_TENSORS = 10  # (H, T, T) float32 tensors the dense term keeps for its backward, about
SHIFT = {"half": 0.0, "shut": -8.0}


def _inputs(T: int, gates: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    if SHIFT[gates]:  # a shared direction moves every scaled logit by SHIFT
        u = torch.zeros(D)
        u[0] = 1.0
        a = (abs(SHIFT[gates]) * D**0.5) ** 0.5
        q, k = q + a * u, k - a * u
    e = torch.randn(M, D, generator=g) * 0.1
    return tuple(t.requires_grad_() for t in (q, k, v, e))


def _step(path: str, q, k, v, e) -> None:
    scale = D**-0.5
    if path == "nope":
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif path == "blockwise":
        out = fused_attention(q, k, v, scale=scale, causal=True, counts=[e])
    else:  # the dense term as a bias: the path CoPE took before the count term
        out = fused_attention(q, k, v, scale=scale, causal=True, bias=CountTerm(q, k, e, scale).dense(None, None))
    out.sum().backward()
    for t in (q, k, v, e):
        t.grad = None


def _measure(T: int, gates: str, rounds: int, max_dense_gib: float) -> dict:
    ins = _inputs(T, gates)
    dense_gib = DENSE_TENSORS * B * H * T * T * 4 / 2**30
    paths = ["nope", "blockwise"] + (["dense"] if dense_gib <= max_dense_gib else [])
    times: dict[str, list[float]] = {p: [] for p in paths}
    for p in paths:  # warm-up
        _step(p, *ins)
    for _ in range(rounds):
        for p in paths:
            t0 = time.perf_counter()
            _step(p, *ins)
            times[p].append(time.perf_counter() - t0)
    row = dict(length=T, gates=gates)
    for p in paths:
        row[p] = dict(ms=round(1e3 * statistics.median(times[p]), 1),
                      peak_mib=round(peak_memory(lambda: _step(p, *ins)) / 2**20, 1))
    if "dense" not in paths:
        row["dense"] = dict(skipped=f"needs about {dense_gib:.0f} GiB for its (T, T) tensors (> --max-dense-gib {max_dense_gib:g})",
                            gib=round(dense_gib, 1))
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--gates", nargs="+", default=["half", "shut"], choices=list(SHIFT))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-dense-gib", type=float, default=8.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--resume", action="store_true", help="keep the rows already in --out")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    done = json.loads(args.out.read_text())["rows"] if args.resume and args.out.exists() else []
    data = dict(command="python " + " ".join(sys.argv), machine=describe_machine(),
                settings=dict(batch=B, heads=H, head_dim=D, max_pos=M, dtype="float32", causal=True, rounds=args.rounds),
                load_before=os.getloadavg(), rows=done)
    for gates in args.gates:
        for T in args.lengths:
            if any((r["length"], r["gates"]) == (T, gates) for r in done):
                continue
            row = _measure(T, gates, args.rounds, args.max_dense_gib)
            done.append(row)
            d = row["dense"]
            dense = f"dense {d['ms']:>8.1f} ms {d['peak_mib']:>8.1f} MiB" if "ms" in d else "dense skipped"
            print(f"{gates:<5} T={T:>5}  nope {row['nope']['ms']:>7.1f} ms {row['nope']['peak_mib']:>7.1f} MiB  "
                  f"blockwise {row['blockwise']['ms']:>8.1f} ms {row['blockwise']['peak_mib']:>7.1f} MiB  {dense}",
                  file=sys.stderr, flush=True)
            data |= dict(rows=done, load_after=os.getloadavg())
            args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
