"""Analysis: verify each encoding's claims numerically, draw them, and report.

* :mod:`posenc.analysis.probes` — the probe model: per-token codes and logits through the
  attention path;
* :mod:`posenc.analysis.checks` — the checks, one measured property per column;
* :mod:`posenc.analysis.claims` — what the literature expects per encoding and check;
* :mod:`posenc.analysis.runner` — ``posenc check``: run them and print the table;
* :mod:`posenc.analysis.plots` — ``posenc plot KIND``: the figures of the literature;
* :mod:`posenc.analysis.report` — ``posenc report``: one self-contained HTML page.
"""

from .checks import CHECKS, CheckResult
from .probes import Probe
from .runner import check_encoding, run_checks

__all__ = ["CHECKS", "CheckResult", "Probe", "check_encoding", "run_checks"]
