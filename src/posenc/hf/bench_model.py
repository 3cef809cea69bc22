"""``posenc bench --model MODEL_DIR``: a checkpoint's own length generalization, measured.

No training: the checkpoint is evaluated at and beyond the length it was trained at,
L = ``original_max_position_embeddings`` or ``max_position_embeddings``:

* **passkey** retrieval (Mohtashami & Jaggi 2023, in the text form of LongLoRA's
  evaluation): filler sentences with ``The pass key is 12345. Remember it.`` hidden at a
  depth, then ``What is the pass key? The pass key is``; the example is right when greedy
  decoding gives exactly the key's tokens. Every prompt is exactly ``length`` tokens of the
  checkpoint's own tokenizer (or the byte-level fallback, see :mod:`.checkpoint`), at the
  lengths ``f * L`` for the preset's ``passkey_eval_factors`` and its depths;
* **lm**: perplexity on a local corpus (``--data``, default the Python standard library's
  sources, as the synthetic bench's lm task) at ``f * L`` for the preset's
  ``lm_eval_factors`` (1x, 2x, 4x, 8x), scored as :func:`posenc.bench.evaluate.perplexity`
  (non-overlapping windows, each on its own).

Beyond L, the same model is also evaluated with each training-free RoPE scaling, switched
in place by :func:`posenc.hf.patch.patch_model` (``factor = length / L``,
``original_max_position_embeddings = L``; dynamic NTK: factor 1, as it scales by the current
length itself) and switched back by ``unpatch_model``: no reload.

The output folder has the synthetic bench's layout and files (``bench.json``,
``runs/TASK/MODEL/seed0/``, ``results.json``, ``results.csv``, ``plots/*.png``) and format,
so ``posenc report --bench`` and :func:`posenc.bench.report.format_table` read it. Resume:
each (task, variant) is written to ``runs/TASK/MODEL/seed0/variants/VARIANT.json`` when it
finishes and is not recomputed with ``--resume``; ``bench.json`` records the checkpoint's
fingerprint (config and safetensors headers), so a resume on a replaced checkpoint is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import check_choice, check_int, check_positive, check_range
from ..bench.data import load_corpus
from ..bench.evaluate import exact_match, perplexity
from ..bench.tasks import Example, Task
from .checkpoint import Checkpoint, fingerprint, load_model, load_tokenizer, open_checkpoint, trained_length

__all__ = ["MODEL_SCALINGS", "ModelBenchSettings", "TextPasskey", "HFCausalLM", "model_settings", "run_model_bench"]

#: training-free scalings evaluated beyond L (LongRoPE is left out: its factors are searched per model).
MODEL_SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3")
MODEL_TASKS = ("passkey", "lm")
_PRESET_SCALINGS = {"micro": ("linear",)}  # the smoke preset: one scaling; others: all


@dataclass(frozen=True)
class ModelBenchSettings:
    """Everything that determines the numbers of ``bench --model`` (stored in bench.json)."""

    model: str
    fingerprint: str
    trained_length: int
    tasks: tuple[str, ...] = MODEL_TASKS
    dtype: str = "float32"
    passkey_eval_factors: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    passkey_depths: tuple[float, ...] = (0.0, 0.5, 1.0)
    passkey_examples: int = 8
    lm_eval_factors: tuple[int, ...] = (1, 2, 4, 8)
    lm_eval_tokens: int = 32_768
    data: str | None = None
    scalings: tuple[str, ...] = MODEL_SCALINGS
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
            raise ValueError(f"tasks must name at least one of {', '.join(MODEL_TASKS)}")
        for t in self.tasks:
            check_choice("tasks (with --model)", t, MODEL_TASKS)
        for s in self.scalings:
            check_choice("scalings", s, MODEL_SCALINGS)
        check_choice("dtype", self.dtype, ("float32", "bfloat16"))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def comparable(self) -> dict[str, Any]:
        """The settings that must match to resume (the task list may grow)."""
        d = self.to_json()
        for k in ("tasks", "seeds"):
            d.pop(k)
        return json.loads(json.dumps(d))


_EVAL_FIELDS = ("passkey_eval_factors", "passkey_depths", "passkey_examples", "lm_eval_factors", "lm_eval_tokens",
                "scalings", "eval_seed")


def model_settings(preset: str, model_dir: str | Path, *, tasks: list[str] | None = None, data: str | None = None,
                   bf16: bool = False, overrides: dict[str, Any] | None = None) -> tuple[ModelBenchSettings, Checkpoint]:
    """Settings for ``model_dir`` with the lengths, depths and sizes of the bench preset
    ``preset`` (lengths as multiples of the checkpoint's trained length), then ``overrides``
    (fields of :data:`_EVAL_FIELDS`)."""
    from ..bench.runner import PRESETS

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    unknown = sorted(set(overrides or {}) - set(_EVAL_FIELDS))
    if unknown:
        raise ValueError(f"overrides: {', '.join(unknown)} not an evaluation setting; valid: {', '.join(_EVAL_FIELDS)}")
    ckpt = open_checkpoint(model_dir)
    p = PRESETS[preset]
    base = {k: p[k] for k in ("passkey_eval_factors", "passkey_depths", "passkey_examples", "lm_eval_factors",
                               "lm_eval_tokens") if k in p}
    if tasks:
        for t in tasks:
            if t not in MODEL_TASKS:
                raise ValueError(f"--tasks with --model: unknown task {t!r}; valid tasks: {', '.join(MODEL_TASKS)}")
        base["tasks"] = tuple(dict.fromkeys(tasks))
    s = ModelBenchSettings(
        model=str(ckpt.path.resolve()), fingerprint=fingerprint(ckpt), trained_length=trained_length(ckpt.config),
        dtype="bfloat16" if bf16 else "float32", data=data,
        **(base | {"scalings": _PRESET_SCALINGS.get(preset, MODEL_SCALINGS)} | dict(overrides or {})),
    )
    return s, ckpt


# --------------------------------------------------------------------------- passkey in text

_INTRO = "There is a pass key hidden in this text. Find it and remember it."
_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_KEY = " The pass key is {key}. Remember it. {key} is the pass key."
_QUESTION = " What is the pass key? The pass key is"


class TextPasskey(Task):
    """Passkey retrieval written as text and tokenized by the checkpoint's tokenizer.

    ``length`` is the whole prompt in tokens (BOS, intro, filler with the key sentence at
    ``depth`` of the filler, question); the target is the key's tokens, ``" 12345"`` encoded
    on its own. Keys are 5-digit numbers whose target has the tokenizer's usual length for
    one (so a batch has equal-length targets).
    """

    name = "passkey"

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.vocab_size = tokenizer.vocab_size  # Task.sample checks every token against it
        bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
        self.head = bos + tokenizer.encode(_INTRO)
        self.unit = tokenizer.encode(_FILLER)
        self.question = tokenizer.encode(_QUESTION)
        self.target_len = len(tokenizer.encode(" 12345"))
        longest_key = max(len(tokenizer.encode(_KEY.format(key=k))) for k in ("12345", "99999", "10000"))
        # at least one filler unit besides the fixed parts
        self.min_length = len(self.head) + longest_key + 2 + len(self.question) + len(self.unit)

    def _key(self, rng: random.Random) -> str:
        for _ in range(1000):
            key = str(rng.randrange(10_000, 100_000))
            if len(self.tok.encode(" " + key)) == self.target_len:
                return key
        raise ValueError("the tokenizer encodes no sampled 5-digit key in the usual number of tokens")

    def make(self, n: int, rng: random.Random, depth: float | None = None) -> Example:
        if depth is None:
            depth = rng.random()
        key = self._key(rng)
        key_ids = self.tok.encode(_KEY.format(key=key))
        n_fill = n - len(self.head) - len(key_ids) - len(self.question)
        filler = (self.unit * (n_fill // len(self.unit) + 1))[:n_fill]
        # the key sentence goes between filler sentences: `before` rounded to a whole unit
        before = min(n_fill, round(depth * n_fill / len(self.unit)) * len(self.unit))
        prompt = self.head + filler[:before] + key_ids + filler[before:] + self.question
        assert len(prompt) == n, (len(prompt), n)
        return Example(tuple(prompt), tuple(self.tok.encode(" " + key)))

    def prompt_length(self, length: int) -> int:
        return length

    def target_length(self, length: int) -> int:
        return self.target_len


# --------------------------------------------------------------------------- the model


class HFCausalLM(nn.Module):
    """A transformers causal LM behind the interface the bench's evaluation calls:
    ``forward(ids) -> logits`` and greedy ``generate(prompts, n)`` (with the KV cache)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor) -> Tensor:
        return self.model(input_ids=ids, use_cache=False).logits  # (B, T, V)

    @torch.no_grad()
    def generate(self, prompts: Tensor, n: int) -> Tensor:
        """``prompts`` (B, P) followed by ``n`` greedily decoded tokens: (B, P + n)."""
        out = self.model(input_ids=prompts, use_cache=True)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]  # (B, 1)
        for _ in range(n - 1):
            out = self.model(input_ids=tokens[-1], past_key_values=out.past_key_values, use_cache=True)
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat([prompts, *tokens], dim=1)


