"""What determines the benchmark's numbers: :class:`BenchSettings`, the named presets, and the
token-embedding conventions.

* :class:`BenchSettings` is stored in ``bench.json``; :meth:`BenchSettings.comparable` is what
  must match to resume, and :func:`run_settings` what one run records in its ``run.json``.
* :data:`PRESETS`: ``micro`` (the smoke test), ``quick`` (``make demo``), ``standard`` (every
  encoding and task on a CPU) and ``paper`` (the papers' size, for a GPU); :func:`settings_for`
  makes the settings of one with overrides.
* :data:`EMBEDDINGS`: how token embeddings, and the absolute codes added to them, are scaled
  (docs/bench.md "Fair conventions").
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from ..config import check_choice, check_int, check_positive
from ..registry import get_info, list_encodings
from .entries import parse_entry
from .evaluate import SCALINGS
from .language import LanguageModelling
from .tasks import Copy, PasskeyTask, builtin_task_names, get_task, task_names

__all__ = [
    "ALL", "BenchSettings", "EMBEDDINGS", "EmbeddingConvention", "FIXED_AMPLITUDE", "PRESETS", "ROPE_VARIANTS",
    "run_settings", "sequence_encodings", "settings_for",
]


@dataclass(frozen=True)
class EmbeddingConvention:
    """How the token embeddings, and the absolute codes added to them, are scaled.

    ``token_std``: init std of the token embeddings (None: the model's own N(0, 0.02)).
    ``tied``: share them with the output layer. ``code_scale``: the encodings named in
    :data:`FIXED_AMPLITUDE` run in unit-scale coordinates, ``x -> code_scale * embed(x / code_scale)``
    (the model's ``embed_scale``), so a code of fixed, order-one amplitude is added at
    ``code_scale`` (None: as built). ``table_config``: encoding config overrides per encoding
    name (a learned table's init).
    """

    token_std: float | None
    tied: bool
    code_scale: float | None = None
    table_config: dict[str, dict[str, Any]] = field(default_factory=dict)


# Absolute encodings that *add* a code of fixed, order-one amplitude, designed next to unit-scale
# token embeddings (Vaswani et al. 2017, sec. 3.4, multiply the embeddings by sqrt(d_model)):
# sin/cos waves of amplitude 1; FLOATER's ODE solution p(t) (Liu et al. 2020); x + W GRU(x)
# with h in (-1, 1) (Neishi & Yoshinaga 2019). A learned table is not here: its init is a setting.
FIXED_AMPLITUDE: tuple[str, ...] = ("sinusoidal", "floater", "recurrent")

# Token-embedding conventions (docs/bench.md "Fair conventions"):
# * "matched" (the default): GPT-2's tied N(0, 0.02) tokens, and each fixed-amplitude code computed
#   on unit-scale tokens and scaled back by 0.02, so code and token keep the paper's ratio (sinusoidal:
#   RMS 1/sqrt 2 next to RMS 1) at the scale the blocks' N(0, 0.02) weights write into the residual
#   stream. Every other encoding is the "gpt2" model bitwise.
# * "gpt2": GPT-2's tokens for every encoding, codes as built (fixed-amplitude codes 20-35x larger
#   than the tokens: sinusoidal copied 6 % within L).
# * "unit": N(0, 1) untied tokens and a learned table at N(0, 1). In this pre-norm model unit-scale
#   inputs dwarf the blocks' first outputs, and every encoding learned passkey far worse.
EMBEDDINGS: dict[str, EmbeddingConvention] = {
    "matched": EmbeddingConvention(token_std=None, tied=True, code_scale=0.02),
    "gpt2": EmbeddingConvention(token_std=None, tied=True),
    "unit": EmbeddingConvention(token_std=1.0, tied=False, table_config={"learned": {"init_std": 1.0}}),
}


@dataclass(frozen=True)
class BenchSettings:
    """Everything that determines the benchmark's numbers (stored in ``bench.json``)."""

    encodings: tuple[str, ...]
    tasks: tuple[str, ...]
    seeds: int = 1
    # model
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    # optimisation (global batch)
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 30
    bf16: bool = False
    # synthetic tasks: train on sizes 1..L, test 1..2L
    synthetic_length: int = 8
    eval_examples: int = 64
    # passkey: train on contexts up to L, test at these multiples of L and depths
    passkey_length: int = 32
    passkey_eval_factors: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
    passkey_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    passkey_examples: int = 32
    # byte-level LM: train on windows of L, test at these multiples of L
    lm_length: int = 64
    lm_batch_size: int = 16  # windows of lm_length bytes per step
    lm_eval_factors: tuple[int, ...] = (1, 2, 4, 8)
    lm_train_bytes: int = 2_000_000
    lm_eval_tokens: int = 32_768  # tokens scored at every evaluation length
    data: str | None = None
    scalings: tuple[str, ...] = tuple(SCALINGS)
    eval_seed: int = 1234
    # token-embedding convention (see EMBEDDINGS): "matched" (fair to fixed-amplitude absolute codes)
    embedding: str = "matched"

    def __post_init__(self) -> None:
        for name in ("seeds", "d_model", "n_layer", "n_head", "steps", "batch_size", "eval_examples",
                     "passkey_examples", "lm_batch_size", "lm_train_bytes", "lm_eval_tokens"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("synthetic_length", self.synthetic_length, minimum=1)
        check_int("passkey_length", self.passkey_length, minimum=PasskeyTask.min_length)
        check_int("lm_length", self.lm_length, minimum=2)
        check_positive("lr", self.lr)
        for name in self.scalings:
            check_choice("scalings", name, SCALINGS)
        check_choice("embedding", self.embedding, tuple(EMBEDDINGS))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def comparable(self) -> dict[str, Any]:
        """The settings that must match to resume (the lists of runs may grow)."""
        d = self.to_json()
        for k in ("encodings", "tasks", "seeds"):
            d.pop(k)
        return json.loads(json.dumps(d))  # tuples -> lists, as stored

    def train_length(self, task: str) -> int:
        """The training length L of ``task``, in the task's unit (:meth:`Task.train_length`)."""
        return get_task(task).train_length(self)

    def max_positions(self, task: str) -> int:
        """Longest sequence any evaluation of ``task`` feeds the model (sizes position tables)."""
        return get_task(task).max_positions(self)


def run_settings(s: BenchSettings, task: str, encoding: str, seed: int) -> dict[str, Any]:
    """What determines one run's numbers: every comparable setting, the task, encoding and seed.

    (Settings of other tasks are included too: simpler, and stricter, than deciding per task.)
    """
    return dict(s.comparable(), task=task, encoding=encoding, seed=seed)


_PRESET_ENCODINGS = ("none", "learned", "sinusoidal", "rope", "alibi", "t5")
_PRESET_TASKS = (Copy.name, PasskeyTask.name, LanguageModelling.name)
# A preset whose encodings are ALL runs every registered 1-D encoding (sequence_encodings(), read
# when its settings are made), so an encoding added later cannot be left out of it; tasks ALL:
# every task posenc registers (builtin_task_names()).
ALL = "all"


# RoPE trained another way, which the presets that run every encoding add as variants (issue 30):
# each is a published method with a claim against plain RoPE, checked on the standard run
# (docs/bench.md "The standard run and the published orderings"). Keys: the names tables use.
# * p-RoPE (Barbero et al. 2025): the highest-frequency 3/4 of the pairs rotate, the rest do not;
#   0.75 is the fraction of their headline Gemma result. (0.25 would be HoPE itself at the standard
#   preset's 4 pairs: both keep pair 0 alone.)
# * HoPE (Chen et al. 2025): the pairs with a wavelength beyond the trained length stop rotating;
#   L is each task's own training length in tokens (posenc.bench.entries).
# * randomized positions (Ruoss et al. 2023) on RoPE, from 4x the longest evaluated sequence
#   (their 2048 for tests up to 500). On NoPE, which reads no positions, the same option would
#   train NoPE again, so it is not run.
ROPE_VARIANTS: dict[str, str] = {
    "p-RoPE": "rope@scaling=proportional,proportion=0.75",
    "HoPE": "rope@scaling=hope,original_max_position_embeddings=L",
    "randomized RoPE": "rope@randomized_positions=4",
}


def sequence_encodings() -> tuple[str, ...]:
    """Every registered encoding that reads a sequence's positions (B, T): its class's
    ``position_axes`` is 1. The multi-axis ones (M-RoPE, XD-RoPE, 2-D RoPE: 2 to 4 axes, for
    images and video) are left out: on a 1-D sequence M-RoPE and XD-RoPE are RoPE itself (every
    axis at the position) and 2-D RoPE folds the positions onto a patch grid, so their rows would
    repeat RoPE or measure a layout no paper proposes for text. ``--encodings`` still runs them."""
    return tuple(n for n in list_encodings() if get_info(n).cls.position_axes == 1)
PRESETS: dict[str, dict[str, Any]] = {
    # seconds: the smoke test
    "micro": dict(
        encodings=("none", "rope", "alibi"),
        tasks=_PRESET_TASKS,
        d_model=16, n_layer=1, n_head=2, steps=4, batch_size=8, warmup_steps=1,
        synthetic_length=4, eval_examples=4, passkey_length=12, passkey_eval_factors=(1.0, 2.0),
        passkey_depths=(0.0, 1.0), passkey_examples=4, lm_length=16, lm_eval_factors=(1, 2),
        lm_batch_size=8, lm_train_bytes=20_000, lm_eval_tokens=256, scalings=("linear",),
    ),
    # make demo: 3 seeds within 12 minutes on a 2-core CPU as two 1-thread processes
    # (docs/bench.md "make demo: seeds and timing"): 500 steps and passkey L = 16, trimmed
    # from 600 and 24 after profiling (the time is matrix products, not Python)
    "quick": dict(
        encodings=_PRESET_ENCODINGS,
        tasks=_PRESET_TASKS,
        seeds=3, d_model=64, n_layer=2, n_head=4, steps=500, batch_size=64, lr=3e-3, warmup_steps=30,
        synthetic_length=6, eval_examples=64, passkey_length=16, passkey_examples=32,
        lm_length=64, lm_batch_size=16, lm_eval_tokens=16_384,
    ),
    # every 1-D encoding and RoPE variant x every task x 3 seeds: 32 x 10 x 3 = 960 runs, sized for
    # two 1-thread processes on a 2-core CPU (benchmarks/bench_split.py): one seed of copy over the
    # 32 entries took 130 s in one process under a load average of 3 (path 9 s, none 2.3 s), about
    # an hour of one core for the whole preset (docs/bench.md "The rerun of issue 30")
    "standard": dict(
        encodings=(ALL, *ROPE_VARIANTS.values()),
        tasks=ALL,
        seeds=3, d_model=32, n_layer=2, n_head=4, steps=400, batch_size=32, lr=5e-3, warmup_steps=40,
        synthetic_length=5, eval_examples=32, passkey_length=16, passkey_eval_factors=(0.5, 1.0, 2.0, 3.0),
        passkey_depths=(0.0, 0.5, 1.0), passkey_examples=16, lm_length=32, lm_batch_size=16,
        lm_eval_factors=(1, 2, 4), lm_train_bytes=500_000, lm_eval_tokens=4096,
    ),
    # the same sweep at the size of the papers' synthetic experiments, for a GPU (days on a CPU)
    "paper": dict(
        encodings=(ALL, *ROPE_VARIANTS.values()),
        tasks=ALL,
        seeds=3, d_model=256, n_layer=6, n_head=8, steps=10_000, batch_size=64, lr=1e-3,
        warmup_steps=500, synthetic_length=20, eval_examples=256, passkey_length=256,
        passkey_examples=64, lm_length=256, lm_batch_size=64, lm_train_bytes=50_000_000, lm_eval_tokens=262_144,
    ),
}


def _labels(spec: str) -> tuple[str, ...]:
    """The canonical labels a spec stands for: :data:`ALL` is every 1-D encoding."""
    return sequence_encodings() if spec == ALL else (parse_entry(spec).label,)


def settings_for(
    preset: str,
    *,
    encodings: list[str] | None = None,
    tasks: list[str] | None = None,
    seeds: int | None = None,
    **overrides: Any,
) -> BenchSettings:
    """The settings of ``preset`` with overrides.

    Encodings named explicitly must be registered (else a ValueError lists the valid ones);
    a preset's encodings that are not registered yet are skipped with a message on stderr.
    Encodings are specs (:func:`posenc.bench.entries.parse_entry`), stored as their labels;
    :data:`ALL` (``all``) stands for every registered 1-D encoding (:func:`sequence_encodings`),
    which the ``standard`` and ``paper`` presets run, with :data:`ROPE_VARIANTS`.
    """
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    base = dict(PRESETS[preset])
    valid = list_encodings()
    if base["tasks"] == ALL:
        base["tasks"] = builtin_task_names()
    if encodings:
        # specs (rope:base=500000) stored as canonical labels: unknown names and keys, bad
        # values fail here, listing the valid ones; two spellings of one variant run once;
        # "all" stands for every 1-D encoding
        base["encodings"] = tuple(dict.fromkeys(label for spec in encodings for label in _labels(spec)))
    else:
        listed = (base["encodings"],) if base["encodings"] == ALL else base["encodings"]
        missing = [e for e in listed if e != ALL and re.split("[:@]", e, maxsplit=1)[0] not in valid]
        if missing:
            print(f"posenc bench: skipping encodings not registered yet: {', '.join(missing)}", file=sys.stderr)
        base["encodings"] = tuple(dict.fromkeys(label for e in listed if e not in missing for label in _labels(e)))
    if tasks:
        for name in tasks:
            if name not in task_names():  # built-in and registered (register_task) tasks
                raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(task_names())}")
        base["tasks"] = tuple(dict.fromkeys(tasks))
    if seeds is not None:
        if seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {seeds}")
        base["seeds"] = seeds
    base.update({k: v for k, v in overrides.items() if v is not None})
    if not base["encodings"]:
        raise ValueError(f"no encoding to run; registered encodings: {', '.join(valid)}")
    settings = BenchSettings(**base)
    for name in settings.tasks:  # a registered task may need longer problems than size 1
        get_task(name).check_settings(settings)
    return settings
