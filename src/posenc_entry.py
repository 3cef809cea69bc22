"""The ``posenc`` console script: ``posenc.cli.main`` with Ctrl-C handled from the first instant.

It lives outside the ``posenc`` package on purpose: importing anything from the package runs
``posenc/__init__.py``, which imports torch (about a second). A Ctrl-C in that second would
otherwise print a KeyboardInterrupt traceback, or leave numpy half-imported so that torch
fails later with ``module 'numpy' has no attribute 'multiply'``. Here the import itself is
guarded: one line ``posenc: interrupted`` and exit code 130 (128 + SIGINT, the shell's
convention), whenever the Ctrl-C comes.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["main"]


def _interrupted() -> None:
    # Ignore further Ctrl-C while exiting, and skip interpreter cleanup (atexit handlers of a
    # half-imported torch/numpy can fail in turn): print the line and leave.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        sys.stderr.write("posenc: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(130)


def main() -> None:
    """Import the CLI and run it; exit with its code."""
    try:
        from posenc.cli import main as cli_main
    except KeyboardInterrupt:
        _interrupted()
    try:
        code = cli_main()
    except KeyboardInterrupt:  # between the CLI's own handler and here
        _interrupted()
    sys.exit(code)


if __name__ == "__main__":
    main()
