"""Every bad option of every subcommand: exit code 2 and one line naming the option.

argparse prints a usage block before its error line; the user-facing contract is the one
line after it (``posenc speed model: error: argument --lengths: must be a positive int, got 0``).
Errors found after parsing (cross-option checks, unknown names) are one line too.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posenc.cli import args as cli_args
from posenc.cli import main

REPO = Path(__file__).resolve().parents[1]


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """Exit code and the stderr lines that are not argparse's usage block."""
    code = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
    return code, lines


@pytest.fixture
def a_file(tmp_path) -> str:
    p = tmp_path / "a_file.txt"
    p.write_text("not a directory")
    return str(p)


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")

# (argv, the one line must contain this); FILE is replaced by a path to an existing file,
# OUT by a fresh directory path.
BAD = [
    # bench
    (["bench", "--out", "FILE"], "argument --out: must be a directory, got"),
    (["bench", "--out", "FILE/sub"], "argument --out: must be a directory path, got"),
    pytest.param(["bench", "--device", "cuda", "--out", "OUT"], "argument --device: CUDA is not available", marks=NO_CUDA),
    (["bench", "--device", "banana", "--out", "OUT"], "argument --device: must be one of cpu, cuda, mps (or cuda:N), got 'banana'"),
    (["bench", "--seeds", "0", "--out", "OUT"], "argument --seeds: must be an int in [1, 1000], got 0"),
    (["bench", "--steps", "-3", "--out", "OUT"], "argument --steps: must be an int in [1, 100000000], got -3"),
    (["bench", "--steps", "ten", "--out", "OUT"], "argument --steps: must be an int in [1, 100000000], got 'ten'"),
    (["bench", "--threads", "0", "--out", "OUT"], "argument --threads: must be an int in [1, 4096], got 0"),
    (["bench", "--data", "/no/such/corpus", "--out", "OUT"], "argument --data: must be an existing file or directory"),
    (["bench", "--preset", "huge", "--out", "OUT"], "argument --preset: invalid choice: 'huge'"),
    (["bench", "--resume", "--overwrite", "--out", "OUT"], "argument --overwrite: not allowed with argument --resume"),
    (["bench", "--tasks", "multiply", "--out", "OUT"], "unknown task 'multiply'; valid tasks:"),
    (["bench", "--encodings", "banana", "--out", "OUT"], "unknown encoding 'banana'; valid encodings:"),
    (["bench"], "the following arguments are required: --out"),
    (["bench", "--encodings", "rope:bse=2", "--out", "OUT"], "unknown key 'bse' for encoding 'rope'; valid keys: base,"),
    (["bench", "--encodings", "rope:base=x", "--out", "OUT"], "encoding spec 'rope:base=x': base must be a float, got 'x'"),
    (["bench", "--d-model", "0", "--out", "OUT"], "argument --d-model: must be an int in [1, 65536], got 0"),
    (["bench", "--layers", "x", "--out", "OUT"], "argument --layers/--n-layer: must be an int in [1, 1024], got 'x'"),
    (["bench", "--lr", "nan", "--out", "OUT"], "argument --lr: must be a float in (0, 10], got 'nan'"),
    (["bench", "--passkey-length", "5", "--out", "OUT"], "argument --passkey-length: must be an int in [6, 1048576], got 5"),
    (["bench", "--passkey-depths", "1.5", "--out", "OUT"], "argument --passkey-depths: must be a float in [0, 1], got 1.5"),
    (["bench", "--lm-eval-factors", "0", "--out", "OUT"], "argument --lm-eval-factors: must be a float in (0, 1024], got 0"),
    (["bench", "--scalings", "banana", "--out", "OUT"], "argument --scalings: must be one of linear,"),
    (["bench", "--d-model", "30", "--heads", "4", "--out", "OUT"], "--d-model (30) must be divisible by --heads (4)"),
    # speed model
    (["speed", "model", "--lengths", "0"], "argument --lengths: must be a positive int, got 0"),
    (["speed", "model", "--lengths", "-8"], "argument --lengths: must be a positive int, got -8"),
    (["speed", "model", "--batch", "0"], "argument --batch: must be a positive int, got 0"),
    (["speed", "model", "--rounds", "0"], "argument --rounds: must be a positive int, got 0"),
    (["speed", "model", "--decode-contexts", "0"], "argument --decode-contexts: must be a positive int, got 0"),
    (["speed", "model", "--device", "banana"], "argument --device: must be one of"),
    pytest.param(["speed", "model", "--device", "cuda"], "argument --device: CUDA is not available", marks=NO_CUDA),
    (["speed", "model", "--json", "OUT_DIR"], "argument --json: must be a file path, got"),
    (["speed", "model", "--width", "30", "--heads", "4"], "posenc speed model: error: --width (30) must be divisible by --heads (4)"),
    (["speed", "model", "--encodings", "banana"], "unknown encoding 'banana'"),
    # speed relative
    (["speed", "relative", "--lengths", "0"], "argument --lengths: must be an int >= 2, got 0"),
    (["speed", "relative", "--head-dim", "7"], "argument --head-dim: must be an even positive int, got 7"),
    (["speed", "relative", "--repeat", "0"], "argument --repeat: must be a positive int, got 0"),
    (["speed", "relative", "--batch", "0"], "argument --batch: must be a positive int, got 0"),
    (["speed", "relative", "--dtype", "float8"], "argument --dtype: invalid choice: 'float8'"),
    (["speed", "relative", "--einsum-max-length", "0"], "argument --einsum-max-length: must be a positive int, got 0"),
    (["speed", "relative", "--json", "OUT/rel.txt"], "argument --json: must be a path ending in .json, or '-' for stdout, got"),
    (["speed", "banana"], "argument TARGET: invalid choice: 'banana'"),
    # example, list
    (["example", "--length", "0"], "argument --length: must be a positive int, got 0"),
    (["example", "banana"], "unknown encoding 'banana'"),
    (["list", "--family", "banana"], "argument --family: invalid choice: 'banana'"),
    # check
    (["check", "--heads", "0"], "argument --heads: must be a positive int, got 0"),
    (["check", "--train-len", "4"], "argument --train-len: must be an int >= 8, got 4"),
    (["check", "--d-model", "30", "--heads", "4"], "--d-model (30) must be divisible by --heads (4)"),
    (["check", "banana"], "unknown encoding 'banana'"),
    # plot
    (["plot", "banana", "--out", "OUT"], "unknown plot kind 'banana'; valid kinds: all,"),
    (["plot", "alibi", "--out", "FILE"], "argument --out: must be a directory, got"),
    (["plot", "alibi", "--out", "OUT", "--set", "nope=1"], "--set 'nope=1': alibi takes"),
    (["plot", "all", "--out", "OUT", "--set", "num_heads=4"], "--set applies to one plot kind, not to 'all'"),
    # report
    (["report", "--out", "OUT", "--bench", "/no/such/bench"], "argument --bench: must be an existing directory, got '/no/such/bench', which is not a directory (missing)"),
    (["report", "--out", "OUT", "--bench", "FILE"], "argument --bench: must be an existing directory"),
    (["report", "--out", "FILE"], "argument --out: must be a directory, got"),
    (["report", "--out", "OUT", "--train-len", "0"], "argument --train-len: must be an int >= 8, got 0"),
    (["report", "--out", "OUT", "--plots", "banana"], "--plots: unknown plot kind 'banana'; valid kinds:"),
    (["example", "rope:base=1"], "encoding spec 'rope:base=1': base must be != 1"),
    # probe
    (["probe", "/no/such/model", "--out", "OUT"], "MODEL '/no/such/model' is neither a folder, a .gguf file nor a named model"),
    # extend
    (["extend", "/no/such/model", "--to", "64"], "MODEL '/no/such/model' is neither a folder, a .gguf file nor a named model"),
    (["extend", "banana-7b", "--to", "64"], "named models: smollm2-135m, gemma3-270m"),
    (["extend", "smollm2-135m", "--to", "1"], "argument --to: must be an int in [2, 1048576], got 1"),
    (["extend", "smollm2-135m", "--to", "64", "--factors", "0"], "argument --factors: must be a positive finite float, got 0"),
    (["extend", "smollm2-135m", "--to", "64", "--out", "FILE"], "argument --out: must be a directory, got"),
    (["rope", "/no/such/config.json"], "/no/such/config.json: no such file"),
    (["rope", "/no/such/config.json", "--length", "1"], "argument --length: must be an int >= 2"),
    # the command itself
    (["banana"], "argument COMMAND: invalid choice: 'banana'"),
    (["--import", "no_such_module_h8", "list"], "--import no_such_module_h8: No module named 'no_such_module_h8'"),
    (["--import", "/no/such/plugin.py", "list"], "--import must be a module name or an existing .py file, got '/no/such/plugin.py' (missing)"),
    (["--import", "a-b", "list"], "--import must be a module name (dotted identifiers) or a path to a .py file, got 'a-b'"),
    (["bench", "--import", "mymod", "--out", "OUT"], "--import must come before the subcommand (posenc --import MODULE bench ...), got it after 'bench'"),
]


