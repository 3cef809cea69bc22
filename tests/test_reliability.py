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
