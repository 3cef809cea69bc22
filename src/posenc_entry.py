"""The ``posenc`` console script: ``posenc.cli.main`` with Ctrl-C handled from the first instant.

Importing the CLI imports torch and every subcommand (a second or more). A Ctrl-C then would
print a KeyboardInterrupt traceback, leave numpy half-imported so that torch fails later with
``module 'numpy' has no attribute 'multiply'``, or be swallowed by a broad ``except`` inside
some import so that the command goes on as if nothing happened. So while the package is
imported and the parser built (which imports every subcommand), SIGINT does not raise: its
handler prints ``posenc: interrupted`` and ends the process at once with code 130
(128 + SIGINT, the shell's convention). While the command runs Python's own handler is back, and
``posenc.cli.main`` turns the KeyboardInterrupt into the same line (``posenc bench`` first
saves its checkpoint); once it has returned, the guard is on again for the interpreter's
shutdown.

``python -m posenc`` runs the same :func:`main` from ``posenc/__main__.py``. Python imports the
``posenc`` package first, which is why ``posenc/__init__.py`` imports nothing (its names load on
first use): the guard goes on a few milliseconds after startup either way, and the library
knows nothing of this module.

A SIGINT during the interpreter's own startup, before this module runs (about 20 ms on an
idle machine, 0.2 s on a loaded one), is Python's: it kills the process quietly or prints
a traceback from ``site``, as for any Python program.
"""

from __future__ import annotations

import os
import sys

__all__ = ["main", "guard_interrupts", "finish"]


def _exit_interrupted(signum: int = 2, frame: object = None) -> None:  # noqa: ARG001
    # os._exit: no interpreter cleanup, whose atexit handlers of a half-imported torch/numpy
    # could fail in turn, and no second chance for a broad except to swallow the interrupt
    import _signal

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    try:
        os.write(2, b"posenc: interrupted\n")
    finally:
        os._exit(130)


def guard_interrupts() -> None:
    """From now until :func:`main` runs the command, SIGINT prints ``posenc: interrupted`` and
    ends the process with code 130."""
    # _signal, the C module under `signal`, is built in: importing `signal` itself would take
    # tens of milliseconds (enum, functools) with Python's raising handler still on
    import _signal

    _signal.signal(_signal.SIGINT, _exit_interrupted)


def main() -> None:
    """Import the CLI and build its parser under the guard, then run it; exit with its code.

    The one entry of both ``posenc`` (the console script) and ``python -m posenc``.
    """
    try:
        guard_interrupts()
        import _signal
        import warnings

        # torch warns on import where numpy is missing; posenc needs numpy only for its extras
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        from posenc.cli import build_parser, main as cli_main
        from posenc.text import one_line

        try:
            parser = build_parser(sys.argv[1:])  # also imports user code (--import, entry points)
        except (ValueError, TypeError, OSError) as e:  # a bad --import or plugin: one line, exit 2
            print(f"posenc: error: {one_line(e)}", file=sys.stderr)
            sys.exit(2)
    except KeyboardInterrupt:  # raised before our handler was on, or by code that re-installed one
        _exit_interrupted()
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    try:
        code = cli_main(parser=parser)
    except KeyboardInterrupt:  # outside cli_main's own handler (its last statements)
        _exit_interrupted()
    # Shutdown (sys.exit unwinding, atexit handlers, threads joined, torch's finalizers) is
    # guarded as startup is: a KeyboardInterrupt there would end the process killed by SIGINT
    # (-2) with a traceback or none.
    guard_interrupts()
    finish(code)


def finish(code: int) -> None:
    """End the process with ``code``, what it printed flushed first.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) the atexit handlers run and the process ends with
    ``os._exit``, skipping the interpreter's finalization. torch (2.13) keeps a gloo process
    group alive after ``destroy_process_group`` once DistributedDataParallel has used it, and
    its worker threads may still be releasing the last collective's tensors when the
    interpreter finalizes; that release takes the GIL from a finalizing interpreter, which
    aborts the rank ("terminate called without an active exception", SIGABRT) after its work
    is done and written (pytorch/pytorch#190489). Elsewhere: ``sys.exit(code)``.
    """
    _flush()
    try:
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        ranks = 1
    if ranks <= 1:
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()  # what a normal exit would run (logging's flush, tqdm, temp files)
    _flush()  # what the handlers printed
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass


if __name__ == "__main__":
    main()
