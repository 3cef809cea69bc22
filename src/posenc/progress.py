"""Progress of long loops: a bar on a terminal, one line per finished unit in a log.

Example::

    from posenc.progress import bar

    with bar(total=500, desc="copy/rope/seed0", unit="step", enabled=not args.quiet) as b:
        for step in range(500):
            ...
            b.update()
            b.set_postfix(loss=f"{loss:.4f}")

Where stderr is a terminal and tqdm is installed (``posenc[bench]``), this is a tqdm bar that
disappears when done. Anywhere else (a log file, a pipe, ``make demo``'s background half, or
no tqdm) nothing is written while the loop runs, and one line when it ends::

    copy/rope/seed0: 500/500 step in 41.2 s (loss=0.0123, tok_s=10,532)

A bar closed before its total (an interrupted run) says ``stopped at 123/500``. ``enabled=False``
writes nothing at all (``--quiet``). ``write(line)`` prints a line above a tqdm bar (through
``tqdm.write``) or, in the log form, at once.

:class:`Eta` refines a time estimate from the units already run: seconds per unit of work (FLOPs,
from ``posenc.hf.cost.forward_flops``) measured on the finished ones, times the work left::

    eta = Eta(total=sum(flops), prior_seconds=estimate)
    for cell in cells:
        t0 = time.perf_counter(); run(cell)
        eta.done(cell.flops, time.perf_counter() - t0)
        print(f"...; ETA {format_minutes(eta.remaining_seconds())}")
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

__all__ = ["bar", "Bar", "Eta", "format_minutes", "on_terminal"]


def on_terminal(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default stderr) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


class Bar:
    """The log form: counts quietly, writes one line on :meth:`close`. (The terminal form is tqdm's.)"""

    def __init__(self, total: int | None, desc: str, unit: str, initial: int, enabled: bool, stream: IO[str]):
        self.total, self.desc, self.unit = total, desc, unit
        self.n = initial
        self._initial = initial
        self.enabled = enabled
        self._stream = stream
        self._postfix: dict[str, Any] = {}
        self._t0 = time.perf_counter()
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **values: Any) -> None:
        self._postfix = values

    def write(self, line: str, file: IO[str] | None = None) -> None:
        """Print ``line`` now, to ``file`` (default: the bar's stream); tqdm's ``write`` prints it
        above its bar."""
        if self.enabled:
            print(line, file=self._stream if file is None else file, flush=True)

    def line(self) -> str:
        """The line :meth:`close` writes."""
        seconds = time.perf_counter() - self._t0
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        if self.total is not None and self.n < self.total:
            count = f"stopped at {count}"
        resumed = f" (from {self._initial})" if self._initial else ""
        post = ", ".join(f"{k}={v}" for k, v in self._postfix.items())
        return f"{self.desc}: {count} {self.unit}{resumed} in {seconds:.1f} s" + (f" ({post})" if post else "")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.enabled:
            print(self.line(), file=self._stream, flush=True)

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Eta:
    """Time left for ``total`` units of work (FLOPs, tokens: any additive measure of cost), refined
    from the units done: the measured seconds per unit over everything finished so far, times the
    units left. Before the first unit is done it returns ``prior_seconds`` scaled to the work left
    (the up-front estimate), or None without one."""

    def __init__(self, total: float, prior_seconds: float | None = None):
        from .config import check_range

        check_range("total", total, 0.0)
        if prior_seconds is not None:
            check_range("prior_seconds", prior_seconds, 0.0)
        self.total = float(total)
        self.prior_seconds = prior_seconds
        self.work = 0.0
        self.seconds = 0.0

    def done(self, work: float, seconds: float) -> None:
        """Record a finished unit: ``work`` units of cost that took ``seconds``."""
        from .config import check_range

        check_range("work", work, 0.0)
        check_range("seconds", seconds, 0.0)
        self.work += work
        self.seconds += seconds

    def remaining_seconds(self) -> float | None:
        """Seconds left at the measured rate (the prior's rate before any measurement; None: no rate)."""
        left = max(self.total - self.work, 0.0)
        if self.work > 0:
            return left * self.seconds / self.work
        if self.prior_seconds is None:
            return None
        return self.prior_seconds * (left / self.total) if self.total else 0.0


def format_minutes(seconds: float | None) -> str:
    """``6.2 min`` (``?`` when unknown)."""
    return "?" if seconds is None else f"{seconds / 60:.1f} min"


def bar(total: int | None = None, desc: str = "", *, unit: str = "it", initial: int = 0, enabled: bool = True,
        stream: IO[str] | None = None) -> Any:
    """A progress bar for ``total`` units (see the module docstring for where it writes).

    Returns an object with ``update(n=1)``, ``set_postfix(**values)``, ``close()``, usable as a
    context manager: a ``tqdm`` on a terminal, else a :class:`Bar`.
    """
    stream = sys.stderr if stream is None else stream
    if enabled and on_terminal(stream):
        try:
            from tqdm.auto import tqdm
        except ImportError:  # posenc[bench] not installed: the log form, which needs nothing
            pass
        else:
            return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=False, file=stream)
    return Bar(total, desc, unit, initial, enabled, stream)
