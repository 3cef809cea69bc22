"""What the needle-in-filler tasks share: sentences hidden in repeated filler at depths, a
question, and exact match of a number's tokens by greedy decoding.

A :class:`NeedleTask` writes its prompt as text tokenized by the checkpoint's tokenizer:
BOS, the task's ``intro``, the filler sentences with its needle sentences inserted between
whole filler units, then its question; the prompt is exactly ``n`` tokens (the filler takes
what the rest leaves). Answers are 5-digit numbers whose encoding (``" 12345"``) has the
tokenizer's usual length, so every target of a batch has the same length. The lengths,
depths and example counts are the passkey settings (``passkey_eval_factors``,
``passkey_depths``, ``passkey_examples``), and examples are drawn by
:func:`posenc.bench.evaluate.exact_match` from :func:`posenc.bench.data.example_rng` seeds,
the same problems for every row.
"""

from __future__ import annotations

import random
import sys
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Sequence

from ...bench.evaluate import exact_match
from ...intervals import wilson
from .base import ModelTask

if TYPE_CHECKING:
    from ..bench_settings import ModelBenchSettings
    from ..evaluation import HFCausalLM

__all__ = ["NeedleTask"]

_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_BATCH_TOKENS = 8192  # prompts per batch: about this many tokens (one prompt beyond it)
_SAMPLE_VALUES = ("12345", "99999", "10000")  # for the longest encoding of a sentence holding a value


class NeedleTask(ModelTask):
    """A task whose prompt is needles in filler and whose answer is one 5-digit number.

    A subclass sets ``intro``, ``what`` (its accuracy in words, for titles) and ``value_label``,
    and writes ``make`` with
    :meth:`value` / :meth:`values` and :meth:`layout`; it sets ``self.min_length`` with
    :meth:`fixed_min_length`.
    """

    intro: ClassVar[str] = ""
    what: ClassVar[str] = "accuracy"
    metric = "accuracy"
    higher_is_better = True
    scale = 100.0
    value_format = "{:.0f} %"
    value_range = (-5.0, 105.0)

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
        self.head = bos + tokenizer.encode(self.intro)
        self.unit_ids = tokenizer.encode(_FILLER)
        self.target_len = len(tokenizer.encode(" 12345"))

    def longest(self, template: str, **fields: str) -> int:
        """Tokens of ``template`` with ``value`` filled by the longest of a few 5-digit numbers."""
        return max(len(self.tok.encode(template.format(value=v, **fields))) for v in _SAMPLE_VALUES)

    def fixed_min_length(self, fixed: int) -> int:
        """The shortest prompt: the head, ``fixed`` tokens of needles and question, 2 tokens of
        slack (a number may encode longer in context) and one filler unit."""
        return len(self.head) + fixed + 2 + len(self.unit_ids)

    def value(self, rng: random.Random) -> str:
        """A 5-digit number whose answer ``" " + value`` has the usual number of tokens."""
        for _ in range(1000):
            v = str(rng.randrange(10_000, 100_000))
            if len(self.tok.encode(" " + v)) == self.target_len:
                return v
        raise ValueError("the tokenizer encodes no sampled 5-digit number in the usual number of tokens")

    def values(self, rng: random.Random, k: int) -> list[str]:
        """``k`` distinct numbers of :meth:`value`."""
        out: list[str] = []
        while len(out) < k:
            v = self.value(rng)
            if v not in out:
                out.append(v)
        return out

    def answer(self, value: str) -> tuple[int, ...]:
        """The target: the number's tokens as the answer's continuation."""
        return tuple(self.tok.encode(" " + value))

    def layout(self, n: int, needles: Sequence[tuple[float, list[int]]], question: list[int]) -> tuple[int, ...]:
        """The prompt of exactly ``n`` tokens: head, filler with each needle ``(depth, ids)``
        inserted at ``depth`` of the filler (rounded to a whole filler unit; needles at one
        point keep their given order), question."""
        n_fill = n - len(self.head) - sum(len(ids) for _, ids in needles) - len(question)
        if n_fill < 0:
            raise ValueError(f"length {n} is shorter than this {self.name} prompt's needles and question "
                             f"({n - n_fill} tokens); the task's min_length is {self.min_length}")
        u = len(self.unit_ids)
        filler = (self.unit_ids * (n_fill // u + 1))[:n_fill]
        cuts = sorted(((min(n_fill, round(d * n_fill / u) * u), i) for i, (d, _) in enumerate(needles)))
        prompt, at = list(self.head), 0
        for cut, i in cuts:
            prompt += filler[at:cut] + needles[i][1]
            at = cut
        prompt += filler[at:] + question
        assert len(prompt) == n, (len(prompt), n)
        return tuple(prompt)

    def prompt_length(self, length: int) -> int:
        return length

    def target_length(self, length: int) -> int:
        return self.target_len

    # ------------------------------------------------------------------ as a task of bench --model

    def eval_lengths(self, s: ModelBenchSettings) -> list[int]:
        """``f * L`` for ``passkey_eval_factors``; those shorter than a prompt are skipped (said on stderr)."""
        L = self.train_length(s)
        lengths = sorted({round(f * L) for f in s.passkey_eval_factors})
        short = [n for n in lengths if n < self.min_length]
        if short:
            print(f"posenc bench: {self.name} lengths {short} are shorter than a {self.name} prompt "
                  f"({self.min_length} tokens): skipped", file=sys.stderr)
        lengths = [n for n in lengths if n >= self.min_length]
        if not lengths:
            raise ValueError(f"every {self.name} length ({', '.join(str(round(f * L)) for f in s.passkey_eval_factors)}) "
                             f"is shorter than a {self.name} prompt ({self.min_length} tokens); use --tasks lm")
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

    def evaluate_at(self, lm: HFCausalLM, s: ModelBenchSettings, n: int
                    ) -> Iterator[tuple[float | None, float, dict[str, Any]]]:
        examples = self.eval_examples(s)
        for d in self.eval_depths(s):
            acc = exact_match(lm, self, n, examples, eval_seed=s.eval_seed, depth=d, batch_size=self.batch(n))
            low, high = wilson(round(acc * examples), examples)
            yield d, acc, {"low": low, "high": high, "count": examples}

    @classmethod
    def title(cls, settings: dict[str, Any]) -> str:
        return (f"{cls.what}, % (mean of depths {', '.join(f'{d:g}' for d in settings['passkey_depths'])}; "
                f"{settings['passkey_examples']} example(s) per depth)")
