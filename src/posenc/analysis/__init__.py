"""Analysis: verify each encoding's claims numerically, draw them, and report.

* :mod:`posenc.analysis.checks` — ``posenc check``: one measured property per column;
* :mod:`posenc.analysis.plots` — ``posenc plot KIND``: the figures of the literature;
* :mod:`posenc.analysis.report` — ``posenc report``: one self-contained HTML page.
"""

from .checks import CHECKS, CheckResult, Probe, check_encoding, run_checks

__all__ = ["CHECKS", "CheckResult", "Probe", "check_encoding", "run_checks"]
