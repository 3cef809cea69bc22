"""Byte-level language modelling as a bench task (``lm``): trained on windows of L bytes of a
corpus, tested by perplexity at multiples of L.

Perplexity is ``exp`` of the mean next-byte NLL over non-overlapping windows of the
validation stream (:func:`posenc.bench.evaluate.perplexity`), ``lm_eval_tokens`` bytes scored
at every length; a RoPE model is measured with each training-free scaling set for ``E / L``
too. The corpus is the Python standard library's sources unless ``--data`` names another
(:func:`posenc.bench.data.load_corpus`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from .data import ByteCorpus, LMBatches
from .evaluate import perplexity, variants_for
from .tasks import Task, register_task

if TYPE_CHECKING:
    from ..results import Point
    from .train import Batches

__all__ = ["LanguageModelling"]


@register_task
class LanguageModelling(Task):
    """Byte-level language modelling, perplexity at multiples of --lm-length."""

    name = "lm"
    metric = "ppl"
    unit = "bytes"
    min_length = 2
    vocab_size = 256  # bytes
    batch_field = "lm_batch_size"
    uses_corpus = True

    def describe(self) -> str:
        return "byte-level language modelling, perplexity at multiples of --lm-length"

    def train_length(self, s: Any) -> int:
        return s.lm_length

    def train_tokens(self, s: Any) -> int:
        return s.lm_length

    def eval_lengths(self, s: Any) -> list[int]:
        return [s.lm_length * f for f in s.lm_eval_factors]

    def max_positions(self, s: Any) -> int:
        return max(self.eval_lengths(s))

    def check_settings(self, s: Any) -> None:
        """Nothing beyond what the settings check themselves (``lm_length >= 2``)."""

    def settings_note(self, settings: dict[str, Any]) -> str | None:
        return f"{self.name}: {settings['lm_batch_size']} windows" if "lm_batch_size" in settings else None

    def batches(self, s: Any, seed: int, corpus: ByteCorpus | None) -> Batches:
        if corpus is None:
            raise ValueError(f"the {self.name} task needs a corpus (load_corpus)")
        return LMBatches(corpus, self.batch_size(s), self.train_length(s), seed, key=self.name)

    def evaluate(self, model: nn.Module, s: Any, corpus: ByteCorpus | None) -> list[Point]:
        if corpus is None:
            raise ValueError(f"the {self.name} task is evaluated on a corpus (load_corpus); got corpus=None")
        points: list[Point] = []
        L = self.train_length(s)
        variants = variants_for(model, s.scalings)
        for n in self.eval_lengths(s):
            for variant, m in variants(n / L, L):
                r = perplexity(m, corpus.val, n, max_windows=max(1, s.lm_eval_tokens // n))
                points.append(dict(variant=variant, length=n, depth=None, value=r["ppl"]))
        return points
