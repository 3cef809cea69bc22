"""posenc.text: docstrings as plain text, exceptions as one line."""

from __future__ import annotations

import pytest

from posenc.text import first_sentence, one_line, plain


@pytest.mark.parametrize("text, want", [
    (None, None),
    ("see :func:`~posenc.build` and :mod:`posenc.variants`", "see posenc.build and posenc.variants"),
    ("``--json PATH`` or `x`", "--json PATH or x"),
    ("Examples::\n\n    posenc list", "Examples:\n\n    posenc list"),
    ("a :: b", "a :: b"),  # only a paragraph's closing "::"
])
def test_plain(text, want):
    assert plain(text) == want


@pytest.mark.parametrize("doc, want", [
    ("RoPE (Su et al. 2021). More.", "RoPE (Su et al. 2021)"),
    ("ALiBi, e.g. in BLOOM: a bias.", "ALiBi, e.g. in BLOOM"),
    ("One ``code`` line; then more", "One code line"),
    ("First paragraph\nwrapped.\n\nSecond.", "First paragraph wrapped"),
    ("no full stop", "no full stop"),
    (None, ""),
])
def test_first_sentence(doc, want):
    assert first_sentence(doc) == want


def test_one_line():
    assert one_line(ValueError("a\n  b\tc")) == "a b c"
    assert one_line(ValueError()) == "ValueError"
    assert one_line(FileNotFoundError(2, "No such file or directory", "x.json")) == "No such file or directory: 'x.json'"
    assert one_line(OSError(28, "No space left on device")) == "No space left on device"
