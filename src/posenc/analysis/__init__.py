"""Analysis: verify each encoding's claims numerically, draw them, and report.

* :mod:`posenc.analysis.probes` — the probe model: per-token codes and logits through the
  attention path;
* :mod:`posenc.analysis.checks` — the checks, one measured property per column;
* :mod:`posenc.analysis.claims` — what the literature expects per encoding and check;
* :mod:`posenc.analysis.runner` — run them on an encoding, each cell judged against the claim;
* :mod:`posenc.analysis.figures` — the table of figures of the literature (``fig_*.py``, drawn
  on :mod:`posenc.analysis.canvas`);
* :mod:`posenc.analysis.report` — one self-contained HTML page (:mod:`.report_page`, the
  benchmark folders: :mod:`.report_bench`).

The commands ``posenc check``, ``posenc plot`` and ``posenc report`` are in :mod:`posenc.cli`.
"""

from .checks import CHECKS, CheckResult
from .probes import Probe
from .runner import check_encoding, run_checks

__all__ = ["CHECKS", "CheckResult", "Probe", "check_encoding", "run_checks"]
