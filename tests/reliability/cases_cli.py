"""The command line: every bad option is one line naming it, exit code 2 (issue 10, part 2).

Paths are fixed (``/dev/null`` is an existing file, ``/no/such/...`` is missing) so the
messages, and the page written from them, do not depend on the machine.
"""

from __future__ import annotations

import torch

from . import Case

A = "cli"

CASES = [
    Case(A, "`posenc bench --out` an existing file", r"argument --out: must be a directory, got '/dev/null', which is an existing file",
         argv=["bench", "--out", "/dev/null"]),
    Case(A, "`posenc bench --out` a path under a file", r"argument --out: must be a directory path, got '/dev/null/run', which cannot be created: '/dev/null' is a file",
         argv=["bench", "--out", "/dev/null/run"]),
    Case(A, "`posenc bench --device banana`", r"argument --device: must be one of cpu, cuda, mps \(or cuda:N\), got 'banana'",
         argv=["bench", "--device", "banana"]),
    Case(A, "`posenc bench --device cuda` without CUDA (cuda:99 with it)",
         r"argument --device: (CUDA is not available on this machine|CUDA device index must be in)",
         argv=["bench", "--device", "cuda" if not torch.cuda.is_available() else "cuda:99"],
         doc="without CUDA: posenc bench: error: argument --device: CUDA is not available on this machine, got 'cuda'; "
             "use --device cpu; with it: argument --device: CUDA device index must be in [0, N-1] on this machine, "
             "got 'cuda:99'"),
    Case(A, "`posenc bench --seeds 0`", r"argument --seeds: must be an int in \[1, 1000\], got 0", argv=["bench", "--seeds", "0"]),
    Case(A, "`posenc bench --steps ten`", r"argument --steps: must be an int in \[1, 100000000\], got 'ten'", argv=["bench", "--steps", "ten"]),
    Case(A, "`posenc bench --threads 0`", r"argument --threads: must be an int in \[1, 4096\], got 0", argv=["bench", "--threads", "0"]),
    Case(A, "`posenc bench --data` a missing path", r"argument --data: must be an existing file or directory, got '/no/such/corpus' \(missing\)",
         argv=["bench", "--data", "/no/such/corpus"]),
    Case(A, "`posenc speed model --lengths 0`", r"argument --lengths: must be a positive int, got 0", argv=["speed", "model", "--lengths", "0"]),
    Case(A, "`posenc speed model --lengths -8`", r"argument --lengths: must be a positive int, got -8", argv=["speed", "model", "--lengths", "-8"]),
    Case(A, "`posenc speed model --batch 0`", r"argument --batch: must be a positive int, got 0", argv=["speed", "model", "--batch", "0"]),
    Case(A, "`posenc speed model --width 30 --heads 4` (not divisible)", r"--width \(30\) must be divisible by --heads \(4\)",
         argv=["speed", "model", "--width", "30", "--heads", "4", "--encodings", "none"]),
    Case(A, "`posenc speed model --isolate=yes` (a switch: --isolate / --no-isolate)",
         r"argument --isolate/--no-isolate: ignored explicit argument 'yes'", argv=["speed", "model", "--isolate=yes"]),
    Case(A, "`posenc speed relative --head-dim 7` (odd)", r"argument --head-dim: must be an even positive int, got 7",
         argv=["speed", "relative", "--head-dim", "7"]),
    Case(A, "`posenc speed relative --repeat 0`", r"argument --repeat: must be a positive int, got 0", argv=["speed", "relative", "--repeat", "0"]),
    Case(A, "`posenc speed relative --json` a directory", r"argument --json: must be a file path, got '/dev', which is a directory",
         argv=["speed", "relative", "--json", "/dev"]),
    Case(A, "`posenc example --length 0`", r"argument --length: must be a positive int, got 0", argv=["example", "--length", "0"]),
    Case(A, "`posenc plot` an unknown kind", r"unknown plot kind 'banana'; valid kinds: all, ",
         argv=["plot", "banana", "--out", "/no/such/plots"]),
    Case(A, "`posenc report --bench` a missing folder", r"argument --bench: must be an existing directory, got '/no/such/bench', which is not a directory \(missing\)",
         argv=["report", "--bench", "/no/such/bench"]),
    Case(A, "`posenc report --probe` a missing folder", r"argument --probe: must be an existing directory, got '/no/such/probe', which is not a directory \(missing\)",
         argv=["report", "--probe", "/no/such/probe"]),
    Case(A, "`posenc report --probe` a folder without probe.json (nothing written)",
         r"--probe '/' holds no probe.json \(give the --out folder of `posenc probe`\)",
         argv=["report", "--out", "/no/such/report", "--probe", "/"]),
    Case(A, "`posenc report --model-bench` a folder without results (nothing written)",
         r"--model-bench '/' holds no results.json \(give the --out folder of `posenc bench --model`\)",
         argv=["report", "--out", "/no/such/report", "--model-bench", "/"]),
    Case(A, "`posenc check --train-len 4`", r"argument --train-len: must be an int >= 8, got 4", argv=["check", "--train-len", "4"]),
    Case(A, "`posenc check --d-model 30 --heads 4` (not divisible)", r"--d-model \(30\) must be divisible by --heads \(4\)",
         argv=["check", "--d-model", "30", "--heads", "4", "none"]),
]
