"""argparse ``type=`` functions: every CLI option is checked when it is parsed.

Every numeric type states its closed range in ``.bounds`` (``MAX_INT``, ``MAX_FLOAT`` unless a
smaller one is given), so no number reaches the library unbounded (``--lr 1e308``).

A bad value raises :class:`argparse.ArgumentTypeError`, so argparse prints the usage and one
line that names the option, what is allowed and what was received, then exits with code 2::

    posenc speed model: error: argument --lengths: must be a positive int, got 0

Example::

    p.add_argument("--lengths", nargs="+", type=positive_int)
    p.add_argument("--head-dim", type=even_positive_int)
    p.add_argument("--device", type=device, default=default_device())
    p.add_argument("--out", type=output_dir)

Only ``device`` imports torch (lazily), so ``posenc --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_FLOAT",
    "MAX_INT",
    "MAX_THREADS",
    "MAX_TOKENS",
    "positive_int",
    "nonnegative_int",
    "even_positive_int",
    "int_at_least",
    "int_in",
    "positive_float",
    "float_in",
    "nonnegative_float",
    "unit_float",
    "device",
    "default_device",
    "output_dir",
    "output_file",
    "existing_dir",
    "existing_path",
    "json_output",
    "add_json_option",
    "emit_json",
]


# The largest count any option takes unless it states a smaller bound: int32 indexing, and far
# beyond any size that fits in memory (sizes that allocate are checked against memory as well).
MAX_INT = 2**31 - 1
# The largest float unless an option states a smaller bound (factors, bases: 1e6 is far past use).
MAX_FLOAT = 1e6
# --threads of every subcommand: torch.set_num_threads past the cores of any machine is a typo.
MAX_THREADS = 4096
# Tokens a real model reads in one sequence (probe --tokens, extend --to): 2^20, 8x Llama 3.1's 128K.
MAX_TOKENS = 2**20


def _int(value: str, what: str) -> int:
    try:
        return int(value, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {what}, got {value!r}") from None


def _bounded_int(value: str, what: str, minimum: int, maximum: int = MAX_INT) -> int:
    """``value`` parsed as an int in [minimum, maximum]; the error says ``must be {what}`` (and
    the maximum, unless ``what`` states the range)."""
    n = _int(value, what)
    if n < minimum:
        raise argparse.ArgumentTypeError(f"must be {what}, got {n}")
    if n > maximum:
        top = "" if what.endswith(f"{maximum}]") else f" at most {maximum}"
        raise argparse.ArgumentTypeError(f"must be {what}{top}, got {n}")
    return n


def _typed(parse, bounds: tuple[float, float]):
    """Mark a type function with the closed range it accepts (``parse.bounds``), which
    tests/test_cli_errors.py reads to check that every numeric option has one."""
    parse.bounds = bounds
    return parse


def int_in(minimum: int, maximum: int, what: str | None = None):
    """A type function accepting ints in [minimum, maximum]."""
    what = what or f"an int in [{minimum}, {maximum}]"

    def parse(value: str) -> int:
        return _bounded_int(value, what, minimum, maximum)

    parse.__name__ = f"int_in_{minimum}_{maximum}"
    return _typed(parse, (minimum, maximum))


def positive_int(value: str) -> int:
    """An int in [1, MAX_INT] (lengths, batch sizes, repeats, steps)."""
    return _bounded_int(value, "a positive int", 1)


def nonnegative_int(value: str) -> int:
    """An int in [0, MAX_INT] (counts where zero means "none")."""
    return _bounded_int(value, "a non-negative int", 0)


def even_positive_int(value: str) -> int:
    """An even int in [2, MAX_INT - 1] (head dims that RoPE rotates in pairs)."""
    n = _bounded_int(value, "an even positive int", 2, MAX_INT - 1)
    if n % 2:
        raise argparse.ArgumentTypeError(f"must be an even positive int, got {n}")
    return n


def int_at_least(minimum: int, maximum: int = MAX_INT):
    """A type function accepting ints in [minimum, maximum] (e.g. lengths a task needs at least 2 of)."""

    def parse(value: str) -> int:
        return _bounded_int(value, f"an int >= {minimum}", minimum, maximum)

    parse.__name__ = f"int_at_least_{minimum}"
    return _typed(parse, (minimum, maximum))


def _bounded_float(value: str, what: str, *, strict: bool, maximum: float = MAX_FLOAT) -> float:
    """A finite float in (0, maximum] (``strict``) or [0, maximum]; the error says ``must be {what}``."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {what}, got {value!r}") from None
    if not math.isfinite(x):  # float() accepts "nan" and "inf"
        raise argparse.ArgumentTypeError(f"must be {what}, got {value!r}")
    if x < 0 or (strict and x == 0):
        raise argparse.ArgumentTypeError(f"must be {what}, got {x:g}")
    if x > maximum:
        raise argparse.ArgumentTypeError(f"must be {what} at most {maximum:g}, got {x:g}")
    return x


def positive_float(value: str) -> float:
    """A finite float in (0, MAX_FLOAT]."""
    return _bounded_float(value, "a positive finite float", strict=True)


def nonnegative_float(value: str) -> float:
    """A finite float in [0, MAX_FLOAT]."""
    return _bounded_float(value, "a non-negative finite float", strict=False)


