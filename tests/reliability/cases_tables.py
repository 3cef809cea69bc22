"""benchmarks/tables.py: the renderer of the README's measured tables (issue 10, part 4)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import tempfile
from pathlib import Path

from . import Case

A = "tables.py"
_ROOT = Path(__file__).resolve().parents[2]


def _tables():
    """benchmarks/tables.py, a script outside the package, imported once."""
    name = "_posenc_benchmarks_tables"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _ROOT / "benchmarks" / "tables.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _with_results_dir(fn, files: dict[str, str]):
    """Run ``fn(tables)`` with RESULTS_DIR a temporary folder holding ``files``."""
    t = _tables()
    saved = t.RESULTS_DIR
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            (Path(d) / name).write_text(text)
        t.RESULTS_DIR = Path(d)
        try:
            return fn(t)
        finally:
            t.RESULTS_DIR = saved


def _relative(length: int) -> str:
    row = {"time_ms": 1.0, "peak_mib": 1.0}
    return json.dumps({"machine": "M", "batch": 1, "heads": 8, "head_dim": 64, "dtype": "float32",
                       "results": [{"length": length, "rows": {"plain q·k^T": row, "einsum (T,T,D) rkq": row}}]})


def _rerun_unknown() -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = _tables().main(["--rerun", "rope_cpu", "nope"])
        except SystemExit as e:  # argparse's error exit
            code = e.code
    return f"exit {code}: {err.getvalue().strip().splitlines()[-1]}"


CASES = [
    Case(A, "a page names a table no renderer knows", r"unknown table 'nope'; known: .*rope_cpu",
         run=lambda: _tables().render_page("README.md", "<!-- table: nope -->\n<!-- /table -->")),
    Case(A, "a table marker is never closed (the table would silently not be rendered)",
         r"table marker 'rope_cpu' has no closing <!-- /table -->",
         run=lambda: _tables().render_page("README.md", "<!-- table: rope_cpu -->\n| stale |\n")),
    Case(A, "an unknown results name", r"unknown results 'ropee'; valid: rope_cpu, ",
         run=lambda: _tables().load("ropee")),
    Case(A, "a results file is missing", r"no results file rope_cpu.json; python benchmarks/tables.py --rerun rope_cpu writes it",
         error=FileNotFoundError, run=lambda: _with_results_dir(lambda t: t.load("rope_cpu"), {})),
    Case(A, "a results file is not JSON", r"relative_cpu.json is not valid JSON .*--rerun relative_cpu rewrites it",
         run=lambda: _with_results_dir(lambda t: t.load("relative_cpu"), {"relative_cpu.json": "{truncated"})),
    Case(A, "a results file records no machine", r"model_cpu.json records no machine; re-run it with --rerun model_cpu",
         run=lambda: _tables() and importlib.import_module("docsbuild.captions").caption("model_cpu", "README.md", {})),
    Case(A, "the relative results lack the length the README quotes", r"relative results have no T=2048; lengths: \[512\]",
         run=lambda: _with_results_dir(lambda t: t.render("relative_scores", "docs/speed.md"), {"relative_cpu.json": _relative(512)})),
    Case(A, "--rerun with an unknown name: refused before any measurement runs",
         r"^exit 2: tables.py: error: --rerun: unknown results 'nope'; valid: rope_cpu", error=None, run=_rerun_unknown),
]
