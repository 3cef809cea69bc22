"""The default corpus and its record: a damaged pinned snapshot, a results file whose corpus
record is malformed, and two tables made on other text compared."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
from pathlib import Path
from typing import Iterator

from . import Case

A = "corpus"
_COMMITTED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "bench_quick.json"


@contextlib.contextmanager
def _snapshot(**changes: object) -> Iterator[None]:
    from posenc.bench import data

    kept = data.STDLIB_SNAPSHOT
    data.STDLIB_SNAPSHOT = dataclasses.replace(kept, **changes)
    try:
        yield
    finally:
        data.STDLIB_SNAPSHOT = kept


def _tampered() -> object:
    from posenc.bench.data import load_corpus

    with _snapshot(sha256="0" * 64):
        return load_corpus(None, max_bytes=100)


def _missing() -> object:
    from posenc.bench.data import load_corpus

    with _snapshot(file="gone.xz"):
        return load_corpus(None, max_bytes=100)


def _bad_record() -> object:
    from posenc.results import check_results, read_results

    results = read_results(_COMMITTED)
    results["corpus"] = dict(source="stdlib", sha256="abc", train_bytes=1, val_bytes=1)
    return check_results(results, "results.json")


def _other_text() -> object:
    from posenc.bench.compare import compare_results, format_comparison
    from posenc.results import read_results

    committed = read_results(_COMMITTED)
    fresh = copy.deepcopy(committed)
    for results, text in ((fresh, b"Python 3.13"), (committed, b"Python 3.11")):
        results["corpus"] = dict(source=text.decode(), sha256=hashlib.sha256(text).hexdigest(), train_bytes=8,
                                 val_bytes=3)
    return format_comparison(compare_results(fresh, committed)).splitlines()[0]


CASES = [
    Case(A, "the pinned default corpus edited (its sha256 differs)",
         r"the pinned default corpus .*stdlib-3\.11\.7\.xz holds 5,242,970 bytes with sha256 4f089d345251\.\.\., "
         r"expected 5,242,970 with 000000000000\.\.\.; reinstall posenc", run=_tampered,
         doc="the pinned default corpus .../posenc/bench/stdlib/stdlib-3.11.7.xz holds 5,242,970 bytes with sha256 "
             "4f089d345251..., expected 5,242,970 with 000000000000...; reinstall posenc"),
    Case(A, "the pinned default corpus missing from the install",
         r"the pinned default corpus .*gone\.xz is missing; reinstall posenc, or give a corpus with --data",
         run=_missing, error=FileNotFoundError,
         doc="the pinned default corpus .../posenc/bench/stdlib/gone.xz is missing; reinstall posenc, or give a "
             "corpus with --data"),
    Case(A, "a results file whose corpus sha256 is not 64 hex digits",
         r"results.json: corpus sha256 must be 64 lowercase hex digits, got 'abc'", run=_bad_record),
    Case(A, "two tables made on other text compared (another Python's standard library)",
         r"^different corpus: Python 3\.13 \(sha256 .*\) \(committed table: Python 3\.11 \(sha256 .*\)\)$",
         run=_other_text, error=None),
]
