"""RULER's multi-key needle in a haystack (``niah_multikey``; Hsieh et al. 2024, "RULER: What's
the Real Context Size of Your Long-Context Language Models?", NVIDIA/RULER,
scripts/data/synthetic/constants.py for the templates), written as text for a checkpoint.

Several needles ``One of the special magic numbers for KEY is: VALUE.``, with distinct keys and
distinct values, hidden in the passkey's repeated filler (RULER's ``noise`` haystack); the
question asks for one key's number. Distractor needles make it retrieval by key rather than
the recall of the one number in the text that passkey measures.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from ...bench.tokens import Example
from .base import register_model_task
from .needle import NeedleTask

__all__ = ["MultiKeyNeedle"]

_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
          "I will quiz you about the numbers afterwards.")
_NEEDLE = " One of the special magic numbers for {key} is: {value}."
_QUESTION = (" What is the special magic number for {key} mentioned in the provided text?"
             " The special magic number for {key} mentioned in the provided text is")
#: the keys: short common words (RULER draws words too), each a distinct needle's key
KEYS = ("apple", "river", "candle", "garden", "silver", "window", "forest", "pepper", "rocket", "violin",
        "harbor", "marble", "tiger", "basket", "meadow", "lantern")


@register_model_task
class MultiKeyNeedle(NeedleTask):
    """Multi-key needle retrieval (RULER's niah_multikey) in text, 4 needles, 5-digit values.

    ``length`` is the whole prompt in tokens: BOS, RULER's intro, filler with ``NEEDLES``
    needle sentences of distinct keys (from :data:`KEYS`) and distinct 5-digit values, then
    the question for one key. That key's needle is at ``depth`` of the filler; the others at
    depths drawn from the example's rng (needles that round to one filler unit sit side by
    side). The target is the asked value's tokens (``" 12345"``), greedy decoding, exact
    match. Lengths, depths and examples are the passkey settings (``passkey_eval_factors``,
    ``passkey_depths``, ``passkey_examples``). Not run unless named in ``--tasks``.
    """

    name = "multikey"
    intro = _INTRO
    what = "multi-key needle accuracy"
    value_label = "multi-key needle accuracy, % (mean over depths)"
    default = False
    NEEDLES: ClassVar[int] = 4

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        needles = sorted((self.longest(_NEEDLE, key=k) for k in KEYS), reverse=True)[: self.NEEDLES]
        question = max(len(tokenizer.encode(_QUESTION.format(key=k))) for k in KEYS)
        self.min_length = self.fixed_min_length(sum(needles) + question)

    def make(self, n: int, rng: random.Random, depth: float | None = None) -> Example:
        if depth is None:
            depth = rng.random()
        keys = rng.sample(KEYS, self.NEEDLES)
        values = self.values(rng, self.NEEDLES)
        depths = [depth] + [rng.random() for _ in range(self.NEEDLES - 1)]  # the first key is asked
        needles = [(d, self.tok.encode(_NEEDLE.format(key=k, value=v))) for d, k, v in zip(depths, keys, values)]
        prompt = self.layout(n, needles, self.tok.encode(_QUESTION.format(key=keys[0])))
        return Example(prompt, self.answer(values[0]))
