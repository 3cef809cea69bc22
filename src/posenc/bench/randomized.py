"""Randomized positions (Ruoss et al. 2023) in the bench: training batches that carry them, and
a view of a trained model that is evaluated with them.

A run whose entry sets ``randomized_positions=K`` (:mod:`posenc.bench.entries`) draws, for every
sequence of ``n`` tokens, a sorted uniform sample of ``n`` distinct positions from ``[0, R)``,
``R = K * M`` with M the longest sequence the task's evaluation feeds
(:func:`posenc.absolute.randomized.randomized_positions`), in training and at evaluation alike,
as Ruoss et al.'s code does (every forward of their noisy encodings samples anew):

* :class:`RandomizedBatches` wraps a run's batches: the batch of step ``s`` gets positions drawn
  from a generator seeded by ``(seed, s)``, so a batch stays a pure function of the step (a
  resumed run draws the same positions). A row's sample covers its own tokens (up to its last
  target); the right padding after them sits at position 0 and carries no loss.
* :class:`RandomizedEval` is what the task's evaluation calls instead of the model: a forward
  draws the positions of each row; ``generate`` draws them for the whole decoded length (prompt
  and answer) and decodes greedily by full forwards over the prefix, so every step reads the
  same sorted sample (the model's KV-cache decoding continues positions one by one). Its draws
  come from a generator seeded once, by ``eval_seed`` and the task, so every seed and encoding of
  a task is tested with the same positions.

Shapes: tokens and positions (B, T).
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor, nn

from ..absolute.randomized import randomized_positions
from ..positions import SequenceInfo
from .data import IGNORE, Batch
from .train import Batches

__all__ = ["RandomizedBatches", "RandomizedEval", "draw_positions", "seeded_generator"]


def seeded_generator(*keys: object) -> torch.Generator:
    """A CPU generator seeded by a SHA-256 of ``keys`` (no ``hash``: PYTHONHASHSEED cannot move it)."""
    digest = hashlib.sha256("/".join(map(str, keys)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def draw_positions(lengths: Tensor, width: int, position_range: int, generator: torch.Generator) -> Tensor:
    """(B, width) int64 positions: row b's first ``lengths[b]`` a sorted sample of distinct values
    from ``[0, position_range)``, the rest 0."""
    valid = torch.arange(width)[None, :] < lengths[:, None]  # (B, T)
    seq = SequenceInfo(torch.arange(width).expand(len(lengths), width).contiguous(), valid=valid)
    return randomized_positions(seq, position_range, generator=generator).positions


class RandomizedBatches:
    """``batches(step)`` with each row's positions randomized over ``[0, position_range)``."""

    def __init__(self, batches: Batches, position_range: int, seed: int) -> None:
        self.batches, self.position_range, self.seed = batches, position_range, seed

    def __call__(self, step: int) -> Batch:
        batch = self.batches(step)
        B, T = batch.inputs.shape
        # a row's tokens run to its last target (the prompt's labels are IGNORE too, the padding's after it)
        has_label = batch.labels != IGNORE  # (B, T)
        last = torch.where(has_label, torch.arange(T)[None, :], -1).amax(dim=1)  # (B,)
        lengths = torch.where(last >= 0, last + 1, T)
        gen = seeded_generator("randomized_positions", self.seed, step)
        return Batch(batch.inputs, batch.labels, draw_positions(lengths, T, self.position_range, gen))


class RandomizedEval(nn.Module):
    """A trained model seen through randomized positions, for a task's evaluation (module
    docstring). It holds the model as a submodule; no weights of its own."""

    def __init__(self, model: nn.Module, position_range: int, *keys: object) -> None:
        super().__init__()
        self.model, self.position_range = model, position_range
        self.generator = seeded_generator("randomized_eval", *keys)

    def _seq(self, B: int, T: int, device: torch.device) -> SequenceInfo:
        pos = draw_positions(torch.full((B,), T), T, self.position_range, self.generator)
        return SequenceInfo.from_checked(pos.to(device))

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, T) -> logits (B, T, V), each row at its own sorted random positions."""
        return self.model(tokens, self._seq(*tokens.shape, tokens.device))

    @torch.no_grad()
    def generate(self, tokens: Tensor, max_new_tokens: int) -> Tensor:
        """Greedy decoding (B, P) -> (B, P + max_new_tokens), the positions of the whole sequence
        drawn first; one full forward per new token."""
        B, P = tokens.shape
        pos = self._seq(B, P + max_new_tokens, tokens.device).positions  # (B, P + N)
        out = tokens
        for _ in range(max_new_tokens):
            T = out.shape[1]
            logits = self.model(out, SequenceInfo.from_checked(pos[:, :T]))  # (B, T, V)
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return out
