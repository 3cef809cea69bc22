"""RULER's variable tracking (``vt``; Hsieh et al. 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?", NVIDIA/RULER, scripts/data/synthetic/variable_tracking.py),
in a form with one exact answer, written as text for a checkpoint.

RULER hides a chain ``VAR X1 = 12345``, ``VAR X2 = X1``, ... in filler and asks for every
variable holding the number (an answer scored by recall). Here the question goes the other
way, so greedy decoding has one exact answer: the value of the chain's last variable, which
only following every hop reaches. A second chain with another value is the distractor.
"""

from __future__ import annotations

import random
import string
from typing import Any, ClassVar

from ...bench.tokens import Example
from .base import register_model_task
from .needle import NeedleTask

__all__ = ["VariableTracking"]

_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text."
_FIRST = " VAR {name} = {value}."
_HOP = " VAR {name} = VAR {source}."
_QUESTION = " Question: What is the value of VAR {name}? Answer: The value of VAR {name} is"
_WIDE_NAMES = ("QZXJV", "XJQZK", "VKXQJ")  # rare letters: about the most tokens a 5-letter name takes


@register_model_task
class VariableTracking(NeedleTask):
    """Variable tracking (RULER's vt) in text: a chain of ``HOPS`` hops, a distractor chain, 5-digit values.

    ``length`` is the whole prompt in tokens: BOS, RULER's intro, filler with two chains of
    assignments (``VAR QPZKM = 12345.``, then ``VAR BXWTA = VAR QPZKM.`` for each hop), then
    the question for the last variable of the first chain. Names are 5 upper-case letters
    (as RULER's), all distinct; the two chains hold distinct values. The first chain's first
    assignment is at ``depth`` of the filler and its hops at depths drawn after it; the
    distractor chain's assignments at depths drawn anywhere, in chain order. The target is the
    value's tokens (``" 12345"``), greedy decoding, exact match. Lengths, depths and examples
    are the passkey settings (``passkey_eval_factors``, ``passkey_depths``,
    ``passkey_examples``). Not run unless named in ``--tasks``.
    """

    name = "vartrack"
    intro = _INTRO
    what = "variable tracking accuracy"
    value_label = "variable tracking accuracy, % (mean over depths)"
    default = False
    HOPS: ClassVar[int] = 4
    CHAINS: ClassVar[int] = 2  # the asked chain and one distractor

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        w = max(_WIDE_NAMES, key=lambda name: len(tokenizer.encode(" " + name)))
        self.name_tokens = len(tokenizer.encode(" " + w))
        chain = self.longest(_FIRST, name=w) + self.HOPS * len(tokenizer.encode(_HOP.format(name=w, source=w)))
        self.min_length = self.fixed_min_length(self.CHAINS * chain + len(tokenizer.encode(_QUESTION.format(name=w))))

    def _names(self, rng: random.Random, k: int) -> list[str]:
        """``k`` distinct 5-letter names, none encoded longer than the widest (so prompts fit min_length)."""
        names: list[str] = []
        for _ in range(1000 * k):
            name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
            if name not in names and len(self.tok.encode(" " + name)) <= self.name_tokens:
                names.append(name)
                if len(names) == k:
                    return names
        raise ValueError(f"the tokenizer encodes too few sampled 5-letter names in at most {self.name_tokens} tokens")

    def make(self, n: int, rng: random.Random, depth: float | None = None) -> Example:
        if depth is None:
            depth = rng.random()
        size = self.HOPS + 1
        names = self._names(rng, self.CHAINS * size)
        values = self.values(rng, self.CHAINS)
        needles = []
        for c in range(self.CHAINS):
            chain = names[c * size:(c + 1) * size]
            if c == 0:  # the asked chain: its first assignment at the depth, the hops after it
                depths = [depth] + sorted(depth + (1 - depth) * rng.random() for _ in range(self.HOPS))
            else:
                depths = sorted(rng.random() for _ in range(size))
            needles.append((depths[0], self.tok.encode(_FIRST.format(name=chain[0], value=values[c]))))
            needles += [(d, self.tok.encode(_HOP.format(name=chain[i + 1], source=chain[i])))
                        for i, d in enumerate(depths[1:])]
        prompt = self.layout(n, needles, self.tok.encode(_QUESTION.format(name=names[self.HOPS])))
        return Example(prompt, self.answer(values[0]))
