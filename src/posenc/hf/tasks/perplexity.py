"""Token perplexity on a local corpus at ``f * L`` for ``lm_eval_factors``: non-overlapping
windows of its validation part, each read on its own, every next token scored.

``--corpus code`` (the default) is the Python standard library's sources, as the synthetic
bench's lm task; ``--corpus prose`` the King James Bible from a registry package
(:data:`posenc.bench.data.PROSE`); ``--data PATH`` any text file or folder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from ...bench.data import PROSE, ByteCorpus, load_named_corpus
from ..evaluation import text_corpus, token_perplexity, token_stream
from .base import ModelTask, register_model_task

if TYPE_CHECKING:
    from torch import Tensor

    from ..bench_settings import ModelBenchSettings
    from ..evaluation import HFCausalLM

__all__ = ["TokenPerplexity", "corpus_name"]


def corpus_name(settings: dict[str, Any]) -> str:
    """The text scored, in words, from results.json's settings."""
    if settings.get("data"):
        return settings["data"]
    return PROSE.title if settings.get("corpus") == "prose" else "the Python standard library sources"


@register_model_task
class TokenPerplexity(ModelTask):
    """Token perplexity on the validation part of a corpus, in windows read on their own."""

    name = "lm"
    metric = "ppl"
    value_label = "token perplexity (lower is better)"
    higher_is_better = False
    value_format = "{:.2f}"

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self.stream: Tensor | None = None

    @classmethod
    def check_inputs(cls, corpus: str, data: str | None) -> None:
        if corpus == "prose":
            load_named_corpus(corpus, max_bytes=1)  # a missing package: its install command

    def eval_lengths(self, s: ModelBenchSettings) -> list[int]:
        return sorted({round(f * self.train_length(s)) for f in s.lm_eval_factors})

    def prepare(self, s: ModelBenchSettings, lengths: list[int], device: str) -> None:
        self.stream = token_stream(self.tok, s.data, max(lengths) + 1, s.corpus,
                                   asks=f"the lm task's longest length ({max(lengths)} tokens, from --lm-eval-factors)"
                                   ).to(device)

    def corpus(self, s: ModelBenchSettings) -> ByteCorpus:
        return text_corpus(s.data, max(self.eval_lengths(s)) + 1, s.corpus)

    def cells(self, s: ModelBenchSettings, n: int) -> list[tuple[int, int, int]]:
        assert self.stream is not None, "prepare() first"
        return [(n, 1, n)] * min(max(1, s.lm_eval_tokens // n), len(self.stream) // n)

    def evaluate_at(self, lm: HFCausalLM, s: ModelBenchSettings, n: int) -> Iterator[tuple[float | None, float]]:
        assert self.stream is not None, "prepare() first"
        r = token_perplexity(lm, self.stream, n, windows=max(1, s.lm_eval_tokens // n), trained=self.train_length(s))
        extras = {k: r[k] for k in ("low", "high", "beyond", "beyond_low", "beyond_high") if k in r}
        yield None, r["ppl"], extras | {"count": r["tokens"]}

    @classmethod
    def title(cls, settings: dict[str, Any]) -> str:
        return f"{cls.value_label} on {corpus_name(settings)}"

    @classmethod
    def shown(cls, values: list[float | None]) -> str:
        return "nan" if values[0] is None else f"{values[0]:.3f}"
