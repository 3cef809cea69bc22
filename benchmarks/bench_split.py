"""Run one ``posenc bench`` preset as N one-thread processes, one per core, into one output folder.

The bench's models are too small for a second thread to help (docs/bench.md "make demo"), so a
2-core CPU is used fully by two processes of one thread each. Each process runs its share of the
tasks (balanced by their cost per run in ``--costs``, a committed results file) into its own
folder ``OUT.partK`` whose ``runs/`` is a link to ``OUT/runs``, as ``make demo`` does (a bench
folder is locked by the process writing it); a last bench call, which trains nothing, verifies
and collects every run into ``OUT/results.json`` and notes how the runs were made.

Every call passes ``--resume``: an interrupted command, given again, continues each run from
its checkpoint and skips the finished ones. To start over, delete ``OUT`` (the runs of another
code version would otherwise be collected as they are).

    python benchmarks/bench_split.py --preset standard --out out/bench_standard
    python benchmarks/bench_split.py --preset micro --out /tmp/smoke --processes 2 -- --encodings none rope
    python benchmarks/tables.py --rerun bench_standard   # the standard table: this script, then the docs

Arguments after ``--`` go to every ``posenc bench`` call (not ``--tasks``, ``--out``,
``--threads``, ``--resume``: the script sets them). Ctrl-C stops every process at its next step
boundary (each saves a checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # posenc from this checkout, as the bench processes get it
    sys.path.insert(0, str(ROOT / "src"))
OWN = ("--tasks", "--out", "--threads", "--resume", "--overwrite")


def task_costs(tasks: list[str], costs: Path | None) -> dict[str, float]:
    """Seconds of training per run of each task, read from a results file's runs; a task it
    lacks gets the mean of those it has (1.0 each when nothing is known)."""
    known: dict[str, list[float]] = {}
    if costs is not None and costs.is_file():
        for r in json.loads(costs.read_text()).get("runs", []):
            known.setdefault(r["task"], []).append(r["train_seconds"])
    mean = {t: sum(v) / len(v) for t, v in known.items()}
    fill = sum(mean.values()) / len(mean) if mean else 1.0
    return {t: mean.get(t, fill) for t in tasks}


def split(costs: dict[str, float], parts: int) -> list[list[str]]:
    """The tasks in ``parts`` groups of about equal cost: the costliest first, each to the
    cheapest group so far (longest-processing-time first); empty groups dropped, the tasks of a
    group in their given order."""
    order = list(costs)
    groups: list[list[str]] = [[] for _ in range(parts)]
    load = [0.0] * parts
    for t in sorted(order, key=lambda t: (-costs[t], order.index(t))):
        k = min(range(parts), key=lambda i: (load[i], i))
        groups[k].append(t)
        load[k] += costs[t]
    return [sorted(g, key=order.index) for g in groups if g]


def preset_tasks(preset: str) -> list[str]:
    """The tasks of ``preset``."""
    from posenc.bench.settings import settings_for

    return list(settings_for(preset).tasks)


def bench(preset: str, out: Path, extra: list[str], tasks: list[str] | None) -> list[str]:
    argv = [sys.executable, "-m", "posenc", "bench", "--preset", preset, "--threads", "1", "--resume", "--no-progress",
            "--out", str(out), *extra]
    return argv + (["--tasks", *tasks] if tasks else [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="standard", help="the bench preset (default: standard)")
    p.add_argument("--out", type=Path, required=True, help="the output folder of the whole run")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="one-thread processes (default: one per core)")
    p.add_argument("--costs", type=Path, default=ROOT / "benchmarks" / "results" / "bench_standard.json",
                   help="a results file whose runs' training times balance the groups (default: the committed "
                        "standard run)")
    p.add_argument("--tasks", nargs="+", help="the tasks to run (default: the preset's)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more posenc bench flags")
    args = p.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    clash = [a for a in extra if a.split("=")[0] in OWN]
    if clash:
        p.error(f"{', '.join(clash)}: set by this script (--tasks is its own flag)")
    if args.processes < 1:
        p.error(f"--processes must be >= 1, got {args.processes}")
    tasks = args.tasks or preset_tasks(args.preset)
    costs = task_costs(tasks, args.costs)
    groups = split(costs, args.processes)
    out = args.out
    (out / "runs").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = []
    t0 = time.time()
    for k, group in enumerate(groups):
        part = out.with_name(f"{out.name}.part{k}")
        part.mkdir(parents=True, exist_ok=True)
        link = part / "runs"
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(out / "runs", part))
        log = open(f"{part}.log", "a")
        cmd = bench(args.preset, part, extra, group)
        print(f"[{k}] {' '.join(group)}  (estimated {sum(costs[t] for t in group):.1f} s per encoding and seed; "
              f"log: {part}.log)", flush=True)
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log, part))
    try:
        codes = [proc.wait() for proc, _, _ in procs]
    except KeyboardInterrupt:  # each bench saves a checkpoint on SIGTERM and exits
        for proc, _, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _, _ in procs:
            proc.wait()
        print("stopped; give the same command again to resume", file=sys.stderr)
        return 130
    finally:
        for _, log, _ in procs:
            log.close()
    trained = time.time() - t0
    failed = [(k, part) for k, (code, (_, _, part)) in enumerate(zip(codes, procs)) if code != 0]
    for k, part in failed:
        print(f"[{k}] exited with {codes[k]}; the end of {part}.log:", file=sys.stderr)
        print("".join(Path(f"{part}.log").read_text().splitlines(keepends=True)[-8:]), file=sys.stderr)
    if failed:
        return 1
    collect = bench(args.preset, out, extra, args.tasks)
    if subprocess.run(collect, cwd=ROOT, env=env).returncode != 0:
        return 1
    from posenc.files import write_json

    results = out / "results.json"
    data = json.loads(results.read_text())
    start = time.strftime("%H:%M", time.gmtime(t0))
    end = time.strftime("%H:%M", time.gmtime(t0 + trained))
    shares = " / ".join(" ".join(g) for g in groups)
    data["note"] = (f"Run as {len(groups)} 1-thread processes, each over a share of the tasks (--tasks {shares}, same "
                    f"settings), by benchmarks/bench_split.py, the last of them ending {end} UTC (from {start}); then "
                    "collected into one file by a last bench call with --resume (it trains nothing)")
    write_json(results, data, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