@contextlib.contextmanager
def _variant(model: nn.Module, variant: str, factor: float, L: int):
    """The model with RoPE scaling ``variant`` patched in for the duration (base: as loaded)."""
    if variant == "base":
        yield
        return
    from .patch import patch_model, unpatch_model

    params = {"factor": 1.0 if variant == "dynamic" else float(factor)}
    if variant not in ("linear", "ntk"):
        params["original_max_position_embeddings"] = L
    patch_model(model, scaling=variant, **params)
    try:
        yield
    finally:
        unpatch_model(model)


# --------------------------------------------------------------------------- the run


def _token_stream(tokenizer: Any, data: str | None, need: int) -> Tensor:
    """The validation split of ``data`` (as in the bench) tokenized: at least ``need`` tokens."""
    # the validation split is 1/9 of max_bytes; 8 bytes per token is more than any tokenizer needs
    corpus = load_corpus(data, max_bytes=9 * 8 * need + 9)
    ids = tokenizer.encode(bytes(corpus.val.tolist()).decode("utf-8", errors="replace"))
    if len(ids) < need:
        raise ValueError(f"--data: the validation part of {corpus.source!r} is {len(ids)} tokens; the lm task needs "
                         f"at least {need} (one window at the longest length): give a larger corpus")
    return torch.tensor(ids, dtype=torch.long)


