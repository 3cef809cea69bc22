"""Render every measured table in README.md and docs/*.md from its committed results file.

A table in a Markdown page sits between two markers::

    <!-- table: rope_cpu -->
    ... generated: do not edit by hand ...
    <!-- /table -->

and is rewritten from ``benchmarks/results/`` by the renderer ``docsbuild.manifest.TABLES``
names, with the machine and the command that wrote the file under it. Each results file has
one command that regenerates it (``docsbuild.results.RESULTS``).

    python benchmarks/tables.py                  # re-render every table from the committed files
    python benchmarks/tables.py --check          # exit 1 if a committed table differs from its file
    python benchmarks/tables.py --rerun          # re-run every measurement, then re-render
    python benchmarks/tables.py --rerun rope_cpu check_cpu   # only these results files
    python benchmarks/tables.py --list           # results files, their commands and their tables

``--rerun`` runs each command in its own process (``python -m posenc ...``: a fresh torch, no
thread settings carried from one command to the next), records the machine, the command and
the wall time in the results file, and re-renders. Measure on a quiet machine: the ratios are
side by side within one run, but a loaded machine still moves them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:  # the docs build lives beside this script
    sys.path.insert(0, str(ROOT / "benchmarks"))

from docsbuild.captions import duration  # noqa: E402
from docsbuild.manifest import TABLES  # noqa: E402
from docsbuild.results import RESULTS, Result  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
# The pages whose tables are generated; a marker anywhere else is not looked at.
PAGES = ("README.md", "benchmarks/results/README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))))

MARKER = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def _result(name: str) -> Result:
    if name not in RESULTS:
        raise ValueError(f"unknown results {name!r}; valid: {', '.join(RESULTS)}")
    return RESULTS[name]


def load(name: str) -> dict:
    """The committed results file of ``name``.

    Benchmark results go through ``posenc.results.read_results``, which checks their format and
    reads a missing metric (null) as NaN, as the benchmark's own tables do.
    """
    res = _result(name)
    path = RESULTS_DIR / res.file
    if not path.is_file():
        raise FileNotFoundError(f"no results file {res.file}; python benchmarks/tables.py --rerun {name} writes it")
    if res.bench:
        from posenc.results import read_results

        return read_results(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{res.file} is not valid JSON ({e}); python benchmarks/tables.py --rerun {name} rewrites it") from None


def render(name: str, page: str) -> str:
    """Table ``name`` as it renders into ``page``; it may read only the files its entry declares."""
    if name not in TABLES:
        raise ValueError(f"{page}: unknown table {name!r}; known: {', '.join(TABLES)}")
    table = TABLES[name]
    if page not in table.pages:
        raise ValueError(f"{page}: table {name!r} belongs in {', '.join(table.pages)} (docsbuild/manifest.py)")

    def declared(results: str) -> dict:
        if results not in table.results:
            raise ValueError(f"table {name!r} reads {results!r}, which its manifest entry does not declare")
        return load(results)

    return table.render(page, declared)


def render_page(page: str, text: str) -> str:
    """``text`` with every marked table re-rendered (an unknown table name is a ValueError)."""
    opened = re.findall(r"<!-- table: ([\w-]+) -->", text)
    closed = [m["name"] for m in MARKER.finditer(text)]
    if opened != closed:
        unclosed = [n for n in opened if n not in closed] or opened
        raise ValueError(f"{page}: table marker {unclosed[0]!r} has no closing <!-- /table --> "
                         "(or markers are nested)")
    return MARKER.sub(lambda m: m.group(1) + render(m["name"], page).rstrip("\n") + "\n" + m.group(4), text)


def tables_in(text: str) -> list[str]:
    return [m["name"] for m in MARKER.finditer(text)]


def render_all(write: bool) -> list[str]:
    """Re-render every page; returns the pages whose text changed (written when ``write``).
    A table missing from a page its manifest entry names is a ValueError."""
    changed, found = [], set()
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        found |= {(name, page) for name in tables_in(text)}
        new = render_page(page, text)
        if new != text:
            changed.append(page)
            if write:
                path.write_text(new)
    missing = [f"{name} in {page}" for name, t in TABLES.items() for page in t.pages if (name, page) not in found]
    if missing:
        raise ValueError(f"tables the manifest places but no page marks: {', '.join(missing)}")
    return changed


def _machine_now(threads: int | None) -> str:
    import torch

    from posenc.speed.timing import describe_machine

    if threads:
        torch.set_num_threads(threads)
    return describe_machine()


def rerun(name: str) -> float:
    """Run the command of ``name`` in a fresh process, record machine/command/wall time; seconds."""
    res = _result(name)
    path = RESULTS_DIR / res.file
    argv = [sys.executable, *res.argv[1:]] if res.argv[0] == "python" else [sys.executable, "-m", "posenc", *res.argv]
    print(f"[{name}] {res.command}", flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        raise RuntimeError(f"{res.command} exited with {proc.returncode}")
    for src, dst in res.copy:
        shutil.copyfile(ROOT / src, ROOT / dst)
    if res.stdout == "json":
        data = json.loads(proc.stdout)
        path.with_suffix(".txt").unlink(missing_ok=True)  # an older console table of this file: stale now
    else:
        data = json.loads(path.read_text())
        if res.stdout == "txt":
            path.with_suffix(".txt").write_text(proc.stdout)
    if res.stdout == "json" and "results" not in data and "rows" not in data:
        data = {"results": data}  # posenc check prints {encoding: {check: ...}}
    data.setdefault("machine", _machine_now(res.threads))
    data["command"] = res.command
    data["wall_s"] = wall
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"[{name}] {duration(wall)}", flush=True)
    return wall


def _list() -> None:
    for name, res in RESULTS.items():
        used = [t for t, table in TABLES.items() if name in table.results]
        print(f"{name:<24} {res.file:<28} {res.command}" + (f"  ({res.note})" if res.note else ""))
        print(f"{'':<24} tables: {', '.join(used) or 'none'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tables.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="exit 1 if a committed table differs from its results file")
    g.add_argument("--rerun", nargs="*", metavar="NAME", default=None,
                   help=f"re-run these measurements (default: every one with rerun=True), then render; any of {', '.join(RESULTS)}")
    g.add_argument("--list", action="store_true", help="print every results file, its command and its tables")
    args = p.parse_args(argv)
    if args.list:
        _list()
        return 0
    if args.rerun is not None:
        names = args.rerun or [n for n, r in RESULTS.items() if r.rerun]
        try:
            for n in names:
                _result(n)  # every name checked before the first (long) run
        except ValueError as e:
            p.error(f"--rerun: {e}")
        times = {n: rerun(n) for n in names}
        print("wall times: " + ", ".join(f"{n} {duration(t)}" for n, t in times.items()))
    try:
        changed = render_all(write=not args.check)
    except (ValueError, OSError) as e:
        print(f"tables.py: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        if changed:
            print("tables out of date in: " + ", ".join(changed) + "; run python benchmarks/tables.py", file=sys.stderr)
            return 1
        print("every table matches its results file")
        return 0
    print("re-rendered: " + (", ".join(changed) if changed else "nothing changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