def float_in(minimum: float, maximum: float, *, strict: bool = True):
    """A type function accepting floats in (minimum, maximum] (``strict``, minimum 0 only) or
    [minimum, maximum]."""
    if minimum != 0 and strict:
        raise ValueError(f"float_in: strict (an open lower end) is only for minimum 0, got minimum {minimum:g}")
    what = f"a float in {'(' if strict else '['}{minimum:g}, {maximum:g}]"

    def parse(value: str) -> float:
        x = _bounded_float(value, what, strict=strict, maximum=math.inf)
        if x < minimum or x > maximum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {x:g}")
        return x

    parse.__name__ = f"float_in_{minimum:g}_{maximum:g}"
    return _typed(parse, (float(minimum), float(maximum)))


def unit_float(value: str) -> float:
    """A float in [0, 1] (fractions: depths, proportions)."""
    x = _bounded_float(value, "a float in [0, 1]", strict=False)
    if x > 1:
        raise argparse.ArgumentTypeError(f"must be a float in [0, 1], got {x:g}")
    return x


_typed(positive_int, (1, MAX_INT))
_typed(nonnegative_int, (0, MAX_INT))
_typed(even_positive_int, (2, MAX_INT - 1))
_typed(positive_float, (0.0, MAX_FLOAT))
_typed(nonnegative_float, (0.0, MAX_FLOAT))
_typed(unit_float, (0.0, 1.0))


_DEVICE_TYPES = ("cpu", "cuda", "mps")


def default_device() -> str:
    """``"cuda"`` when CUDA is available, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device(value: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N`` or ``mps``, refused when this machine lacks it.

    Checked here so that ``--device cuda`` on a CPU-only machine is one line at parse time, not
    a CUDA initialisation traceback minutes into a run.
    """
    import torch

    try:
        dev = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type not in _DEVICE_TYPES:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(_DEVICE_TYPES)} (or cuda:N), got {value!r}"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"CUDA is not available on this machine, got {value!r}; use --device cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise argparse.ArgumentTypeError(
                f"CUDA device index must be in [0, {count - 1}] on this machine, got {value!r}"
            )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"MPS is not available on this machine, got {value!r}; use --device cpu")
    return str(dev)


def output_dir(value: str) -> Path:
    """A directory to write into: existing, or creatable (no file in its way, parent writable).

    Nothing is created here; the command creates it when it starts writing.
    """
    if not value:
        raise argparse.ArgumentTypeError("must be a directory path, got ''")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"must be a directory, got {value!r}, which is an existing file")
    # The nearest existing ancestor must be a writable directory: a file there ("out.txt/run")
    # would make mkdir fail later with an unrelated NotADirectoryError.
    probe = path.absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise argparse.ArgumentTypeError(
            f"must be a directory path, got {value!r}, which cannot be created: {str(probe)!r} is a file"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"must be a writable directory, got {value!r} ({str(probe)!r} is not writable)")
    return path


def output_file(value: str) -> Path:
    """A file to write: not a directory, in a directory that exists or can be created."""
    if not value:
        raise argparse.ArgumentTypeError("must be a file path, got ''")
    path = Path(value).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"must be a file path, got {value!r}, which is a directory")
    output_dir(str(path.parent))  # no file in the way of its folder, folder writable
    return path


def existing_dir(value: str) -> Path:
    """An existing directory (to read from)."""
    path = Path(value).expanduser()
    if not path.is_dir():
        state = "a file" if path.exists() else "missing"
        raise argparse.ArgumentTypeError(f"must be an existing directory, got {value!r}, which is not a directory ({state})")
    return path


def existing_path(value: str) -> Path:
    """An existing file or directory (to read from)."""
    path = Path(value).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"must be an existing file or directory, got {value!r} (missing)")
    return path


# --json: one meaning in every subcommand. `--json PATH` writes the results to PATH as JSON and
# still prints the table; `--json` alone (or `--json -`) prints the JSON to stdout *instead* of
# the table, so `posenc ... --json > out.json` is one JSON document. Strict JSON: NaN and
# infinities are refused (allow_nan=False), not written as the invalid tokens NaN/Infinity.
STDOUT = "-"


def json_output(value: str) -> Path | str:
    """``-`` (stdout) or a ``.json`` file path to write (see :func:`output_file`).

    The suffix is required so that ``--json NAME`` cannot silently swallow a positional
    argument that follows it (``posenc check --json rope`` would write a file named rope).
    """
    if value == STDOUT:
        return STDOUT
    path = output_file(value)
    if path.suffix != ".json":
        raise argparse.ArgumentTypeError(
            f"must be a path ending in .json, or '-' for stdout, got {value!r} "
            "(to print JSON, put --json last or after the other arguments)"
        )
    return path


def add_json_option(parser: argparse.ArgumentParser, what: str = "the results") -> None:
    """Add ``--json [PATH]`` with the shared meaning (see :func:`emit_json`)."""
    parser.add_argument(
        "--json", nargs="?", const=STDOUT, default=None, type=json_output, metavar="PATH",
        help=f"write {what} as JSON: to PATH (a .json file; the table is still printed), or, with no PATH "
             "or '-', to stdout in place of the table",
    )


def emit_json(target: Path | str | None, data: Any) -> bool:
    """Write ``data`` where ``--json`` said; True when it went to stdout (print no table then)."""
    if target is None:
        return False
    try:
        text = json.dumps(data, indent=2, allow_nan=False)
    except ValueError as e:  # NaN or inf: strict JSON has no spelling for them
        raise ValueError(f"--json: {e}; the results hold NaN or infinity, which strict JSON cannot write") from None
    if target == STDOUT:
        sys.stdout.write(text + "\n")
        return True
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target, then renamed over it: a reader, an interrupted run or a second
    # process writing the same file never leaves (or sees) half of one file and half of another.
    # (A unique name opened with "x", not mkstemp: the file keeps the umask's permissions.)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return False
