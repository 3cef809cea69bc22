"""Precision of posenc's RoPE rotation relative to the input's magnitude, measured.

    PYTHONPATH=src python benchmarks/rotary_precision.py --out benchmarks/results/rotary_precision.json

For each dtype (float32, bfloat16, float16) and layout, q ~ N(0, s^2) with s in {1e-3, 1, 1e3}
(float16: {1e-2, 1, 1e2}, to stay in its range) is rotated at positions up to 2^20 by
``posenc.build("rope").rotate`` and compared with a float64 rotation written from the formula
(angles m * base^(-2j/r) in float64). Two errors per rotated pair (a, b) -> (a', b'):

* ``err / |(a, b)|``: the error relative to the input pair's magnitude (the rotation keeps
  it), in units of the dtype's unit roundoff u = 2^-(mantissa bits + 1);
* ``err / ulp(out)``: in units of the output entry's own ulp, which is unbounded for entries
  that cancel to near zero (a cos - b sin ~ 0), the reason a per-entry ulp claim overstates.

Prints one row per (dtype, layout) with the maxima over all entries and scales.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

import posenc

POSITIONS = [0, 1, 7, 4097, 65535, 500_000, 1_000_003, (1 << 20) - 1, 1 << 20]
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
SCALES = {torch.float32: (1e-3, 1.0, 1e3), torch.bfloat16: (1e-3, 1.0, 1e3), torch.float16: (1e-2, 1.0, 1e2)}


MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` numbers at |x| (float64)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(torch.finfo(dtype).tiny)))
    return 2.0 ** (e - MANTISSA_BITS[dtype])


def measure(dtype: torch.dtype, layout: str, D: int = 64, H: int = 4) -> dict:
    gen = torch.Generator().manual_seed(0)
    rope = posenc.build("rope", d_model=H * D, num_heads=H, layout=layout, kernel="eager")
    pos = torch.tensor([POSITIONS])
    r = D
    theta = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = pos.double()[..., None] * theta  # (1, T, r/2) float64
    c, s = ang.cos()[:, None], ang.sin()[:, None]
    i1 = torch.arange(r // 2) if layout == "half" else torch.arange(0, r, 2)
    i2 = i1 + r // 2 if layout == "half" else i1 + 1
    worst_mag = worst_ulp = 0.0
    for scale in SCALES[dtype]:
        q = (scale * torch.randn(1, H, len(POSITIONS), D, generator=gen, dtype=torch.float64)).to(dtype)
        rq, _ = rope.rotate(q, q, pos, pos)
        qd = q.double()
        a, b = qd[..., i1], qd[..., i2]
        ref1, ref2 = a * c - b * s, b * c + a * s
        err1, err2 = (rq[..., i1].double() - ref1).abs(), (rq[..., i2].double() - ref2).abs()
        mag = torch.sqrt(a * a + b * b).clamp_min(torch.finfo(dtype).tiny)
        u = UNIT_ROUNDOFF[dtype]
        worst_mag = max(worst_mag, float((torch.maximum(err1, err2) / mag).max()) / u)
        worst_ulp = max(worst_ulp, float((err1 / ulp(ref1, dtype)).max()), float((err2 / ulp(ref2, dtype)).max()))
    return {"dtype": str(dtype).replace("torch.", ""), "layout": layout, "err_over_pair_norm_in_u": worst_mag,
            "err_in_output_ulps": worst_ulp}


def table(rows: list[dict]) -> str:
    """The Markdown table of docs/rotary.md's precision section."""
    lines = ["| dtype | layout | max err / \\|(a, b)\\|, in u | max err in ulps of the output entry |",
             "|---|---|---|---|"]
    for m in rows:
        lines.append(f"| {m['dtype']} | {m['layout']} | {m['err_over_pair_norm_in_u']:.2f} "
                     f"| {m['err_in_output_ulps']:.5g} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = [measure(dtype, layout) for dtype in (torch.float32, torch.bfloat16, torch.float16)
            for layout in ("half", "interleaved")]
    print(table(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"command": f"PYTHONPATH=src python benchmarks/rotary_precision.py --out {args.out}",
                "torch": torch.__version__, "python": platform.python_version(), "positions": POSITIONS,
                "scales": {str(k).replace("torch.", ""): v for k, v in SCALES.items()}}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
