"""Passkey retrieval in text (Mohtashami & Jaggi 2023, in the text form of LongLoRA's evaluation).

Filler sentences with ``The pass key is 12345. Remember it.`` hidden at a depth, then ``What is
the pass key? The pass key is``; an example is right when greedy decoding gives exactly the
key's tokens. Every prompt is exactly ``length`` tokens of the checkpoint's own tokenizer (or
the byte-level fallback, see :mod:`posenc.hf.checkpoint`), at the lengths ``f * L`` for
``passkey_eval_factors`` and its ``passkey_depths`` (:class:`~posenc.hf.tasks.needle.NeedleTask`).
"""

from __future__ import annotations

import random
from typing import Any

from ...bench.tokens import Example
from .base import register_model_task
from .needle import NeedleTask

__all__ = ["TextPasskey"]

_KEY = " The pass key is {value}. Remember it. {value} is the pass key."
_QUESTION = " What is the pass key? The pass key is"


@register_model_task
class TextPasskey(NeedleTask):
    """Passkey retrieval written as text and tokenized by the checkpoint's tokenizer.

    ``length`` is the whole prompt in tokens (BOS, intro, filler with the key sentence at
    ``depth`` of the filler, question); the target is the key's tokens, ``" 12345"`` encoded
    on its own. Keys are 5-digit numbers whose target has the tokenizer's usual length for
    one (so a batch has equal-length targets).
    """

    name = "passkey"
    intro = "There is a pass key hidden in this text. Find it and remember it."
    what = "passkey accuracy"
    value_label = "passkey accuracy, % (mean over depths)"

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self.question = tokenizer.encode(_QUESTION)
        # at least one filler unit besides the fixed parts
        self.min_length = self.fixed_min_length(self.longest(_KEY) + len(self.question))

    def make(self, n: int, rng: random.Random, depth: float | None = None) -> Example:
        if depth is None:
            depth = rng.random()
        key = self.value(rng)
        return Example(self.layout(n, [(depth, self.tok.encode(_KEY.format(value=key)))], self.question),
                       self.answer(key))
