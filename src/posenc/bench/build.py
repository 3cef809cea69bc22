"""What one benchmark run is made of: its model, its training batches and its optimisation.

Each is a pure function of the settings, the (task, encoding) and the seed, so a run is
reproducible from its ``run.json`` alone (docs/bench.md "Determinism").
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..model import Transformer
from ..model_config import ModelConfig
from ..registry import get_info
from .data import ByteCorpus
from .entries import parse_entry
from .randomized import RandomizedBatches, RandomizedEval
from .settings import EMBEDDINGS, FIXED_AMPLITUDE, BenchSettings
from .tasks import get_task
from .train import Batches, TrainConfig

__all__ = ["build_batches", "build_model", "evaluation_model", "train_config"]


def build_model(s: BenchSettings, encoding: str, task: str, seed: int) -> Transformer:
    """The benchmark's model for ``encoding``, initialised from ``seed``.

    An encoding with a position table (a ``max_len`` config field) gets one row per
    position the evaluation reaches; rows past the training length stay untrained.
    The token embeddings follow ``s.embedding`` (:data:`~posenc.bench.settings.EMBEDDINGS`):
    the same rule for every encoding, so that no family is handicapped by the scale of the
    tokens. An encoding in :data:`~posenc.bench.settings.FIXED_AMPLITUDE` gets the
    convention's ``code_scale`` as the model's ``embed_scale``.
    """
    entry = parse_entry(encoding)  # a name or a label (rope@base=500000.0, rope@randomized_positions=4)
    variant = entry.variant
    fields = {f.name for f in dataclasses.fields(get_info(variant.name).config_cls)}
    # a position table reaches every position the evaluation reads: randomized positions, their range
    reach = entry.position_range(s.max_positions(task)) or s.max_positions(task)
    enc_cfg = {"max_len": reach} if "max_len" in fields else {}
    conv = EMBEDDINGS[s.embedding]
    enc_cfg.update(conv.table_config.get(variant.name, {}))
    enc_cfg.update(entry.config(get_task(task).train_tokens(s)))  # the variant's own values win
    cfg = ModelConfig(
        vocab_size=get_task(task).vocab_size,
        d_model=s.d_model,
        n_layer=s.n_layer,
        n_head=s.n_head,
        encoding=variant.name,
        encoding_config=enc_cfg,
        embed_scale=conv.code_scale if variant.name in FIXED_AMPLITUDE else None,
        tie_weights=conv.tied,
    )
    torch.manual_seed(seed)
    model = Transformer(cfg)
    if conv.token_std is not None:
        with torch.no_grad():  # replaces the model's own N(0, 0.02) init
            model.tok_emb.weight.normal_(0.0, conv.token_std)
    return model


def build_batches(
    s: BenchSettings, task: str, seed: int, corpus: ByteCorpus | None, encoding: str | None = None
) -> Batches:
    """The training batches of one run: ``batches(step)`` is a pure function of ``(seed, step)``
    (:meth:`posenc.bench.tasks.Task.batches`); with randomized positions (``encoding``'s entry)
    each batch carries them (:class:`~posenc.bench.randomized.RandomizedBatches`)."""
    batches = get_task(task).batches(s, seed, corpus)
    reach = None if encoding is None else parse_entry(encoding).position_range(s.max_positions(task))
    return batches if reach is None else RandomizedBatches(batches, reach, seed)


def evaluation_model(s: BenchSettings, model: nn.Module, task: str, encoding: str) -> tuple[nn.Module, BenchSettings]:
    """What a task's evaluation calls for one run, and the settings it evaluates under: the model
    and ``s``, with two exceptions that evaluate no training-free RoPE scaling:

    * randomized positions: a :class:`~posenc.bench.randomized.RandomizedEval` of the model; a
      scaling stretches positions past L, and these runs only ever read positions in the range
      they were trained on;
    * a RoPE variant trained with a rope type of its own (p-RoPE, HoPE: ``scaling=...``):
      ``set_scaling`` replaces the type, so a "scaled" copy would drop the trained frequencies.
    """
    entry = parse_entry(encoding)
    reach = entry.position_range(s.max_positions(task))
    if reach is not None:
        return RandomizedEval(model, reach, s.eval_seed, task), dataclasses.replace(s, scalings=())
    if entry.variant.config_dict().get("scaling", "default") != "default":
        return model, dataclasses.replace(s, scalings=())
    return model, s


def train_config(s: BenchSettings, seed: int) -> TrainConfig:
    """The optimisation of one run; a checkpoint every ``min(50, steps / 4)`` steps."""
    return TrainConfig(
        steps=s.steps,
        lr=s.lr,
        warmup_steps=min(s.warmup_steps, s.steps),
        bf16=s.bf16,
        seed=seed,
        checkpoint_every=max(1, min(50, s.steps // 4)),
    )