@pytest.mark.parametrize("argv, expected", BAD, ids=[" ".join(p.values[0] if hasattr(p, "values") else p[0]) for p in BAD])
def test_bad_option_is_one_line_exit_2(argv, expected, a_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    subst = {"FILE": a_file, "FILE/sub": a_file + "/sub", "OUT": str(out_dir), "OUT_DIR": str(tmp_path)}
    argv = [subst.get(a, a) for a in argv]
    code, lines = run_cli(argv, capsys)
    assert code == 2
    assert len(lines) == 1, lines
    assert expected in lines[0], lines[0]
    assert lines[0].startswith("posenc")
    assert not out_dir.exists()  # a refused command writes nothing


def test_every_subcommand_is_covered():
    """A new subcommand must add its bad options above."""
    from posenc.cli import SUBCOMMANDS

    covered = {p.values[0][0] if hasattr(p, "values") else p[0][0] for p in BAD}
    assert set(SUBCOMMANDS) <= covered


# --------------------------------------------------------------------------- the type functions


@pytest.mark.parametrize(
    "fn, good, bad",
    [
        (cli_args.positive_int, [("1", 1), ("4096", 4096)], ["0", "-1", "1.5", "x", ""]),
        (cli_args.nonnegative_int, [("0", 0), ("7", 7)], ["-1", "nan", "2e3"]),
        (cli_args.even_positive_int, [("2", 2), ("64", 64)], ["0", "7", "-2", "x"]),
        (cli_args.int_at_least(8), [("8", 8), ("9", 9)], ["7", "-8"]),
        (cli_args.positive_float, [("0.5", 0.5), ("1e4", 1e4)], ["0", "-1", "nan", "inf", "x"]),
        (cli_args.nonnegative_float, [("0", 0.0), ("2.5", 2.5)], ["-0.1", "nan", "-inf"]),
    ],
)
def test_number_types(fn, good, bad):
    for raw, value in good:
        assert fn(raw) == value and type(fn(raw)) is type(value)
    assert bad
    for raw in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=f"must be .*, got '?{raw}'?"):
            fn(raw)


