"""Every bad input and fault in tests/reliability gives the error it states, and
docs/reliability.md is the page those errors generate."""

import pytest

from reliability import all_cases, run_case
from reliability.generate import DOC, render

CASES = all_cases()


def test_there_are_cases():
    assert len(CASES) >= 1


@pytest.mark.parametrize("case", CASES, ids=[f"{c.area}: {c.what}" for c in CASES])
def test_case(case):
    run_case(case)


def test_doc_is_current():
    assert DOC.exists(), "run python -m tests.reliability.generate"
    assert DOC.read_text() == render(), "docs/reliability.md is out of date: run python -m tests.reliability.generate"


def test_doc_does_not_depend_on_optional_packages(monkeypatch):
    """The page is the same whether triton is installed or not (a case whose message depends
    on the machine gives the page's text in ``Case.doc``), so test_doc_is_current holds on every
    machine; the CUDA cases state both machines' messages the same way."""
    import posenc.rotary.functional as functional

    pages = []
    for available in (True, False):
        monkeypatch.setattr(functional, "triton_available", lambda available=available: available)
        pages.append(render())
    assert pages[0] == pages[1]
