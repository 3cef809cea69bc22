"""What one benchmark run is made of: its model, its training batches and its optimisation.

Each is a pure function of the settings, the (task, encoding) and the seed, so a run is
reproducible from its ``run.json`` alone (docs/bench.md "Determinism").
"""

from __future__ import annotations

import dataclasses

import torch

from ..model import Transformer
from ..model_config import ModelConfig
from ..registry import get_info
from ..variants import parse_variant
from .data import ByteCorpus
from .settings import EMBEDDINGS, FIXED_AMPLITUDE, BenchSettings
from .tasks import get_task
from .train import Batches, TrainConfig

__all__ = ["build_batches", "build_model", "train_config"]


def build_model(s: BenchSettings, encoding: str, task: str, seed: int) -> Transformer:
    """The benchmark's model for ``encoding``, initialised from ``seed``.

    An encoding with a position table (a ``max_len`` config field) gets one row per
    position the evaluation reaches; rows past the training length stay untrained.
    The token embeddings follow ``s.embedding`` (:data:`~posenc.bench.settings.EMBEDDINGS`):
    the same rule for every encoding, so that no family is handicapped by the scale of the
    tokens. An encoding in :data:`~posenc.bench.settings.FIXED_AMPLITUDE` gets the
    convention's ``code_scale`` as the model's ``embed_scale``.
    """
    variant = parse_variant(encoding)  # a name or a variant label (rope@base=500000.0)
    fields = {f.name for f in dataclasses.fields(get_info(variant.name).config_cls)}
    enc_cfg = {"max_len": s.max_positions(task)} if "max_len" in fields else {}
    conv = EMBEDDINGS[s.embedding]
    enc_cfg.update(conv.table_config.get(variant.name, {}))
    enc_cfg.update(variant.config_dict())  # the variant's own values win
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


def build_batches(s: BenchSettings, task: str, seed: int, corpus: ByteCorpus | None) -> Batches:
    """The training batches of one run: ``batches(step)`` is a pure function of ``(seed, step)``
    (:meth:`posenc.bench.tasks.Task.batches`)."""
    return get_task(task).batches(s, seed, corpus)


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