def test_device_type():
    assert cli_args.device("cpu") == "cpu"
    for bad in ("banana", "", "cuda:x", "meta"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be one of cpu, cuda, mps"):
            cli_args.device(bad)
    if torch.cuda.is_available():
        assert cli_args.device("cuda") == "cuda"
        with pytest.raises(argparse.ArgumentTypeError, match="CUDA device index must be in"):
            cli_args.device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="CUDA is not available on this machine, got 'cuda:0'"):
            cli_args.device("cuda:0")


def test_path_types(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x")
    assert cli_args.output_dir(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checked, not created
    with pytest.raises(argparse.ArgumentTypeError, match="which is an existing file"):
        cli_args.output_dir(str(f))
    with pytest.raises(argparse.ArgumentTypeError, match="which cannot be created: .* is a file"):
        cli_args.output_dir(str(f / "a" / "b"))
    assert cli_args.output_file(str(tmp_path / "r.json")) == tmp_path / "r.json"
    with pytest.raises(argparse.ArgumentTypeError, match="which is a directory"):
        cli_args.output_file(str(tmp_path))
    assert cli_args.existing_dir(str(tmp_path)) == tmp_path
    with pytest.raises(argparse.ArgumentTypeError, match=r"\(a file\)"):
        cli_args.existing_dir(str(f))
    assert cli_args.existing_path(str(f)) == f
    with pytest.raises(argparse.ArgumentTypeError, match=r"\(missing\)"):
        cli_args.existing_path(str(tmp_path / "nope"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_output_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(argparse.ArgumentTypeError, match="must be a writable directory"):
            cli_args.output_dir(str(ro / "out"))
    finally:
        ro.chmod(0o700)


# --------------------------------------------------------------------------- real processes


def _posenc(*argv: str) -> list[str]:
    """The console script's command line (posenc_entry:main), run by this interpreter."""
    return [sys.executable, "-m", "posenc_entry", *argv]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))


def test_console_script_prints_no_traceback(tmp_path):
    proc = subprocess.run(_posenc("speed", "model", "--lengths", "0"), capture_output=True, text=True,
                          env=_env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == "posenc speed model: error: argument --lengths: must be a positive int, got 0"
    assert "Traceback" not in proc.stderr


# The console script as pip writes it, plus one byte on stdout once the interpreter has started:
# Python's own startup (0.2 s on a loaded 2-core machine) runs no posenc code, so the delays
# below count from the moment the script's first line runs.
_SCRIPT = "import os, sys; os.write(1, b'R'); from posenc_entry import main; sys.argv[0] = 'posenc'; main()"


# `python -m posenc ARGS` as Python runs it (sys.argv[0] is '-m' and sys.orig_argv the command
# line while the package, and torch, are imported before posenc/__main__.py), with the same
# first byte: posenc/__init__.py must put the guard on itself.
_MODULE = ("import os, runpy, sys; os.write(1, b'R'); sys.argv[0] = '-m'; "
           "sys.orig_argv = [sys.executable, '-m', 'posenc', *sys.argv[1:]]; runpy._run_module_as_main('posenc')")
ENTRIES = {"script": ["-c", _SCRIPT], "python -m": ["-c", _MODULE]}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("delay", [0.05, 0.3, 1.0])
def test_ctrl_c_at_any_moment_is_one_line_exit_130(tmp_path, delay, entry):
    """SIGINT while the package and torch are imported, the parser built, or the bench trains,
    through the console script and through python -m posenc."""
    argv = [sys.executable, *ENTRIES[entry], "bench", "--preset", "micro", "--tasks", "copy", "--encodings", "none",
            "--no-progress", "--steps", "100000", "--out", str(tmp_path / "b")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=tmp_path)
    assert proc.stdout.read(1) == b"R"
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    assert proc.returncode == 130, (proc.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("posenc: interrupted"), lines


@pytest.mark.parametrize("entry", [["-c", _SCRIPT], ["-m", "posenc"]], ids=["script", "python -m"])
def test_ctrl_c_while_training_saves_and_says_how_to_resume(tmp_path, entry):
    out = tmp_path / "b"
    argv = [sys.executable, *entry, "bench", "--preset", "micro", "--tasks", "copy", "--encodings", "none",
            "--no-progress", "--steps", "100000", "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=tmp_path)
    run = out / "runs" / "copy" / "none" / "seed0"
    deadline = time.monotonic() + 120
    while not (run / "checkpoint.safetensors").exists():  # training has begun (first save)
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = err.decode().splitlines()
    assert proc.returncode == 130 and len(lines) == 1, lines
    assert lines[0].startswith("posenc: interrupted: stopped after step ")
    assert f"checkpoint: {run / 'checkpoint.safetensors'}; rerun with --resume" in lines[0]
    assert (run / "checkpoint.safetensors").stat().st_size > 0


# ---- consistency across subcommands (issue 14): --version, --json, quiet profiler, example --

import json  # noqa: E402

import posenc  # noqa: E402


def test_version(capsys):
    import tomllib

    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"posenc {posenc.__version__} (torch {torch.__version__})\n"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert posenc.__version__ == project["version"]  # one version, not two that drift


def test_json_means_the_same_everywhere(tmp_path, capsys):
    """--json alone: one JSON document on stdout and no table; --json PATH: the same document
    in the file, and the table on stdout."""
    argv = ["speed", "relative", "--lengths", "8", "--repeat", "1", "--heads", "2", "--head-dim", "8", "--device", "cpu"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # the whole of stdout is the document
    assert [r["length"] for r in doc["results"]] == [8]
    assert "T=8" in captured.err  # progress goes to stderr
    path = tmp_path / "rel.json"
    assert main([*argv, "--json", str(path)]) == 0
    table = capsys.readouterr().out
    assert "T = 8" in table and "plain q·k^T" in table
    again = json.loads(path.read_text())
    assert set(again) == set(doc) and [sorted(r["rows"]) for r in again["results"]] == [sorted(r["rows"]) for r in doc["results"]]
    assert main([*argv, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["heads"] == 2


def test_json_option_type(tmp_path):
    assert cli_args.json_output("-") == "-"
    assert cli_args.json_output(str(tmp_path / "a.json")) == tmp_path / "a.json"
    for bad, msg in [(str(tmp_path / "a.txt"), "must be a path ending in .json"), (str(tmp_path), "which is a directory")]:
        with pytest.raises(argparse.ArgumentTypeError, match=msg):
            cli_args.json_output(bad)


def test_speed_relative_prints_no_profiler_lines(tmp_path):
    """torch's profiler (kineto) logged 2 'USDT: ... profiler_start/stop' lines per memory
    measurement to stderr, 32 per length; the CLI raises KINETO_LOG_LEVEL above them."""
    proc = subprocess.run(_posenc("speed", "relative", "--lengths", "8", "16", "--repeat", "1", "--heads", "2",
                                  "--head-dim", "8", "--device", "cpu"),
                          capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines, "expected the progress lines on stderr"
    assert all(ln.startswith("  T=") for ln in lines), [ln for ln in lines if not ln.startswith("  T=")][:3]


def test_example_takes_encoding_specs(capsys):
    assert main(["example", "rope", "rope:base=5e5", "t5:num_buckets=8", "--length", "3"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["rope", "rope@base=500000.0", "t5@num_buckets=8"]
    assert [r[2] for r in rows] == ["0", "0", str(8 * 4)]  # T5: one learned bias per bucket and head (4 heads)
    assert main(["example", "rope:base=1"]) == 2
    assert capsys.readouterr().out == ""  # refused before printing anything


def test_plugins_entry_point_group_is_loaded(tmp_path):
    """A distribution on sys.path declaring a `posenc.plugins` entry point is imported before
    the subcommands are built (its task is listed); a plugin that fails is one line, exit 2."""
    dist = tmp_path / "h8plug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: h8plug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[posenc.plugins]\nh8 = h8plugin\n")
    (tmp_path / "h8plugin.py").write_text(
        "from posenc.bench.tasks import SEP, Example, Task, register_task\n\n\n"
        "@register_task\nclass Echo(Task):\n    \"\"\"Echo the first token.\"\"\"\n\n    name = \"echo_h8\"\n\n"
        "    def make(self, n, rng):\n        return Example((3,) * n + (SEP,), (3,))\n"
    )
    env = dict(_env(), PYTHONPATH=f"{REPO / 'src'}:{tmp_path}")
    proc = subprocess.run(_posenc("list", "--tasks"), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^echo_h8 +Echo the first token\.  \[h8plugin, min length 1\]$", proc.stdout, re.M), proc.stdout
    (tmp_path / "h8plugin.py").write_text("raise ImportError('missing dependency')\n")
    proc = subprocess.run(_posenc("list"), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "posenc: error: entry point 'h8' (h8plugin) of group 'posenc.plugins' failed to load: ImportError: missing dependency"
    ]


# ---- every number has a stated range (issue 24: --lr 1e308 reached the library, --batch-size 1e9 ran out of memory)


def _numeric_options() -> list[tuple[str, argparse.Action]]:
    """(prog, action) for every option of every subcommand whose type parses numbers."""
    from posenc.cli import all_parsers, build_parser

    found = []
    for parser in all_parsers(build_parser([])):
        for action in parser._actions:
            if action.type is None or action.nargs == 0:
                continue
            for probe in ("1", "2", "8", "64", "0.5"):
                try:
                    value = action.type(probe)
                except (argparse.ArgumentTypeError, ValueError, TypeError):
                    continue
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    found.append((parser.prog, action))
                break
    return found


NUMERIC = _numeric_options()


def test_numeric_options_are_found():
    progs = {prog for prog, _ in NUMERIC}
    assert len(NUMERIC) >= 40 and {"posenc bench", "posenc speed model", "posenc check", "posenc probe"} <= progs


@pytest.mark.parametrize("prog, action", NUMERIC, ids=[f"{p} {a.option_strings[0] if a.option_strings else a.dest}" for p, a in NUMERIC])
def test_every_numeric_option_has_a_bounded_type(prog, action):
    """Its type states a finite closed range (``.bounds``), accepts both ends and refuses a value
    past either with a one-line message."""
    bounds = getattr(action.type, "bounds", None)
    assert bounds is not None, f"{prog} {action.option_strings}: type {action.type.__name__} states no range"
    lo, hi = bounds
    assert math.isfinite(lo) and math.isfinite(hi) and lo <= hi
    is_int = isinstance(hi, int)
    text = str if is_int else repr
    assert action.type(text(hi)) == hi
    if is_int:  # a float's lower end may be open: (0, hi]
        assert action.type(text(lo)) == lo
    for past in ((hi + 1, lo - 1) if is_int else (hi * 2, -1.0)):
        with pytest.raises(argparse.ArgumentTypeError, match=r"^must be .*, got "):
            action.type(text(past))
    with pytest.raises(argparse.ArgumentTypeError):
        action.type("1e308")


def test_check_prints_its_legend_only_when_asked(capsys):
    from posenc.analysis.checks import LEGEND

    assert main(["check", "none"]) == 0
    out = capsys.readouterr().out
    assert LEGEND not in out and "(posenc check --legend explains the columns and symbols)" in out
    assert main(["check", "none", "--legend"]) == 0
    assert LEGEND in capsys.readouterr().out


def test_help_is_plain_text_and_names_real_choices(capsys):
    """No reStructuredText markup in any --help; bench's help names the presets, scalings and
    embeddings from their definitions (a renamed preset cannot linger in the help)."""
    from posenc.bench.evaluate import SCALINGS
    from posenc.bench.settings import EMBEDDINGS, PRESETS
    from posenc.cli import all_parsers, build_parser

    parsers = all_parsers(build_parser([]))
    assert len(parsers) > len(["list", "example", "speed", "check", "plot", "bench", "report", "probe"])
    for parser in parsers:
        text = parser.format_help()
        assert "``" not in text and ":func:" not in text and "::\n" not in text, parser.prog
    bench = next(p for p in parsers if p.prog == "posenc bench").format_help()
    flat = " ".join(bench.split())
    for name in PRESETS:
        if any(PRESETS[name] is PRESETS[other] for other in list(PRESETS)[:list(PRESETS).index(name)]):
            assert f"--preset {name}" not in flat and f"{name}:" not in flat, name  # a second name for a preset
        else:
            assert f"{name}:" in flat, name
    assert ", ".join(SCALINGS) in flat and ", ".join(EMBEDDINGS) in flat
    assert "BenchSettings." not in flat
    # plot: one line per kind, each a whole sentence of its docstring (no parenthesis left open)
    from posenc.analysis.figures import FIGURES

    plot = next(p for p in parsers if p.prog == "posenc plot").description.splitlines()
    kinds = [ln.strip() for ln in plot if ln.strip().split(":")[0] in FIGURES]
    assert len(kinds) == len(FIGURES)
    assert all(k.count("(") == k.count(")") for k in kinds), [k for k in kinds if k.count("(") != k.count(")")]
