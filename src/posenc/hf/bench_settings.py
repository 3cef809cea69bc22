"""The settings of ``posenc bench --model``: everything that determines its numbers (stored in
bench.json), the evaluation sizes per preset, and :func:`model_settings`, which builds them for a
checkpoint from a preset and the flags given."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bench.data import CORPORA
from ..config import check_choice, check_int, check_positive, check_range
from ..rotary.mrope import MROPE_MODEL_TYPES
from .checkpoint import Checkpoint, fingerprint, open_checkpoint
from .checkpoint import trained_length as own_length
from .evaluation import check_has_rope, stated_trained_length
from .scalings import MODEL_METHODS, MODEL_SCALINGS, RAISED_BASE
from .tasks import default_model_task_names, model_task, model_task_names

__all__ = ["EVAL_FIELDS", "MODEL_PRESETS", "ModelBenchSettings", "model_settings"]

#: evaluation sizes per ``--preset`` for a real checkpoint, as multiples of L. A forward at 2L of
#: a 135M model is minutes on 2 CPU cores, so "quick" is one window and one passkey example per
#: cell; "micro" (the smoke preset, tiny test models) takes the synthetic bench's sizes.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "quick": dict(passkey_eval_factors=(0.5, 1.0, 2.0), passkey_depths=(0.0, 0.5, 1.0), passkey_examples=1,
                  lm_eval_factors=(0.5, 1.0, 1.5, 2.0), lm_eval_tokens=1),
    "standard": dict(passkey_eval_factors=(0.5, 1.0, 1.5, 2.0, 4.0), passkey_depths=(0.0, 0.5, 1.0),
                     passkey_examples=4, lm_eval_factors=(0.5, 1.0, 1.5, 2.0, 4.0), lm_eval_tokens=65_536),
    "paper": dict(passkey_eval_factors=(0.5, 1.0, 2.0, 4.0, 8.0), passkey_depths=(0.0, 0.25, 0.5, 0.75, 1.0),
                  passkey_examples=16, lm_eval_factors=(0.5, 1.0, 2.0, 4.0, 8.0), lm_eval_tokens=262_144),
}
#: the settings a flag of ``posenc bench`` may override with --model (the others train a model)
EVAL_FIELDS = ("passkey_eval_factors", "passkey_depths", "passkey_examples", "lm_eval_factors", "lm_eval_tokens",
               "scalings", "methods", "eval_seed")
_SIZE_FIELDS = ("passkey_eval_factors", "passkey_depths", "passkey_examples", "lm_eval_factors", "lm_eval_tokens")


@dataclass(frozen=True)
class ModelBenchSettings:
    """Everything that determines the numbers of ``bench --model`` (stored in bench.json).

    ``label``: the model's name in tables (a named model's name, else the folder's);
    ``trained_length``: L, the checkpoint's own unless stated shorter for a quick run;
    ``checkpoint_length``: the checkpoint's own trained length (0: not recorded, older files);
    ``corpus``: the lm task's text when ``data`` is None (:data:`posenc.bench.data.CORPORA`);
    ``raised_base``: the factor of the raised-base row (0: no such row)."""

    model: str
    fingerprint: str
    trained_length: int
    label: str = ""
    checkpoint_length: int = 0
    tasks: tuple[str, ...] = default_model_task_names()  # a task with default False runs when named
    dtype: str = "float32"
    passkey_eval_factors: tuple[float, ...] = MODEL_PRESETS["quick"]["passkey_eval_factors"]
    passkey_depths: tuple[float, ...] = MODEL_PRESETS["quick"]["passkey_depths"]
    passkey_examples: int = MODEL_PRESETS["quick"]["passkey_examples"]
    lm_eval_factors: tuple[float, ...] = MODEL_PRESETS["quick"]["lm_eval_factors"]
    lm_eval_tokens: int = MODEL_PRESETS["quick"]["lm_eval_tokens"]
    data: str | None = None
    corpus: str = "code"
    scalings: tuple[str, ...] = MODEL_SCALINGS
    methods: tuple[str, ...] = ()
    raised_base: float = 16.0
    eval_seed: int = 1234
    seeds: int = 1  # no training: one "seed", kept for the bench's results format

    def __post_init__(self) -> None:
        check_int("trained_length", self.trained_length, minimum=2)
        check_int("passkey_examples", self.passkey_examples, minimum=1)
        check_int("lm_eval_tokens", self.lm_eval_tokens, minimum=1)
        check_int("eval_seed", self.eval_seed, minimum=0)
        for name in ("passkey_eval_factors", "passkey_depths", "lm_eval_factors"):
            if not getattr(self, name):
                raise ValueError(f"{name} must hold at least one value, got none")
        for f in (*self.passkey_eval_factors, *self.lm_eval_factors):
            check_positive("eval factors", f)
        for d in self.passkey_depths:
            check_range("passkey_depths", d, 0.0, 1.0)
        if not self.tasks:
            raise ValueError(f"tasks must name at least one of {', '.join(model_task_names())}")
        for t in self.tasks:
            check_choice("tasks (with --model)", t, model_task_names())
        for s in self.scalings:
            check_choice("scalings (with --model: the registry's training-free scalings)", s, MODEL_SCALINGS)
        for m in self.methods:
            check_choice("methods (with --model: the training-free attention methods)", m, MODEL_METHODS)
        check_choice("dtype", self.dtype, ("float32", "bfloat16"))
        check_choice("corpus", self.corpus, CORPORA)
        if self.data is not None and self.corpus != "code":
            raise ValueError(f"corpus {self.corpus!r} and data {self.data!r}: give one text for the lm task, not both")
        check_range("raised_base", self.raised_base, 0.0)
        if 0 < self.raised_base <= 1:
            raise ValueError(f"raised_base must be 0 (no raised-base row) or > 1, got {self.raised_base}")

    def variants(self) -> list[str]:
        """The rows beyond L: every scaling, the raised base, then every attention method."""
        return list(self.scalings) + ([RAISED_BASE] if self.raised_base else []) + list(self.methods)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def comparable(self) -> dict[str, Any]:
        """The settings that must match to resume (the task list may grow)."""
        d = self.to_json()
        for k in ("tasks", "seeds"):
            d.pop(k)
        return json.loads(json.dumps(d))


def model_settings(preset: str, model: str | Path, *, tasks: list[str] | None = None, data: str | None = None,
                   corpus: str = "code", raised_base: float | None = None, bf16: bool = False,
                   overrides: dict[str, Any] | None = None, trained_length: int | None = None,
                   install: bool = True) -> tuple[ModelBenchSettings, Checkpoint]:
    """Settings for ``model`` (a folder, a .gguf file or a named model: :func:`posenc.hf.models.resolve_model`)
    with the sizes of :data:`MODEL_PRESETS` [``preset``] (the synthetic bench's for ``micro``;
    lengths as multiples of L), then ``overrides`` (fields of :data:`EVAL_FIELDS`).
    ``trained_length``: a shorter L than the checkpoint's own (a quick run); ``corpus``: the lm
    task's named corpus (``code``, ``prose``); ``raised_base``: the raised-base row's factor
    (None: 16; 0: no such row)."""
    from ..bench.settings import PRESETS
    from .models import MODELS, resolve_model

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    unknown = sorted(set(overrides or {}) - set(EVAL_FIELDS))
    if unknown:
        raise ValueError(f"overrides: {', '.join(unknown)} not an evaluation setting; valid: {', '.join(EVAL_FIELDS)}")
    for t in tasks or ():
        if t not in model_task_names():
            raise ValueError(f"--tasks with --model: unknown task {t!r}; valid tasks: {', '.join(model_task_names())}")
    for t in tasks or model_task_names():
        model_task(t).check_inputs(corpus, data)  # e.g. a missing corpus package, before loading a model
    ckpt = open_checkpoint(resolve_model(model, install=install))
    model_type = ckpt.config.get("model_type")
    if model_type in MROPE_MODEL_TYPES:  # its RoPE and L live in text_config: the specific reading first
        raise ValueError(f"MODEL {str(model)!r}: model_type {model_type!r} rotates with M-RoPE (time, height and width "
                         "sections): bench --model evaluates text models with a 1-D RoPE")
    check_has_rope(ckpt.config, f"MODEL {str(model)!r}")
    if preset in MODEL_PRESETS:
        base = dict(MODEL_PRESETS[preset])
    else:  # the smoke preset: the synthetic bench's sizes, one scaling
        base = {k: PRESETS[preset][k] for k in _SIZE_FIELDS if k in PRESETS[preset]}
        base["scalings"] = tuple(s for s in PRESETS[preset].get("scalings", MODEL_SCALINGS) if s in MODEL_SCALINGS)
        base["methods"] = ()  # the smoke preset: the scalings' rows only (a method is an override)
    from .methods import METHOD_MODEL_TYPES

    if model_type in METHOD_MODEL_TYPES:  # the attention methods stand in for these models' attention only
        base.setdefault("methods", MODEL_METHODS)
    elif (overrides or {}).get("methods"):
        raise ValueError(f"methods with MODEL {str(model)!r}: model_type {model_type!r} is not one whose attention the "
                         f"methods can replace ({', '.join(METHOD_MODEL_TYPES)})")
    if tasks:
        base["tasks"] = tuple(dict.fromkeys(tasks))
    name = str(model)
    s = ModelBenchSettings(
        model=str(ckpt.path.resolve()), fingerprint=fingerprint(ckpt),
        trained_length=stated_trained_length(ckpt, trained_length), checkpoint_length=own_length(ckpt.config),
        label=name if name in MODELS else ckpt.name, dtype="bfloat16" if bf16 else "float32", data=data, corpus=corpus,
        **({} if raised_base is None else dict(raised_base=raised_base)),
        **(base | dict(overrides or {})),
    )
    return s, ckpt
