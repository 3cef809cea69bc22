"""Two tasks after CoPE's (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count
What's Important", section 4): problems whose answer depends on counting some tokens and not
others, where a position that counts every token is the wrong unit.

============== ===================================== ======================================
task           prompt (size n)                       target
============== ===================================== ======================================
selective_copy n digits and n blanks, mixed, SEP     the n digits in order
count          bits x_1 .. x_n SEP                   the number of ones: two digits,
                                                     least-significant first
============== ===================================== ======================================

``selective_copy`` is the selective copying task of Gu & Dao (2023) that CoPE's section 4.2
uses: the digits sit at random places among blanks (``FILLER[0]``), so the i-th digit to write
is the i-th non-blank token, not the token at any fixed offset. ``count`` counts the ones among
bits, the full count where ``parity`` keeps it mod 2 (CoPE's section 4.3 counts the increments of
a variable: here, of the tokens ``1``). The answer always has two digits, so a size beyond the
training length asks for no digit the model never wrote; sizes are at most 99.

Both are example tasks (:class:`~posenc.bench.tasks.Task`): trained on sizes ``1..L``, tested on
``1..2L`` by greedy exact match.
"""

from __future__ import annotations

import random
from typing import Any

from .tasks import Task, register_task
from .tokens import DIGITS, FILLER, SEP, Example

__all__ = ["BLANK", "COUNT_DIGITS", "Count", "SelectiveCopy"]

BLANK = FILLER[0]
COUNT_DIGITS = 2  # the count's digits: sizes up to 10**2 - 1


@register_task
class SelectiveCopy(Task):
    """Copy the digits, skipping the blanks between them (n digits among n blanks)."""

    name = "selective_copy"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice(DIGITS) for _ in range(n))
        blanks = set(rng.sample(range(2 * n), n))  # the places of the n blanks among 2n tokens
        digits = iter(x)
        prompt = tuple(BLANK if i in blanks else next(digits) for i in range(2 * n))
        return Example(prompt + (SEP,), x)

    def prompt_length(self, length: int) -> int:
        return 2 * length + 1


@register_task
class Count(Task):
    """The number of ones among n bits, in two digits (least-significant first)."""

    name = "count"

    def make(self, n: int, rng: random.Random) -> Example:
        if n >= 10**COUNT_DIGITS:
            raise ValueError(f"count writes {COUNT_DIGITS} digits: size must be < {10**COUNT_DIGITS}, got {n}")
        x = tuple(rng.choice((0, 1)) for _ in range(n))
        ones = sum(x)
        return Example(x + (SEP,), tuple(ones // 10**i % 10 for i in range(COUNT_DIGITS)))

    def target_length(self, length: int) -> int:
        return COUNT_DIGITS

    def check_settings(self, s: Any) -> None:
        """Sizes up to 2L must have a two-digit count."""
        super().check_settings(s)
        if 2 * s.synthetic_length >= 10**COUNT_DIGITS:
            raise ValueError(f"synthetic_length must be < {10**COUNT_DIGITS // 2} for task {self.name!r} (its "
                             f"count has {COUNT_DIGITS} digits and is tested up to 2L), got {s.synthetic_length}")
