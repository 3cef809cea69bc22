"""Parity of posenc.rotary.from_hf with transformers, per model family and rope scaling.

    PYTHONPATH=src python benchmarks/hf_parity.py --out benchmarks/results/hf_parity.json

For every case of tests/test_rotary_hf_families.py (the same configs, built with each
family's transformers config class, and the same transformers-side rotation: the family's
rotary module and its own ``apply_rotary_pos_emb``), read in three forms (the Hub-style
keyword arguments, ``to_dict()``, the JSON string), this measures the largest

* relative difference of inv_freq (transformers rounds it to float32; posenc keeps float64);
* absolute difference of the attention factor;
* absolute difference of rotated q and k (entries ~ N(0, 1)) at positions 0..63 and at
  positions up to 40 000, where transformers' float32 angles pos * inv_freq are off by up to
  about pos * 2^-24 rad (40 000 * 2^-24 = 2.4e-3).

It prints a Markdown table (the one in docs/rotary.md) and writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def load_cases():
    """The test module that holds the family cases and transformers' side of each."""
    path = HERE.parent / "tests" / "test_rotary_hf_families.py"
    spec = importlib.util.spec_from_file_location("hf_families", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(fam, name: str) -> dict:
    from posenc.rotary import from_hf

    model_type, _, kwargs, layer_type = fam.CASES[name]
    gen = torch.Generator().manual_seed(0)
    row = {"case": name, "model_type": model_type}
    inv_err = af_err = 0.0
    qk_err = {"short": 0.0, "long": 0.0}
    for form in fam.FORMS:
        rope = from_hf(fam.config_form(name, form), layer_type=layer_type)
        row.update(rotary_dim=rope.rotary_dim, head_dim=rope.dims.head_dim, base=rope.config.base,
                   layout=rope.config.layout, rope_type=rope.config.scaling)
        D, r = rope.dims.head_dim, rope.rotary_dim
        for label, pos in (("short", fam.SHORT), ("long", fam.LONG)):
            T = pos.shape[1]
            q, k = torch.randn(1, 4, T, D, generator=gen), torch.randn(1, 2, T, D, generator=gen)
            inv, scaling, _, _, hq, hk = fam.hf_rotate(name, q, k, pos)
            seq_len = int(pos.max()) + 1
            ours, af = rope.frequencies(seq_len if rope._scaling_cfg.length_dependent else None)
            inv_err = max(inv_err, float(((ours - inv.double()) / inv.double()).abs().max()))
            af_err = max(af_err, abs(af - float(scaling)))
            rq, rk = rope.rotate(q, k, pos, pos)
            err = max(float((rq[..., :r] - hq).abs().max()), float((rk[..., :r] - hk).abs().max()))
            qk_err[label] = max(qk_err[label], err)
    row.update(inv_freq_max_rel=inv_err, attention_factor_max_abs=af_err,
               qk_max_abs_pos_lt_64=qk_err["short"], qk_max_abs_pos_le_40000=qk_err["long"])
    return row


def table(rows: list[dict]) -> str:
    head = ("| case | model_type | r / head_dim | base | layout | rope type | inv_freq rel. | attn. factor "
            "| q/k, pos < 64 | q/k, pos <= 40 000 |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['model_type']} | {r['rotary_dim']} / {r['head_dim']} | {r['base']:g} | {r['layout']} "
            f"| {r['rope_type']} | {r['inv_freq_max_rel']:.1e} | {r['attention_factor_max_abs']:.0e} "
            f"| {r['qk_max_abs_pos_lt_64']:.1e} | {r['qk_max_abs_pos_le_40000']:.1e} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--case", action="append", help="only this case (repeatable; default: all)")
    args = parser.parse_args(argv)
    fam = load_cases()
    names = args.case or list(fam.CASES)
    unknown = [n for n in names if n not in fam.CASES]
    if unknown:
        parser.error(f"--case must be one of {', '.join(fam.CASES)}; got {', '.join(unknown)}")
    rows = [measure(fam, n) for n in names]
    print(table(rows))
    if args.out:
        import transformers

        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"command": "PYTHONPATH=src python benchmarks/hf_parity.py --out " + str(args.out),
                "torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version(), "forms": fam.FORMS,
                "positions_short": fam.SHORT[0].tolist(), "positions_long": fam.LONG[0].tolist()}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
