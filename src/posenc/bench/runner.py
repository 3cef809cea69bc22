"""Run the benchmark: every (task, encoding, seed) trained, evaluated, and collected.

Layout of an output directory::

    OUT/.lock                                   held (flock) by the process writing OUT
    OUT/bench.json                              the settings (checked on --resume)
    OUT/runs/TASK/ENCODING/seedK/run.json                 the settings this run was trained with
    OUT/runs/TASK/ENCODING/seedK/checkpoint.safetensors   while training
    OUT/runs/TASK/ENCODING/seedK/model.safetensors        final weights
    OUT/runs/TASK/ENCODING/seedK/result.json              its evaluation points
    OUT/results.json, OUT/results.csv, OUT/plots/*.png    the collected results

A run with a ``result.json`` is done and skipped on ``--resume`` (after verifying its
``model.safetensors``); one with a checkpoint continues from it; one whose evaluation was
interrupted is evaluated again from its final checkpoint. Every run records its own settings
in ``run.json``, so ``--resume`` refuses a run trained with other settings even when
``bench.json`` is gone or was replaced (the error names the settings that differ; nothing is
deleted, ``--overwrite`` starts over). Every JSON file is strict (NaN/inf written as null).
Under torchrun every rank trains; rank 0 evaluates and writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..config import check_choice, check_int, check_positive
from ..encoding import PositionalEncoding
from ..model import ModelConfig, Transformer
from ..positions import SequenceInfo
from ..registry import get_info, list_encodings
from .data import ByteCorpus, LMBatches, TaskBatches, load_corpus
from .files import OutDirLock, write_json
from .evaluate import SCALINGS, exact_match, has_rope_scaling, perplexity, scaled_copies
from ..variants import parse_variant
from .tasks import TASK_NAMES, PasskeyTask, get_task, task_names
from .train import TrainConfig, distributed_info, init_distributed, save_weights, train, verify_weights

__all__ = [
    "ALL", "BenchSettings", "EMBEDDINGS", "EmbeddingConvention", "FIXED_AMPLITUDE", "PRESETS", "build_model",
    "in_unit_coordinates", "settings_for", "run_bench", "check_out_dir", "check_runs", "run_settings",
]

@dataclass(frozen=True)
class EmbeddingConvention:
    """How the token embeddings, and the absolute codes added to them, are scaled.

    ``token_std``: init std of the token embeddings (None: the model's own N(0, 0.02)).
    ``tied``: share them with the output layer. ``code_scale``: the encodings named in
    :data:`FIXED_AMPLITUDE` run in unit-scale coordinates, ``x -> code_scale * embed(x / code_scale)``,
    so a code of fixed, order-one amplitude is added at ``code_scale`` (None: as built).
    ``table_config``: encoding config overrides per encoding name (a learned table's init).
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
# * "gpt2": the former model (fixed-amplitude codes 20-35x larger than the tokens: sinusoidal
#   copied 6 % within L).
# * "unit": N(0, 1) untied tokens and a learned table at N(0, 1). Superseded: in this pre-norm model
#   unit-scale inputs dwarf the blocks' first outputs, and every encoding learned passkey far worse
#   (kept so that results taken with it can be resumed and re-run).
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


_PRESET_ENCODINGS = ("none", "learned", "sinusoidal", "rope", "alibi", "t5")
# A preset whose encodings are ALL runs every registered encoding (list_encodings(), read when
# its settings are made), so an encoding added later cannot be left out of it.
ALL = "all"
PRESETS: dict[str, dict[str, Any]] = {
    # seconds: the smoke test
    "micro": dict(
        encodings=("none", "rope", "alibi"),
        tasks=("copy", "passkey", "lm"),
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
        tasks=("copy", "passkey", "lm"),
        seeds=3, d_model=64, n_layer=2, n_head=4, steps=500, batch_size=64, lr=3e-3, warmup_steps=30,
        synthetic_length=6, eval_examples=64, passkey_length=16, passkey_examples=32,
        lm_length=64, lm_batch_size=16, lm_eval_tokens=16_384,
    ),
    # every encoding x every task x 3 seeds = 456 runs, sized for about an hour on a quiet 2-core
    # CPU (--threads 1): one seed of copy over the 19 encodings took 563 s under a load average
    # of 7 (floater 88 s, deberta 7 s), ~3.5x slower than quiet (docs/bench.md "Presets")
    "standard": dict(
        encodings=ALL,
        tasks=TASK_NAMES,
        seeds=3, d_model=32, n_layer=2, n_head=4, steps=400, batch_size=32, lr=5e-3, warmup_steps=40,
        synthetic_length=5, eval_examples=32, passkey_length=16, passkey_eval_factors=(0.5, 1.0, 2.0, 3.0),
        passkey_depths=(0.0, 0.5, 1.0), passkey_examples=16, lm_length=32, lm_batch_size=16,
        lm_eval_factors=(1, 2, 4), lm_train_bytes=500_000, lm_eval_tokens=4096,
    ),
    # the same sweep at the size of the papers' synthetic experiments, for a GPU (days on a CPU)
    "paper": dict(
        encodings=ALL,
        tasks=TASK_NAMES,
        seeds=3, d_model=256, n_layer=6, n_head=8, steps=10_000, batch_size=64, lr=1e-3,
        warmup_steps=500, synthetic_length=20, eval_examples=256, passkey_length=256,
        passkey_examples=64, lm_length=256, lm_batch_size=64, lm_train_bytes=50_000_000, lm_eval_tokens=262_144,
    ),
}
# Former names, still accepted (exact names only): "full" became "paper" when it grew to every encoding.
RENAMED_PRESETS: dict[str, str] = {"full": "paper"}
PRESETS["full"] = PRESETS["paper"]


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
    The ``standard`` and ``paper`` presets run every registered encoding (:data:`ALL`).
    """
    if not isinstance(preset, str) or preset not in PRESETS:
        names = [p for p in PRESETS if p not in RENAMED_PRESETS]
        raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(names)}")
    if preset in RENAMED_PRESETS:
        print(f"posenc bench: preset {preset!r} is now called {RENAMED_PRESETS[preset]!r}", file=sys.stderr)
    base = dict(PRESETS[preset])
    valid = list_encodings()
    if base["encodings"] == ALL:
        base["encodings"] = tuple(valid)
    if encodings:
        # specs (rope:base=500000) stored as canonical labels: unknown names and keys, bad
        # values fail here, listing the valid ones; two spellings of one variant run once
        base["encodings"] = tuple(dict.fromkeys(parse_variant(spec).label for spec in encodings))
    else:
        missing = [e for e in base["encodings"] if e not in valid]
        if missing:
            print(f"posenc bench: skipping encodings not registered yet: {', '.join(missing)}", file=sys.stderr)
        base["encodings"] = tuple(e for e in base["encodings"] if e in valid)
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
        if name not in ("lm", "passkey") and get_task(name).min_length > settings.synthetic_length:
            raise ValueError(f"synthetic_length must be >= {get_task(name).min_length} (the min_length of task "
                             f"{name!r}), got {settings.synthetic_length}")
    return settings


# --------------------------------------------------------------------------- output dir

_OWNED = ("bench.json", "runs", "results.json", "results.csv", "plots")


def check_out_dir(out: Path, settings: BenchSettings, *, resume: bool, overwrite: bool) -> bool:
    """Refuse to mix with an earlier run unless told to resume it or overwrite it.

    Returns True when an earlier ``bench.json`` exists and matches ``settings``: only then are
    runs without their own ``run.json`` (written before posenc recorded one) trusted.
    """
    if resume and overwrite:
        raise ValueError("pass --resume or --overwrite, not both")
    stored = out / "bench.json"
    earlier = stored.exists() or (out / "runs").exists()
    if earlier and not (resume or overwrite):
        raise ValueError(
            f"--out {out} holds an earlier benchmark run; pass --resume to continue it or --overwrite to replace it"
        )
    if earlier and overwrite:
        for name in _OWNED:  # only what the bench itself writes
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    elif earlier and resume and stored.exists():
        try:
            old = json.loads(stored.read_text())
        except ValueError:
            raise ValueError(f"--resume: {stored} is not valid JSON; use --overwrite to start over") from None
        old_cmp = {k: v for k, v in old.items() if k not in ("encodings", "tasks", "seeds")}
        new_cmp = settings.comparable()
        if old_cmp != new_cmp:
            diff = {k: (old_cmp.get(k), v) for k, v in new_cmp.items() if old_cmp.get(k) != v}
            raise ValueError(f"--resume: settings differ from the earlier run in {out} (earlier, now): {diff}")
        return True
    return False


# --------------------------------------------------------------------------- one run's settings


def run_settings(s: BenchSettings, task: str, encoding: str, seed: int) -> dict[str, Any]:
    """What determines one run's numbers: every comparable setting, the task, encoding and seed.

    (Settings of other tasks are included too: simpler, and stricter, than deciding per task.)
    """
    return dict(s.comparable(), task=task, encoding=encoding, seed=seed)


def settings_hash(settings: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``settings``."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


_RUN_FILES = ("result.json", "model.safetensors", "checkpoint.safetensors")


def check_run_dir(run_dir: Path, settings: dict[str, Any], *, trust_unrecorded: bool) -> None:
    """Make sure ``run_dir`` holds nothing trained with other settings, then record ours.

    A ``run.json`` with other settings is refused, naming them. A run with results but no
    ``run.json`` is trusted only when the earlier ``bench.json`` matched (``trust_unrecorded``).
    """
    record = run_dir / "run.json"
    if record.exists():
        try:
            old = json.loads(record.read_text())["settings"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"--resume: {record} is unreadable; use --overwrite to start over") from None
        if old != settings:
            diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
            diff.update({k: (v, None) for k, v in old.items() if k not in settings})
            raise ValueError(
                f"--resume: {run_dir} was trained with other settings (earlier, now): {diff}; "
                "use the earlier settings or --overwrite"
            )
        return
    found = [n for n in _RUN_FILES if (run_dir / n).exists()]
    if found and not trust_unrecorded:
        raise ValueError(
            f"--resume: {run_dir} holds {', '.join(found)} but no run.json recording its settings, and "
            "bench.json is missing, so they cannot be checked; use --overwrite to start over"
        )
    write_json(record, dict(settings=settings, hash=settings_hash(settings)), indent=1)


# --------------------------------------------------------------------------- one run


def _max_positions(s: BenchSettings, task: str) -> int:
    """Longest sequence any evaluation feeds the model (sizes position tables)."""
    if task == "lm":
        return s.lm_length * max(s.lm_eval_factors)
    if task == "passkey":
        t = PasskeyTask()
        # the evaluation's lengths: factors below min_length / L are raised to min_length
        n = max(max(t.min_length, round(f * s.passkey_length)) for f in s.passkey_eval_factors)
        return t.prompt_length(n) + t.target_length(n)
    t = get_task(task)
    n = 2 * s.synthetic_length
    return t.prompt_length(n) + t.target_length(n)


def build_model(s: BenchSettings, encoding: str, task: str, seed: int) -> Transformer:
    """The benchmark's model for ``encoding``, initialised from ``seed``.

    An encoding with a position table (a ``max_len`` config field) gets one row per
    position the evaluation reaches; rows past the training length stay untrained.
    The token embeddings follow ``s.embedding`` (:data:`EMBEDDINGS`): the same rule for
    every encoding, so that no family is handicapped by the scale of the tokens.
    """
    variant = parse_variant(encoding)  # a name or a variant label (rope@base=500000.0)
    fields = {f.name for f in dataclasses.fields(get_info(variant.name).config_cls)}
    enc_cfg = {"max_len": _max_positions(s, task)} if "max_len" in fields else {}
    conv = EMBEDDINGS[s.embedding]
    enc_cfg.update(conv.table_config.get(variant.name, {}))
    enc_cfg.update(variant.config_dict())  # the variant's own values win
    cfg = ModelConfig(
        vocab_size=256 if task == "lm" else get_task(task).vocab_size,
        d_model=s.d_model,
        n_layer=s.n_layer,
        n_head=s.n_head,
        encoding=variant.name,
        encoding_config=enc_cfg,
        tie_weights=conv.tied,
    )
    torch.manual_seed(seed)
    model = Transformer(cfg)
    if conv.token_std is not None:
        with torch.no_grad():  # replaces the model's own N(0, 0.02) init
            model.tok_emb.weight.normal_(0.0, conv.token_std)
    if conv.code_scale is not None and variant.name in FIXED_AMPLITUDE:
        for pe in model.encodings:
            if pe.has_embed:
                in_unit_coordinates(pe, conv.code_scale)
    return model


def in_unit_coordinates(pe: PositionalEncoding, scale: float) -> None:
    """Make ``pe.embed`` run on unit-scale tokens: ``x -> scale * embed(x / scale)``.

    For an added code c, ``x + c`` becomes ``x + scale * c``: tokens of std ``scale`` meet the
    code at the ratio its paper designed; an encoding that reads the tokens (recurrent's GRU)
    reads them at unit scale. Set on the instance (not stored in the weights): every bench model
    is made by :func:`build_model`, and ``copy.deepcopy`` rebinds the method to the copy.
    """
    check_positive("scale", scale)

    def embed(self: PositionalEncoding, x: Tensor, seq: SequenceInfo, state: dict | None = None) -> Tensor:
        return type(self).embed(self, x / scale, seq, state) * scale  # (B, T, C)

    pe.embed = types.MethodType(embed, pe)


def _train_config(s: BenchSettings, seed: int) -> TrainConfig:
    return TrainConfig(
        steps=s.steps,
        lr=s.lr,
        warmup_steps=min(s.warmup_steps, s.steps),
        bf16=s.bf16,
        seed=seed,
        checkpoint_every=max(1, min(50, s.steps // 4)),
    )


def _train_length(s: BenchSettings, task: str) -> int:
    return {"lm": s.lm_length, "passkey": s.passkey_length}.get(task, s.synthetic_length)


def evaluate_run(model: Transformer, s: BenchSettings, task: str, corpus: ByteCorpus | None) -> list[dict]:
    """Evaluation points ``{variant, length, depth, value}`` of a trained model."""
    points: list[dict] = []
    L = _train_length(s, task)
    rope = has_rope_scaling(model)

    def variants(factor: float, original: int):
        yield "base", model
        if rope and factor > 1:
            yield from scaled_copies(model, factor, original, s.scalings)

    if task == "lm":
        assert corpus is not None
        for f in s.lm_eval_factors:
            n = L * f
            for variant, m in variants(n / L, L):
                r = perplexity(m, corpus.val, n, max_windows=max(1, s.lm_eval_tokens // n))
                points.append(dict(variant=variant, length=n, depth=None, value=r["ppl"]))
        return points
    t = get_task(task)
    if task == "passkey":
        lengths = sorted({max(t.min_length, round(f * L)) for f in s.passkey_eval_factors})
        depths: tuple[float | None, ...] = s.passkey_depths
        n_ex = s.passkey_examples
    else:
        lengths, depths, n_ex = list(range(t.min_length, 2 * L + 1)), (None,), s.eval_examples
    train_tokens = t.prompt_length(L) + t.target_length(L)
    for n in lengths:
        factor = (t.prompt_length(n) + t.target_length(n)) / train_tokens
        for variant, m in variants(factor, train_tokens):
            for d in depths:
                acc = exact_match(m, t, n, n_ex, eval_seed=s.eval_seed, depth=d)
                points.append(dict(variant=variant, length=n, depth=d, value=acc))
    return points


def run_one(
    s: BenchSettings, task: str, encoding: str, seed: int, run_dir: Path, corpus: ByteCorpus | None,
    device: torch.device, progress: bool,
) -> dict | None:
    """Train and evaluate one model; returns its record (rank 0) or None (other ranks).

    A finished run (``result.json``) is returned as recorded (:func:`check_runs` verified its
    ``model.safetensors`` first).
    """
    done = run_dir / "result.json"
    final = run_dir / "model.safetensors"
    if done.exists():
        from .summary import read_record

        return read_record(done)
    rank, world = distributed_info()
    model = build_model(s, encoding, task, seed).to(device)
    L = _train_length(s, task)
    if task == "lm":
        assert corpus is not None
        batches = LMBatches(corpus, s.lm_batch_size, L, seed)
    elif task == "passkey":
        batches = TaskBatches(PasskeyTask(), s.batch_size, L, seed)
    else:
        batches = TaskBatches(get_task(task), s.batch_size, L, seed)
    ckpt = run_dir / "checkpoint.safetensors"
    result = train(model, batches, _train_config(s, seed), checkpoint=ckpt, progress=progress,
                   desc=f"{task}/{encoding}/seed{seed}")
    record = None
    if rank == 0:
        save_weights(model, final)
        points = evaluate_run(model, s, task, corpus)
        record = dict(
            task=task, encoding=encoding, seed=seed, train_length=L,
            metric="ppl" if task == "lm" else "accuracy",
            train_loss=result.last_loss, train_seconds=result.seconds,
            parameters=model.num_parameters(), points=points,
        )
        write_json(done, record)  # NaN/inf -> null: strict JSON
        ckpt.unlink(missing_ok=True)  # only now: the result is safe, and this checkpoint verified
    if world > 1:
        dist.barrier()
    return record


def run_bench(
    s: BenchSettings, out: str | Path, *, resume: bool = False, overwrite: bool = False,
    progress: bool = True, device: str | None = None,
) -> dict | None:
    """Run every (task, encoding, seed) of ``s`` into ``out``; returns the collected results
    (on rank 0; None on other ranks) after writing results.json, results.csv and plots.

    ``out`` is locked for the whole call (a second writer gets a ValueError naming its pid).
    """
    out = Path(out)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rank, world = init_distributed(dev)
    if dev.type == "cuda" and world > 1:
        dev = torch.device("cuda", torch.cuda.current_device())
    for name in ("batch_size", "lm_batch_size"):
        if getattr(s, name) % world:
            raise ValueError(f"{name} ({getattr(s, name)}) must be divisible by the number of processes ({world})")
    with contextlib.ExitStack() as held:
        error = None
        if rank == 0:  # one rank locks and checks (and, with --overwrite, deletes); all ranks learn the outcome
            try:
                held.enter_context(OutDirLock(out))  # released on return, or by the kernel on any exit
                trusted = check_out_dir(out, s, resume=resume, overwrite=overwrite)
                check_runs(out, s, trusted=trusted)  # before any training: fail fast, and on all ranks
            except ValueError as e:
                error = str(e)
        if world > 1:
            box = [error]
            dist.broadcast_object_list(box)
            error = box[0]
        if error is not None:
            raise ValueError(error)
        return _run_locked(s, out, dev, rank, progress)


def _run_dir(out: Path, task: str, encoding: str, seed: int) -> Path:
    return out / "runs" / task / parse_variant(encoding).dirname / f"seed{seed}"


def check_runs(out: Path, s: BenchSettings, *, trusted: bool) -> None:
    """Every run directory of ``s``: settings recorded or checked (:func:`check_run_dir`), and
    a finished run's ``model.safetensors`` verified, so ``--resume`` reuses only sound runs."""
    for task in s.tasks:
        for encoding in s.encodings:
            for seed in range(s.seeds):
                run_dir = _run_dir(out, task, encoding, seed)
                run_dir.mkdir(parents=True, exist_ok=True)
                check_run_dir(run_dir, run_settings(s, task, encoding, seed), trust_unrecorded=trusted)
                done = run_dir / "result.json"
                if done.exists():
                    verify_weights(run_dir / "model.safetensors")
                    try:
                        json.loads(done.read_text())
                    except ValueError:
                        raise ValueError(f"--resume: {done} is not valid JSON; delete it to evaluate that run again") from None


def _run_locked(s: BenchSettings, out: Path, dev: torch.device, rank: int, progress: bool) -> dict | None:
    from .report import write_outputs
    from .summary import collect

    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "bench.json", s.to_json(), indent=2)
    corpus = load_corpus(s.data, max_bytes=s.lm_train_bytes) if "lm" in s.tasks else None
    if corpus is not None and rank == 0:
        print(f"posenc bench: corpus {corpus.describe()}", file=sys.stderr)
    records = []
    for task in s.tasks:
        for encoding in s.encodings:
            for seed in range(s.seeds):
                run_dir = _run_dir(out, task, encoding, seed)
                run_dir.mkdir(parents=True, exist_ok=True)
                records.append(run_one(s, task, encoding, seed, run_dir, corpus, dev, progress))
    if rank != 0:
        return None
    results = collect(s, records)
    write_outputs(results, out)
    return results
