"""Evaluation beyond the training length: exact match, passkey accuracy, perplexity.

* :func:`exact_match`: greedy decoding with the KV cache (:meth:`Transformer.generate`);
  an example counts only when every target token is right.
* :func:`perplexity`: ``exp`` of the mean next-token NLL over non-overlapping windows of
  ``length`` tokens. Each window is scored on its own (no context carried over), so its
  first token is context only: a window contributes ``length - 1`` predictions.
* :func:`scaled_copies`: for models whose rotary modules offer
  ``set_scaling(rope_type, **params)`` (posenc.rotary), a copy of the model per
  training-free RoPE scaling (position interpolation, NTK-aware, dynamic NTK, YaRN) set for
  a given evaluation length E and training length L: ``factor = E / L`` and
  ``original_max_position_embeddings = L`` (dynamic NTK: ``factor = 1``, as it scales by
  the running length itself). Models without it get none.

* :func:`variants_for`: the model and its scaled copies at one evaluation length; a task's
  :meth:`~posenc.bench.tasks.Task.evaluate` measures each of them at its lengths and depths.

Evaluation sets are seeded by ``(task, length, depth, eval_seed)`` only, so every
encoding and every training seed is tested on the same problems.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import check_int
from .data import example_rng

if TYPE_CHECKING:  # the tasks evaluate themselves with the functions here
    from .tasks import Task

__all__ = ["exact_match", "perplexity", "scaled_copies", "SCALINGS", "has_rope_scaling", "variants_for"]


class _TrainingFree(Mapping):
    """rope type -> ``fn(factor, original) -> parameters``: the training-free RoPE scalings, read
    live from each scaling's ``extension`` rule in :data:`posenc.rotary.SCALINGS` (one entry
    per scaling: a newly registered one with an extension rule is evaluated too)."""

    def __getitem__(self, name: str):
        from ..rotary.scaling import SCALINGS as _ALL

        entry = _ALL[name]
        if entry.extension is None:
            raise KeyError(name)
        return entry.extension

    def __iter__(self):
        from ..rotary.scaling import list_scalings

        return iter(list_scalings(training_free=True))

    def __len__(self) -> int:
        return sum(1 for _ in self)


SCALINGS: Mapping = _TrainingFree()


@torch.no_grad()
def exact_match(
    model: nn.Module,
    task: Task,
    length: int,
    num_examples: int,
    *,
    eval_seed: int = 0,
    batch_size: int = 128,
    depth: float | None = None,
) -> float:
    """Fraction of ``num_examples`` problems of size ``length`` solved exactly by greedy decoding."""
    check_int("num_examples", num_examples, minimum=1)
    device = next(model.parameters()).device
    rng = example_rng("eval", task.name, eval_seed, length, depth)
    kwargs = {} if depth is None else {"depth": depth}
    examples = [task.sample(length, rng, **kwargs) for _ in range(num_examples)]
    correct = 0
    for i in range(0, num_examples, batch_size):
        chunk = examples[i : i + batch_size]
        prompts = torch.tensor([e.prompt for e in chunk], device=device)  # (B, P): equal lengths
        targets = torch.tensor([e.target for e in chunk], device=device)  # (B, Tt)
        out = model.generate(prompts, targets.shape[1])[:, prompts.shape[1] :]  # (B, Tt)
        correct += int((out == targets).all(dim=1).sum())
    return correct / num_examples


@torch.no_grad()
def perplexity(
    model: nn.Module, stream: Tensor, length: int, *, max_windows: int | None = None, batch_size: int = 16
) -> dict[str, float]:
    """Perplexity of ``model`` on the 1-D token ``stream`` cut into windows of ``length``.

    Returns ``{"ppl", "nll", "tokens", "windows"}``; ``nll`` is the mean over predicted tokens.
    """
    check_int("length", length, minimum=2)
    n_windows = len(stream) // length
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows < 1:
        raise ValueError(f"the stream has {len(stream)} tokens; need at least one window of {length}")
    device = next(model.parameters()).device
    windows = stream[: n_windows * length].long().view(n_windows, length)  # (N, T)
    total, count = 0.0, 0
    for i in range(0, n_windows, batch_size):
        w = windows[i : i + batch_size].to(device)
        logits = model(w[:, :-1])  # (B, T - 1, V)
        total += float(F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum"))
        count += w[:, 1:].numel()
    nll = total / count
    return {"ppl": math.exp(nll), "nll": nll, "tokens": count, "windows": n_windows}


def has_rope_scaling(model: nn.Module) -> bool:
    """Whether any module of ``model`` offers ``set_scaling(rope_type, **params)``."""
    return any(callable(getattr(m, "set_scaling", None)) for m in model.modules())


def scaled_copies(
    model: nn.Module, factor: float, original_length: int, types: tuple[str, ...] = tuple(SCALINGS)
) -> Iterator[tuple[str, nn.Module]]:
    """``(rope_type, copy of model with that scaling)`` for each type the model accepts.

    A type the rotary module rejects (TypeError/ValueError) is reported on stderr and skipped,
    so one unsupported scaling does not lose a finished training run.
    """
    if not has_rope_scaling(model):
        return
    for rope_type in types:
        # Each scaling's own rule (posenc.rotary.scaling): e.g. dynamic NTK takes s = 1, as it
        # rescales by the running length itself; the static types s = E / L.
        params = SCALINGS[rope_type](float(factor), int(original_length))
        scaled = copy.deepcopy(model)
        try:
            for m in scaled.modules():
                if callable(getattr(m, "set_scaling", None)):
                    m.set_scaling(rope_type, **params)
        except (TypeError, ValueError) as e:
            print(f"posenc bench: skipping RoPE scaling {rope_type!r}: {e}", file=sys.stderr)
            continue
        yield rope_type, scaled.eval()


def variants_for(model: nn.Module, scalings: tuple[str, ...]) -> Callable[[float, int], Iterator[tuple[str, nn.Module]]]:
    """``variants(factor, original_length)``: ``("base", model)``, then, for a model with RoPE
    scaling evaluated past its training length (``factor > 1``), a scaled copy per type in
    ``scalings`` (:func:`scaled_copies`). A task's evaluation measures each one."""
    rope = has_rope_scaling(model)

    def variants(factor: float, original_length: int) -> Iterator[tuple[str, nn.Module]]:
        yield "base", model
        if rope and factor > 1:
            yield from scaled_copies(model, factor, original_length, scalings)

    return variants
