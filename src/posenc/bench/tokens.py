"""The token vocabulary the synthetic tasks and passkey retrieval share, and :class:`Example`,
one problem written as tokens.

Every example is a decoder-only sequence ``prompt + target``: the prompt ends with ``SEP``,
the loss is taken on the target only, and ``PAD`` right-pads a batch (it never appears in a
target). A task may use a larger vocabulary of its own (:attr:`posenc.bench.tasks.Task.vocab_size`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DIGITS", "SEP", "PLUS", "PAD", "KEY", "QUERY", "FILLER", "VOCAB_SIZE", "Example"]

DIGITS = tuple(range(10))
SEP, PLUS, PAD, KEY, QUERY = 10, 11, 12, 13, 14
FILLER = tuple(range(15, 20))  # the passkey haystack cycles through these
VOCAB_SIZE = 20


@dataclass(frozen=True)
class Example:
    """One problem: the model reads ``prompt`` and must produce ``target``."""

    prompt: tuple[int, ...]
    target: tuple[int, ...]

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.prompt + self.target
