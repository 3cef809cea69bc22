"""``posenc check``: run the checks on registered encodings and print the table.

The checks themselves are :mod:`posenc.analysis.checks`; the probe they run on is
:mod:`posenc.analysis.probes`; the literature's expectations are
:mod:`posenc.analysis.claims`.

Examples::

    posenc check                      # every registered encoding
    posenc check sinusoidal learned   # some of them
    posenc check --json               # machine-readable
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from ..cli.args import add_json_option, emit_json, int_at_least, positive_int
from ..encoding import PositionalEncoding
from .checks import CHECKS, ERROR, HAS, LACKS, LEGEND, NA, CheckResult, claims, format_table, results_to_json
from .claims import expected_for, verdict
from .probes import Probe, max_position

__all__ = ["add_parser", "build_probe_encoding", "check_encoding", "run_checks"]


@torch.no_grad()
def _perturb_zero_params(enc: PositionalEncoding, seed: int) -> None:
    # A learned table initialised to exactly zero (T5-style bias, some relative embeddings)
    # would make every probe answer "no position signal"; small random values show structure.
    g = torch.Generator().manual_seed(seed)
    for p in enc.parameters():
        if p.is_floating_point() and not bool(p.any()):
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))


def build_probe_encoding(name: str, probe: Probe) -> PositionalEncoding:
    """Build registered encoding ``name`` at the probe size, default config, eval mode."""
    from ..registry import build, get_info

    torch.manual_seed(probe.seed)
    # Eager kernels: the checks call each hook a few times on new shapes, where compiling a
    # fused kernel (RoPE's "auto" on large inputs) would take longer than the whole check.
    extra = {"kernel": "eager"} if "kernel" in {f.name for f in dataclasses.fields(get_info(name).config_cls)} else {}
    enc = build(name, d_model=probe.d_model, num_heads=probe.num_heads, **extra).eval()
    _perturb_zero_params(enc, probe.seed)
    return enc


@torch.no_grad()
def check_encoding(enc: PositionalEncoding, probe: Probe | None = None, only: list[str] | None = None) -> dict[str, CheckResult]:
    """Run every check (or those in ``only``) on an encoding instance; errors become ``error`` cells."""
    probe = Probe() if probe is None else probe
    out = {}
    try:
        probe = dataclasses.replace(probe, accepted=max_position(enc, dataclasses.replace(probe, accepted=None)))
    except Exception:  # noqa: BLE001 - each check then reports the failure itself
        probe = dataclasses.replace(probe, accepted=None)
    for key, (_, fn) in CHECKS.items():
        if only is not None and key not in only:
            continue
        try:
            out[key] = fn(enc, probe)
        except NotImplementedError as e:
            out[key] = CheckResult(NA, "", f"hook not implemented: {e}")
        except Exception as e:  # noqa: BLE001 - a failing probe is reported, not hidden
            out[key] = CheckResult(ERROR, type(e).__name__, str(e))
        expected, source = expected_for(enc.name, key)
        r = out[key]
        r.expected = {True: HAS, False: LACKS, None: ""}.get(expected, str(expected))
        r.source = source
        r.verdict = verdict(r.status, expected)
    return out


def run_checks(names: list[str] | None = None, probe: Probe | None = None) -> dict[str, dict[str, CheckResult]]:
    """``{encoding: {check: result}}`` for the given registered names (default: all)."""
    from ..registry import get_info, list_encodings

    probe = Probe() if probe is None else probe
    names = list_encodings() if not names else list(names)
    for n in names:
        get_info(n)  # an unknown name lists the valid ones
    return {n: check_encoding(build_probe_encoding(n, probe), probe) for n in names}


def _cmd_check(args: argparse.Namespace) -> int:
    if args.d_model % args.heads:  # each was checked by the parser; this is the pair
        raise ValueError(f"--d-model ({args.d_model}) must be divisible by --heads ({args.heads})")
    probe = Probe(d_model=args.d_model, num_heads=args.heads, train_len=args.train_len)
    results = run_checks(args.names, probe)
    from ..files import finite_or_none  # strict JSON: a non-finite measurement is null

    if not emit_json(args.json, finite_or_none(results_to_json(results))):
        print(format_table(results))
        print()
        print(LEGEND if args.legend else "(posenc check --legend explains the columns and symbols)")
        differ = [(n, k, r) for n, rs in results.items() for k, r in rs.items() if r.verdict == "differs"]
        print(f"{sum(r.verdict == 'agrees' for rs in results.values() for r in rs.values())} cells agree with "
              f"the literature, {len(differ)} differ" + (":" if differ else "."))
        for n, k, r in differ:
            print(f"  {n} / {CHECKS[k][0]}: measured {r.status} {r.value}, expected {r.expected} ({r.source})")
        print()
        for _, title, claim, papers, measured in claims():
            print(f"{title}: {claim}\n    {papers}\n    measured: {measured}")
    errors = [f"{n}.{k}: {r.detail}" for n, rs in results.items() for k, r in rs.items() if r.status == ERROR]
    for e in errors:
        print(f"posenc check: probe error in {e}", file=sys.stderr)
    return 1 if errors else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check", help="measure each encoding's claimed properties by running it")
    p.add_argument("names", nargs="*", metavar="NAME", help="encodings to check (default: all registered)")
    add_json_option(p, "every cell (status, value, detail, data, expected, source, verdict)")
    p.add_argument("--d-model", type=int_at_least(2), default=64, help="probe model width C (default 64)")
    p.add_argument("--heads", type=positive_int, default=4, help="probe heads H, dividing --d-model (default 4)")
    p.add_argument("--train-len", type=int_at_least(8), default=128, help="training length L the curves are judged against (default 128)")
    p.add_argument("--legend", action="store_true", help="print what each column and symbol of the table means")
    p.set_defaults(func=_cmd_check)
