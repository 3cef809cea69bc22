"""The command line, round 3 (issue 24): numbers without bounds, a missing optional package,
and writes that fail. Each is one line naming the option or the file, exit code 2.

Paths are fixed or made under a fresh temporary folder; the messages that carry them are
matched, and the page shows them as they are on any machine.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from . import Case

A = "cli, round 3"


def _micro(*flags: str) -> list[str]:
    return ["bench", "--preset", "micro", "--tasks", "copy", "--encodings", "none", "--no-progress", *flags,
            "--out", "/no/such/dir/bench"]


def _full_disk_at_checkpoint() -> str:
    """A full disk at posenc bench's first checkpoint: the error the CLI prints (the file named)."""
    import contextlib
    import io

    import safetensors.torch

    from posenc.cli import main

    real = safetensors.torch.save_file

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    safetensors.torch.save_file = full
    err = io.StringIO()
    try:
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["bench", "--preset", "micro", "--tasks", "copy", "--encodings", "none", "--no-progress",
                         "--steps", "2", "--out", str(Path(tmp) / "b")])
            line = err.getvalue().strip().replace(tmp, "TMP")
    finally:
        safetensors.torch.save_file = real
    return f"exit {code}: {line}"


def _missing_extra() -> None:
    from posenc._optional import require

    require("matplotlib_not_installed_here", extra="plot")


CASES = [
    Case(A, "`posenc bench --lr 1e308`", r"argument --lr: must be a float in \(0, 10\], got 1e\+308",
         argv=_micro("--lr", "1e308")),
    Case(A, "`posenc bench --batch-size 1000000000`", r"argument --batch-size: must be an int in \[1, 1048576\], got 1000000000",
         argv=_micro("--batch-size", "1000000000")),
    Case(A, "`posenc bench --steps 1e12`", r"argument --steps: must be an int in \[1, 100000000\], got '1e12'",
         argv=_micro("--steps", "1e12")),
    Case(A, "`posenc bench --passkey-eval-factors 1e9`", r"argument --passkey-eval-factors: must be a float in \(0, 1024\], got 1e\+09",
         argv=_micro("--passkey-eval-factors", "1e9")),
    Case(A, "`posenc bench --seeds 100000`", r"argument --seeds: must be an int in \[1, 1000\], got 100000",
         argv=_micro("--seeds", "100000")),
    Case(A, "`posenc bench --threads 100000`", r"argument --threads: must be an int in \[1, 4096\], got 100000",
         argv=_micro("--threads", "100000")),
    Case(A, "`posenc bench --embedding huge`", r"argument --embedding: must be one of matched, gpt2, unit, got 'huge'",
         argv=_micro("--embedding", "huge")),
    Case(A, "`posenc bench --preset full` (the paper preset's name is paper)", r"argument --preset: invalid choice: 'full' \(choose from '?micro'?, '?quick'?, '?standard'?, '?paper'?\)",
         argv=["bench", "--preset", "full", "--out", "/no/such/dir/bench"]),
    Case(A, "`posenc speed model --lengths 10000000000`", r"argument --lengths: must be a positive int at most 2147483647, got 10000000000",
         argv=["speed", "model", "--lengths", "10000000000"]),
    Case(A, "`posenc probe --extend 1e300`", r"argument --extend: must be a positive finite float at most 1e\+06, got 1e\+300",
         argv=["probe", "/no/such/model", "--out", "/no/such/dir/probe", "--extend", "1e300"]),
    Case(A, "`posenc speed relative --head-dim 4294967296`", r"argument --head-dim: must be an even positive int at most 2147483646, got 4294967296",
         argv=["speed", "relative", "--head-dim", "4294967296"]),
    Case(A, "a missing optional package (matplotlib for a figure)", r"matplotlib_not_installed_here is not installed; posenc needs it for figures: pip install 'posenc\[plot\]'",
         run=_missing_extra, error=ImportError),
    Case(A, "a full disk at `posenc bench`'s first checkpoint", r"^exit 2: posenc bench: error: cannot write file TMP/b/runs/copy/none/seed0/checkpoint\.safetensors: No space left on device; the file it replaces is intact: free space or fix the folder's permissions, then rerun with --resume$",
         run=_full_disk_at_checkpoint, error=None),
]
