"""Bad inputs and faults, each with the exact error posenc gives for it.

Every area keeps its cases in ``cases_<area>.py`` as a list ``CASES`` of :class:`Case`.
``tests/test_reliability.py`` runs every case and asserts its error; ``generate.py`` runs the
same cases and writes ``docs/reliability.md`` from the messages they actually produce (a test
checks the committed page is current). So the page cannot claim an error the code no longer
gives.

A case is one of three kinds:

* a call that must raise: ``run`` raises ``error`` whose message matches ``match``;
* a CLI call: ``argv`` makes ``posenc`` exit with code 2 and print one line matching ``match``;
* a defined result: ``run`` returns a short string describing the result and ``error`` is None
  (``match`` must match that string), for inputs that are handled rather than refused.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
import re
from dataclasses import dataclass
from typing import Callable, Sequence

__all__ = ["Case", "Outcome", "all_cases", "run_case"]


@dataclass(frozen=True)
class Case:
    area: str
    what: str  # the bad input or fault, as a user would describe it
    match: str  # regex searched in the message (or in the returned description)
    run: Callable[[], object] | None = None
    error: type[BaseException] | tuple[type[BaseException], ...] | None = ValueError
    argv: Sequence[str] | None = None  # a CLI case: posenc <argv> must exit 2 with one line
    # The page's text where the message depends on the machine (an optional package such as
    # triton, a GPU), so that docs/reliability.md is the same everywhere; the message is still
    # run and matched against ``match``.
    doc: str | None = None

    def __post_init__(self) -> None:
        if (self.run is None) == (self.argv is None):
            raise ValueError(f"case {self.what!r}: give exactly one of run or argv")


@dataclass(frozen=True)
class Outcome:
    kind: str  # exception class name, "exit 2" or "result"
    message: str


def run_case(case: Case) -> Outcome:
    """Run one case and return what happened; raise AssertionError if it is not what the case says."""
    if case.argv is not None:
        from posenc.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(list(case.argv))
            except SystemExit as e:  # argparse errors
                code = e.code
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip() and not ln.startswith("usage:")]
        # argparse prints the usage block before its one-line error: keep only the error line.
        lines = [ln for ln in lines if not ln.startswith(" ")]
        assert code == 2, f"{case.what}: exit code {code}, stderr {err.getvalue()!r}"
        assert len(lines) == 1, f"{case.what}: expected one error line, got {lines!r}"
        assert re.search(case.match, lines[0]), f"{case.what}: {lines[0]!r} does not match {case.match!r}"
        return Outcome("exit 2", lines[0])
    assert case.run is not None
    if case.error is None:
        result = str(case.run())
        assert re.search(case.match, result), f"{case.what}: result {result!r} does not match {case.match!r}"
        return Outcome("result", result)
    try:
        case.run()
    except case.error as e:
        msg = str(e)
        assert re.search(case.match, msg), f"{case.what}: {type(e).__name__}({msg!r}) does not match {case.match!r}"
        return Outcome(type(e).__name__, msg)
    raise AssertionError(f"{case.what}: no error raised (expected {case.error})")


def all_cases() -> list[Case]:
    """Every case of every ``cases_*.py`` module in this package, by module name."""
    cases: list[Case] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("cases_"):
            cases.extend(importlib.import_module(f"{__name__}.{info.name}").CASES)
    return cases
