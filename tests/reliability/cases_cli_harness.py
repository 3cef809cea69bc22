"""The benchmark harness as users extend it: encoding specs, size flags, registered tasks,
user modules, --json (issue 14)."""

from __future__ import annotations

import random

from . import Case

A = "cli_harness"


def _spec(spec: str):
    from posenc.variants import parse_variant

    return lambda: parse_variant(spec)


def _register(**attrs):
    """register_task on a throwaway class (the registry is restored whatever happens)."""

    def run():
        from posenc.bench import tasks

        saved = dict(tasks._TASKS)
        try:
            cls = type("UserTask", (tasks.Task,), {"make": lambda self, n, rng: tasks.Example((tasks.SEP,), (1,)), **attrs})
            tasks.register_task(cls)
        finally:
            tasks._TASKS.clear()
            tasks._TASKS.update(saved)

    return run


def _wild_task():
    from posenc.bench.tasks import SEP, Example, Task

    class Wild(Task):
        name = "wild"

        def make(self, n, rng):
            return Example((1, SEP), (99,))

    return Wild().sample(1, random.Random(0))


def _short_synthetic_length():
    from posenc.bench import tasks
    from posenc.bench.settings import settings_for

    saved = dict(tasks._TASKS)
    try:
        cls = type("Long", (tasks.Task,), {"name": "long", "min_length": 5,
                                             "make": lambda self, n, rng: tasks.Example((tasks.SEP,), (1,))})
        tasks.register_task(cls)
        settings_for("micro", encodings=["none"], tasks=["long"], synthetic_length=4)
    finally:
        tasks._TASKS.clear()
        tasks._TASKS.update(saved)


def _json_stdout_and_path():
    import io
    import contextlib
    import json
    import tempfile
    from pathlib import Path

    from posenc.cli.args import emit_json

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        printed = emit_json("-", {"a": 1})
    with tempfile.TemporaryDirectory() as d:
        wrote = emit_json(Path(d) / "r.json", {"a": 1})
        same = json.loads((Path(d) / "r.json").read_text()) == json.loads(buf.getvalue())
    return f"--json: stdout replaces the table ({printed}), --json PATH writes the same document ({same}) and keeps the table ({not wrote})"


def _json_nan():
    from posenc.cli.args import emit_json

    emit_json("-", {"x": float("nan")})


def parse_label(spec: str) -> str:
    from posenc.variants import parse_variant

    return parse_variant(spec).label


def _register_nomake():
    from posenc.bench import tasks

    saved = dict(tasks._TASKS)
    try:
        tasks.register_task(type("NoMake", (tasks.Task,), {"name": "nomake"}))
    finally:
        tasks._TASKS.clear()
        tasks._TASKS.update(saved)


def _import_raising():
    import tempfile
    from pathlib import Path

    from posenc.cli.plugins import import_user_module

    # A fixed folder, not a random temp name: the message (with the path) goes into the
    # generated docs/reliability.md, which must come out the same on every run.
    d = Path(tempfile.gettempdir()) / "posenc_reliability"
    d.mkdir(exist_ok=True)
    path = d / "h8_raises.py"
    path.write_text("raise RuntimeError('boom')\n")
    import_user_module(str(path))


def _run_example(length):
    from posenc.examples import run_example

    return run_example(["none"], length)


