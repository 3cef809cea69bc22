"""Docstrings as plain text: what ``--help``, printed tables and figure captions show.

Docstrings are written in reStructuredText (``code``, :func:`name`, "Examples::"); a terminal
or a figure title shows them without that markup.
"""

from __future__ import annotations

import re

__all__ = ["plain", "first_sentence", "one_line"]

# ``code`` and `code`, roles such as :func:`name` (shown as their target, without a leading ~),
# and a paragraph ending in "::".
_ROLE = re.compile(r":[a-z]+:`~?([^`]*)`")
_LITERAL = re.compile(r"``([^`]*)``|`([^`]*)`")


def plain(text: str | None) -> str | None:
    """``text`` with reStructuredText markup removed (see above); None stays None."""
    if text is None:
        return None
    text = _ROLE.sub(lambda m: m.group(1), text)
    text = _LITERAL.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.M)


def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring as plain text: its first paragraph up to the first
    '.', ':' or ';' that ends a word outside parentheses (so "(Men et al.)" stays whole)."""
    para = " ".join((plain(doc) or "").strip().split("\n\n")[0].split())
    depth = 0
    for i, ch in enumerate(para):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch in ".:;" and depth <= 0 and (i + 1 == len(para) or para[i + 1] == " "):
            # an abbreviation's dot ("et al. 2023", "e.g. x") is followed by a lower-case word or a digit
            rest = para[i + 2:i + 3]
            if ch == "." and rest and (rest.islower() or rest.isdigit()):
                continue
            return para[:i]
    return para


def one_line(e: BaseException) -> str:
    """The exception's message on one line (an OSError without one: its strerror and file)."""
    msg = str(e)
    if isinstance(e, OSError) and e.strerror:
        msg = f"{e.strerror}: {e.filename!r}" if e.filename else e.strerror
    return " ".join(msg.split()) or type(e).__name__
