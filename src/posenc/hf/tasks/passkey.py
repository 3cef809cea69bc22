"""Passkey retrieval in text (Mohtashami & Jaggi 2023, in the text form of LongLoRA's evaluation).

Filler sentences with ``The pass key is 12345. Remember it.`` hidden at a depth, then ``What is
the pass key? The pass key is``; an example is right when greedy decoding gives exactly the
key's tokens. Every prompt is exactly ``length`` tokens of the checkpoint's own tokenizer (or
the byte-level fallback, see :mod:`posenc.hf.checkpoint`), at the lengths ``f * L`` for
``passkey_eval_factors`` and its ``passkey_depths``.
"""

from __future__ import annotations

import random
import sys
from typing import TYPE_CHECKING, Any, Iterator

from ...bench.evaluate import exact_match
from ...bench.tokens import Example
from ...intervals import wilson
from .base import ModelTask, register_model_task

if TYPE_CHECKING:
    from ..bench_settings import ModelBenchSettings
    from ..evaluation import HFCausalLM

__all__ = ["TextPasskey"]

_INTRO = "There is a pass key hidden in this text. Find it and remember it."
_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_KEY = " The pass key is {key}. Remember it. {key} is the pass key."
_QUESTION = " What is the pass key? The pass key is"
_BATCH_TOKENS = 8192  # prompts per batch: about this many tokens (one prompt beyond it)


@register_model_task
class TextPasskey(ModelTask):
    """Passkey retrieval written as text and tokenized by the checkpoint's tokenizer.

    ``length`` is the whole prompt in tokens (BOS, intro, filler with the key sentence at
    ``depth`` of the filler, question); the target is the key's tokens, ``" 12345"`` encoded
    on its own. Keys are 5-digit numbers whose target has the tokenizer's usual length for
    one (so a batch has equal-length targets).
    """

    name = "passkey"
    metric = "accuracy"
    value_label = "passkey accuracy, % (mean over depths)"
    higher_is_better = True
    scale = 100.0
    value_format = "{:.0f} %"
    value_range = (-5.0, 105.0)

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
        self.head = bos + tokenizer.encode(_INTRO)
        self.unit_ids = tokenizer.encode(_FILLER)
        self.question = tokenizer.encode(_QUESTION)
        self.target_len = len(tokenizer.encode(" 12345"))
        longest_key = max(len(tokenizer.encode(_KEY.format(key=k))) for k in ("12345", "99999", "10000"))
        # at least one filler unit besides the fixed parts
        self.min_length = len(self.head) + longest_key + 2 + len(self.question) + len(self.unit_ids)

    def _key(self, rng: random.Random) -> str:
        for _ in range(1000):
            key = str(rng.randrange(10_000, 100_000))
            if len(self.tok.encode(" " + key)) == self.target_len:
                return key
        raise ValueError("the tokenizer encodes no sampled 5-digit key in the usual number of tokens")

    def make(self, n: int, rng: random.Random, depth: float | None = None) -> Example:
        if depth is None:
            depth = rng.random()
        key = self._key(rng)
        key_ids = self.tok.encode(_KEY.format(key=key))
        n_fill = n - len(self.head) - len(key_ids) - len(self.question)
        filler = (self.unit_ids * (n_fill // len(self.unit_ids) + 1))[:n_fill]
        # the key sentence goes between filler sentences: `before` rounded to a whole unit
        before = min(n_fill, round(depth * n_fill / len(self.unit_ids)) * len(self.unit_ids))
        prompt = self.head + filler[:before] + key_ids + filler[before:] + self.question
        assert len(prompt) == n, (len(prompt), n)
        return Example(tuple(prompt), tuple(self.tok.encode(" " + key)))

    def prompt_length(self, length: int) -> int:
        return length

    def target_length(self, length: int) -> int:
        return self.target_len

    # ------------------------------------------------------------------ as a task of bench --model

    def eval_lengths(self, s: ModelBenchSettings) -> list[int]:
        L = self.train_length(s)
        lengths = sorted({round(f * L) for f in s.passkey_eval_factors})
        short = [n for n in lengths if n < self.min_length]
        if short:
            print(f"posenc bench: passkey lengths {short} are shorter than a passkey prompt "
                  f"({self.min_length} tokens): skipped", file=sys.stderr)
        lengths = [n for n in lengths if n >= self.min_length]
        if not lengths:
            raise ValueError(f"every passkey length ({', '.join(str(round(f * L)) for f in s.passkey_eval_factors)}) "
                             f"is shorter than a passkey prompt ({self.min_length} tokens); use --tasks lm")
        return lengths

    def eval_depths(self, s: ModelBenchSettings) -> tuple[float | None, ...]:
        return s.passkey_depths

    def eval_examples(self, s: ModelBenchSettings) -> int:
        return s.passkey_examples

    @staticmethod
    def batch(n: int) -> int:
        """Prompts of ``n`` tokens per batch: about ``_BATCH_TOKENS`` tokens."""
        return max(1, _BATCH_TOKENS // n)

    def cells(self, s: ModelBenchSettings, n: int) -> list[tuple[int, int, int]]:
        b, examples = self.batch(n), self.eval_examples(s)
        return [(n, min(b, examples), 1)] * -(-examples // b) * len(self.eval_depths(s))

    def evaluate_at(self, lm: HFCausalLM, s: ModelBenchSettings, n: int) -> Iterator[tuple[float | None, float]]:
        examples = self.eval_examples(s)
        for d in self.eval_depths(s):
            acc = exact_match(lm, self, n, examples, eval_seed=s.eval_seed, depth=d, batch_size=self.batch(n))
            low, high = wilson(round(acc * examples), examples)
            yield d, acc, {"low": low, "high": high, "count": examples}

    @classmethod
    def title(cls, settings: dict[str, Any]) -> str:
        return (f"passkey accuracy, % (mean of depths {', '.join(f'{d:g}' for d in settings['passkey_depths'])}; "
                f"{settings['passkey_examples']} example(s) per depth)")