CASES = [
    # encoding specs
    Case(A, "encoding spec with an unknown key", r"unknown key 'bse' for encoding 'rope'; valid keys: base, rotary_dim, layout",
         _spec("rope:bse=2")),
    Case(A, "encoding spec with a value of the wrong type", r"encoding spec 't5:num_buckets=2.5': num_buckets must be an int, got '2.5'",
         _spec("t5:num_buckets=2.5")),
    Case(A, "encoding spec with an out-of-range value", r"encoding spec 'rope:base=-2': base must be > 0, got -2.0", _spec("rope:base=-2")),
    Case(A, "encoding spec with a non-finite float", r"base must be a finite float, got 'inf'", _spec("rope:base=inf")),
    Case(A, "encoding spec with a bool that is not true/false", r"symmetric must be true or false, got 'yes'", _spec("alibi:symmetric=yes")),
    Case(A, "encoding spec with a key given twice", r"key 'base' is given twice", _spec("rope:base=2,base=3")),
    Case(A, "encoding spec item without '='", r"each item after ':' must be KEY=VALUE, got 'base'", _spec("rope:base")),
    Case(A, "encoding spec text with a path separator", r"layout must be text of letters, digits, '_', '.' or '-', got 'a/b'",
         _spec("rope:layout=a/b")),
    Case(A, "encoding spec that is not a str", r"encoding spec must be a str", _spec(5), error=TypeError),  # type: ignore[arg-type]
    Case(A, "encoding spec equal to the defaults", r"^rope$", lambda: parse_label("rope:base=10000"), error=None),
    # the bench command line
    Case(A, "`posenc bench --encodings rope:base=x`", r"encoding spec 'rope:base=x': base must be a float, got 'x'",
         argv=["bench", "--encodings", "rope:base=x", "--out", "/no/such/h8_out"]),
    Case(A, "`posenc bench --d-model 30 --heads 4`", r"--d-model \(30\) must be divisible by --heads \(4\)",
         argv=["bench", "--preset", "micro", "--d-model", "30", "--heads", "4", "--out", "/no/such/h8_out"]),
    Case(A, "`posenc bench` with a variant no model of this size accepts",
         r"encoding 'rope@rotary_dim=64' cannot be built with these settings: rotary_dim",
         argv=["bench", "--preset", "micro", "--encodings", "rope:rotary_dim=64", "--out", "/no/such/h8_out"]),
    Case(A, "`posenc bench --passkey-depths 1.5`", r"argument --passkey-depths: must be a float in \[0, 1\], got 1.5",
         argv=["bench", "--passkey-depths", "1.5", "--out", "/no/such/h8_out"]),
    Case(A, "`posenc bench --passkey-length 5` (shorter than a key)", r"argument --passkey-length: must be an int in \[6, 1048576\], got 5",
         argv=["bench", "--passkey-length", "5", "--out", "/no/such/h8_out"]),
    Case(A, "`posenc bench --lm-eval-factors 0`", r"argument --lm-eval-factors: must be a float in \(0, 1024\], got 0",
         argv=["bench", "--lm-eval-factors", "0", "--out", "/no/such/h8_out"]),
    Case(A, "`posenc bench --scalings banana`", r"argument --scalings: must be one of linear, ",
         argv=["bench", "--scalings", "banana", "--out", "/no/such/h8_out"]),
    # registered tasks
    Case(A, "register_task on a class without make()", r"must override make\(self, length, rng\)",
         lambda: _register_nomake(), error=TypeError),
    Case(A, "register_task with a taken name", r"task 'copy' is already registered", _register(name="copy")),
    Case(A, "register_task with a name that is not a folder name", r"must be lowercase letters, digits and '_' starting with a letter, got 'my task'",
         _register(name="my task")),
    Case(A, "register_task with min_length 0", r"min_length of task 'zero' must be >= 1, got 0", _register(name="zero", min_length=0)),
    Case(A, "a task emitting a token outside its vocabulary", r"task 'wild': tokens must be ints in \[0, 20\), got 99",
         _wild_task),
    Case(A, "a registered task needing longer problems than --synthetic-length",
         r"synthetic_length must be >= 5 \(the min_length of task 'long'\), got 4", _short_synthetic_length),
    # user modules
    Case(A, "`posenc --import` a module that does not exist", r"--import no_such_h8_module: No module named 'no_such_h8_module'",
         argv=["--import", "no_such_h8_module", "list"]),
    Case(A, "`posenc --import` a missing .py file", r"--import must be a module name or an existing .py file, got '/no/such/plugin.py' \(missing\)",
         argv=["--import", "/no/such/plugin.py", "list"]),
    Case(A, "`posenc --import` a module whose code raises", r"--import .*h8_raises\.py: the module raised RuntimeError: boom at .*h8_raises\.py:1",
         _import_raising),
    Case(A, "`posenc --import` a name that is not a module name", r"--import must be a module name \(dotted identifiers\) or a path to a .py file, got 'a-b'",
         argv=["--import", "a-b", "list"]),
    Case(A, "`posenc bench --import MODULE` (after the subcommand)", r"--import must come before the subcommand \(posenc --import MODULE bench \.\.\.\)",
         argv=["bench", "--import", "mymod", "--out", "/no/such/h8_out"]),
    Case(A, "`run_example(length=0)` from Python", r"length must be an int >= 1, got 0", lambda: _run_example(0)),
    # --json
    Case(A, "`posenc speed relative --json out.txt` (not .json)", r"argument --json: must be a path ending in .json, or '-' for stdout",
         argv=["speed", "relative", "--json", "/tmp/h8_out.txt"]),
    Case(A, "--json with and without a path", r"stdout replaces the table \(True\).*same document \(True\).*keeps the table \(True\)",
         _json_stdout_and_path, error=None),
    Case(A, "--json of a NaN result", r"--json: Out of range float values are not JSON compliant.*the results hold NaN or infinity", _json_nan),
]
