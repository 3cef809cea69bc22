"""Running the checks: an encoding built at the probe size, every check run on it, each cell
judged against the literature's claim.

The checks themselves are :mod:`posenc.analysis.checks`; the probe they run on is
:mod:`posenc.analysis.probes`; the literature's expectations are
:mod:`posenc.analysis.claims`. ``posenc check`` (:mod:`posenc.cli.check`) prints the table.
"""

from __future__ import annotations

import dataclasses

import torch

from ..encoding import PositionalEncoding
from .checks import CHECKS, ERROR, HAS, LACKS, NA, CheckResult
from .claims import expected_for, verdict
from .probes import Probe, max_position

__all__ = ["build_probe_encoding", "check_encoding", "run_checks"]


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
