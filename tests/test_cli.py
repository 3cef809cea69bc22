"""The `posenc` command: `posenc list`, and Ctrl-C while the process exits (posenc_entry)."""

from __future__ import annotations

import pytest

import posenc
from posenc.cli import main as cli_main


def test_cli_list_prints_every_encoding(capsys):
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    for name in posenc.list_encodings():
        assert name in out
        assert posenc.get_info(name).paper in out


# ---- Ctrl-C while the interpreter shuts down, after the command has finished

_LATE_INTERRUPTS = {
    # sys.exit itself interrupted (the window between the command's return and the interpreter's exit)
    "exit_sigint": ("import os, signal, sys, time\n"
                    "_exit = sys.exit\n"
                    "def _interrupted_exit(code=None):\n"
                    "    os.kill(os.getpid(), signal.SIGINT)\n"
                    "    time.sleep(2)\n"
                    "    _exit(code)\n"
                    "sys.exit = _interrupted_exit\n"),
    # while the interpreter waits for a thread at shutdown
    "thread_sigint": ("import os, signal, threading, time\n"
                      "def _late():\n"
                      "    while not getattr(threading, '_SHUTTING_DOWN', False):\n"
                      "        time.sleep(0.01)\n"
                      "    os.kill(os.getpid(), signal.SIGINT)\n"
                      "    time.sleep(2)\n"
                      "threading.Thread(target=_late).start()\n"),
    # in an atexit handler
    "atexit_sigint": ("import atexit, os, signal, time\n"
                      "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(2)))\n"),
}


@pytest.mark.parametrize("module", list(_LATE_INTERRUPTS))
def test_an_interrupt_during_shutdown_is_the_one_line_and_130(tmp_path, module):
    """posenc list, then SIGINT while the process exits: ``posenc: interrupted`` and code 130,
    the command's output kept (it was: killed by SIGINT, -2, with a traceback or none)."""
    import os
    import subprocess
    import sys

    (tmp_path / f"{module}.py").write_text(_LATE_INTERRUPTS[module])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "posenc", "--import", module, "list"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 130 and done.stderr == "posenc: interrupted\n", (done.returncode, done.stderr)
    assert all(name in done.stdout for name in posenc.list_encodings())


# ---- how the process ends under torchrun (posenc_entry.finish)

_FINISH = ("import atexit, sys\n"
           "from posenc_entry import finish\n"
           "atexit.register(lambda: print('atexit ran', flush=True))\n"
           "sys.stdout.write('unflushed'); sys.stderr.write('err unflushed')\n"
           "finish(3)\n")


@pytest.mark.parametrize("world_size", [None, "1", "2", "not a number"])
def test_finish_flushes_runs_atexit_and_keeps_the_code(world_size, tmp_path):
    """Under torchrun (WORLD_SIZE > 1) the process ends with os._exit, after the atexit handlers
    and the flush: gloo's threads can abort a finalizing interpreter (posenc_entry.finish).
    Anywhere else, sys.exit. Either way the code, the output and the atexit handlers are kept."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    if world_size is not None:
        env["WORLD_SIZE"] = world_size
    done = subprocess.run([sys.executable, "-c", _FINISH], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unflushedatexit ran\n" and done.stderr == "err unflushed", (done.stdout, done.stderr)