def _lengths(s: ModelBenchSettings, task: str, passkey: TextPasskey | None) -> list[int]:
    L = s.trained_length
    if task == "lm":
        return sorted({round(f * L) for f in s.lm_eval_factors})
    assert passkey is not None
    lengths = sorted({round(f * L) for f in s.passkey_eval_factors})
    short = [n for n in lengths if n < passkey.min_length]
    if short:
        print(f"posenc bench: passkey lengths {short} are shorter than a passkey prompt "
              f"({passkey.min_length} tokens): skipped", file=sys.stderr)
    lengths = [n for n in lengths if n >= passkey.min_length]
    if not lengths:
        raise ValueError(f"every passkey length ({', '.join(str(round(f * L)) for f in s.passkey_eval_factors)}) is "
                         f"shorter than a passkey prompt ({passkey.min_length} tokens); use --tasks lm")
    return lengths


def _evaluate_variant(lm: HFCausalLM, s: ModelBenchSettings, task: str, variant: str, lengths: list[int],
                      passkey: TextPasskey | None, stream: Tensor | None, bar: Any) -> list[dict]:
    L = s.trained_length
    points = []
    for n in lengths:
        if variant != "base" and n <= L:
            continue  # scalings are for lengths beyond L
        with _variant(lm.model, variant, n / L, L):
            if task == "lm":
                assert stream is not None
                r = perplexity(lm, stream, n, max_windows=max(1, s.lm_eval_tokens // n), batch_size=1)
                points.append(dict(variant=variant, length=n, depth=None, value=r["ppl"]))
                bar.update()
            else:
                assert passkey is not None
                for d in s.passkey_depths:
                    acc = exact_match(lm, passkey, n, s.passkey_examples, eval_seed=s.eval_seed, depth=d, batch_size=8)
                    points.append(dict(variant=variant, length=n, depth=d, value=acc))
                    bar.update()
    return points


def run_model_bench(s: ModelBenchSettings, out: str | Path, *, resume: bool = False, overwrite: bool = False,
                    progress: bool = True, device: str | None = None, model: nn.Module | None = None) -> dict:
    """Evaluate the checkpoint of ``s`` into ``out`` (module docstring); returns results.json's content.

    ``model``: the already loaded transformers model (tests); else loaded in ``s.dtype``.
    """
    from ..progress import bar as progress_bar

    from ..bench.files import OutDirLock, write_json
    from ..bench.report import collect, read_record, write_outputs
    from ..bench.runner import check_out_dir, check_run_dir

    out = Path(out)
    ckpt = open_checkpoint(s.model)
    if fingerprint(ckpt) != s.fingerprint:
        raise ValueError(f"MODEL_DIR {s.model!r} changed since these settings were made (its config or weights' headers)")
    dev = device or "cpu"
    with OutDirLock(out):
        trusted = check_out_dir(out, s, resume=resume, overwrite=overwrite)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "bench.json", s.to_json(), indent=2)
        tokenizer = load_tokenizer(ckpt)
        if model is None:
            model = load_model(ckpt, torch.bfloat16 if s.dtype == "bfloat16" else torch.float32, device=dev,
                               progress=progress)
        lm = HFCausalLM(model).eval()
        has_patch = _has_patch()
        records = []
        for task in s.tasks:
            run_dir = out / "runs" / task / ckpt.name / "seed0"
            run_dir.mkdir(parents=True, exist_ok=True)
            check_run_dir(run_dir, dict(s.comparable(), task=task, encoding=ckpt.name, seed=0), trust_unrecorded=trusted)
            done = run_dir / "result.json"
            if done.exists():
                records.append(read_record(done))
                continue
            passkey = TextPasskey(tokenizer) if task == "passkey" else None
            lengths = _lengths(s, task, passkey)
            stream = None
            if task == "lm":
                stream = _token_stream(tokenizer, s.data, max(lengths) + 1).to(dev)
            variants = ["base"] + (list(s.scalings) if any(n > s.trained_length for n in lengths) else [])
            if len(variants) > 1 and not has_patch:
                print("posenc bench: RoPE scalings need posenc.hf.patch_model, not in this build: base model only",
                      file=sys.stderr)
                variants = ["base"]
            points: list[dict] = []
            vdir = run_dir / "variants"
            vdir.mkdir(exist_ok=True)
            per_len = len(s.passkey_depths) if task == "passkey" else 1
            total = sum(per_len * sum(1 for n in lengths if v == "base" or n > s.trained_length) for v in variants)
            bar = progress_bar(total, f"{task}/{ckpt.name}", enabled=progress)
            for variant in variants:
                vfile = vdir / f"{variant}.json"
                if vfile.exists():
                    vpoints = read_record(vfile)["points"]
                    bar.update(sum(per_len for n in lengths if variant == "base" or n > s.trained_length))
                else:
                    vpoints = _evaluate_variant(lm, s, task, variant, lengths, passkey, stream, bar)
                    write_json(vfile, dict(points=vpoints))
                points += vpoints
            bar.close()
            record = dict(task=task, encoding=ckpt.name, seed=0, train_length=s.trained_length,
                          metric="ppl" if task == "lm" else "accuracy", train_loss=None, train_seconds=0.0,
                          parameters=sum(p.numel() for p in model.parameters()), points=points)
            write_json(done, record)
            records.append(read_record(done))
        results = collect(s, records)
        write_outputs(results, out)
    return results


def _has_patch() -> bool:
    try:
        from .patch import patch_model  # noqa: F401
    except ImportError:
        return False
    return True


def run_from_args(args: Any) -> int:
    """``posenc bench --model DIR ...`` (called by :mod:`posenc.bench.cli`)."""
    from ..bench.report import format_table

    # the bench's size flags arrive as set_<field>; the evaluation ones apply here, the rest
    # (model size, training) do not: refused, so a flag is never silently ignored
    given = {k.removeprefix("set_"): v for k, v in vars(args).items() if k.startswith("set_") and v is not None}
    unused = [f"--{name}" for name in ("encodings", "seeds") if getattr(args, name, None) is not None]
    unused += [f"--{name.replace('_', '-')}" for name in given if name not in _EVAL_FIELDS]
    if unused:
        raise ValueError(f"{', '.join(unused)} do(es) not apply with --model (a checkpoint is evaluated, not trained); "
                         f"evaluation settings that do: {', '.join('--' + f.replace('_', '-') for f in _EVAL_FIELDS)}")
    s, _ = model_settings(args.preset, args.model, tasks=args.tasks,
                          data=None if args.data is None else str(args.data), bf16=args.bf16,
                          overrides={k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})
    results = run_model_bench(s, args.out, resume=args.resume, overwrite=args.overwrite,
                              progress=not args.no_progress, device=args.device)
    print(format_table(results))
    print(f"wrote {args.out}/results.json, results.csv and plots/")
    return 0
