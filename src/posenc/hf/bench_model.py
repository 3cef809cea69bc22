"""``posenc bench --model MODEL``: a checkpoint's own length generalization, measured.

``MODEL`` is a save_pretrained folder, a ``.gguf`` file or a named model (``smollm2-135m``,
``gemma3-270m``; see :mod:`posenc.hf.models`). No training: the checkpoint is evaluated at and
beyond the length it was trained at, L = ``original_max_position_embeddings`` or
``max_position_embeddings`` (``--trained-length`` states a shorter L for a quick run):

* **passkey** retrieval (Mohtashami & Jaggi 2023, in the text form of LongLoRA's
  evaluation): filler sentences with ``The pass key is 12345. Remember it.`` hidden at a
  depth, then ``What is the pass key? The pass key is``; the example is right when greedy
  decoding gives exactly the key's tokens. Every prompt is exactly ``length`` tokens of the
  checkpoint's own tokenizer (or the byte-level fallback, see :mod:`.checkpoint`), at the
  lengths ``f * L`` for ``passkey_eval_factors`` and its depths;
* **lm**: token perplexity on a local corpus at ``f * L`` for ``lm_eval_factors``:
  non-overlapping windows of its validation part, each on its own, every next token scored.
  ``--corpus code`` (the default) is the Python standard library's sources, as the synthetic
  bench's lm task; ``--corpus prose`` the King James Bible from a registry package
  (:data:`posenc.bench.data.PROSE`); ``--data PATH`` any text file or folder.

Memory: a real vocabulary makes full logits the largest tensor of a forward (SmolLM2: 49152
floats per position, 3.2 GB for one window of 16384 tokens), so no forward keeps them: the
perplexity runs the decoder to its final hidden states and the LM head on ``_HEAD_CHUNK``
positions at a time, and a passkey prefill asks for the last position's logits only
(``logits_to_keep=1``). Before starting, the run prints its estimated time (from one timed
forward, scaled by the FLOPs of each cell) and peak memory.

Beyond L, the same model is also evaluated with each training-free RoPE scaling of the
registry (``list_scalings(extends=True)``), switched in place by
:func:`posenc.hf.patch.patch_model` with the parameters of the scaling's own ``extension``
rule (``Scaling.at_factor``) for ``factor = length / L`` and switched back by ``unpatch_model``: no reload;
and with its RoPE base multiplied by ``raised_base`` (16 by default: the seeds' 500k -> 8M step),
the same at every length, the way a practitioner raises ``rope_theta`` without a rule.

The output folder has the synthetic bench's layout and files (``bench.json``,
``runs/TASK/MODEL/seed0/``, ``results.json``, ``results.csv``, ``plots/*.png``) and format,
so ``posenc report --bench`` reads it; the printed table is :func:`format_model_table` (tokens,
token perplexity, the model's name; one checkpoint, so no ranking). Resume: each (task,
variant) is written to ``runs/TASK/MODEL/seed0/variants/VARIANT.json`` when it finishes and is
not recomputed with ``--resume``; ``bench.json`` records the checkpoint's fingerprint (config
and safetensors headers), so a resume on a replaced checkpoint is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import check_choice, check_int, check_positive, check_range
from ..bench.data import CORPORA, PROSE, load_corpus, load_named_corpus
from ..bench.evaluate import exact_match
from ..bench.tasks import Example, Task
from ..rotary.scaling import SCALINGS, list_scalings
from .checkpoint import Checkpoint, fingerprint, load_model, load_tokenizer, open_checkpoint, trained_length

__all__ = ["MODEL_PRESETS", "MODEL_SCALINGS", "ModelBenchSettings", "TextPasskey", "HFCausalLM", "check_has_rope",
           "check_finite_weights", "estimate_cost", "format_model_table", "model_settings", "run_model_bench",
           "token_perplexity", "variant_label"]

#: training-free scalings evaluated beyond L: the registry's types with an ``extension`` rule
#: (Llama 3's included; LongRoPE has none: its factors are searched per model).
MODEL_SCALINGS = tuple(list_scalings(extends=True))
MODEL_TASKS = ("passkey", "lm")
#: the variant that multiplies the checkpoint's own RoPE base by ``raised_base`` (no rule, no factor)
RAISED_BASE = "raised_base"
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
_HEAD_CHUNK = 1024  # positions per LM-head call: (1024, V) float32 logits, 200 MB for V = 49152
_PROCESS_BYTES = 512 * 2**20  # python, torch and transformers before any weight
_BATCH_TOKENS = 8192  # passkey prompts per batch: about this many tokens (one prompt beyond it)


@dataclass(frozen=True)
class ModelBenchSettings:
    """Everything that determines the numbers of ``bench --model`` (stored in bench.json).

    ``label``: the model's name in tables (a named model's name, else the folder's);
    ``trained_length``: L, the checkpoint's own unless stated shorter for a quick run;
    ``corpus``: the lm task's text when ``data`` is None (:data:`posenc.bench.data.CORPORA`);
    ``raised_base``: the factor of the raised-base row (0: no such row)."""

    model: str
    fingerprint: str
    trained_length: int
    label: str = ""
    tasks: tuple[str, ...] = MODEL_TASKS
    dtype: str = "float32"
    passkey_eval_factors: tuple[float, ...] = MODEL_PRESETS["quick"]["passkey_eval_factors"]
    passkey_depths: tuple[float, ...] = MODEL_PRESETS["quick"]["passkey_depths"]
    passkey_examples: int = MODEL_PRESETS["quick"]["passkey_examples"]
    lm_eval_factors: tuple[float, ...] = MODEL_PRESETS["quick"]["lm_eval_factors"]
    lm_eval_tokens: int = MODEL_PRESETS["quick"]["lm_eval_tokens"]
    data: str | None = None
    corpus: str = "code"
    scalings: tuple[str, ...] = MODEL_SCALINGS
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
            raise ValueError(f"tasks must name at least one of {', '.join(MODEL_TASKS)}")
        for t in self.tasks:
            check_choice("tasks (with --model)", t, MODEL_TASKS)
        for s in self.scalings:
            check_choice("scalings (with --model: the registry's training-free scalings)", s, MODEL_SCALINGS)
        check_choice("dtype", self.dtype, ("float32", "bfloat16"))
        check_choice("corpus", self.corpus, CORPORA)
        if self.data is not None and self.corpus != "code":
            raise ValueError(f"corpus {self.corpus!r} and data {self.data!r}: give one text for the lm task, not both")
        check_range("raised_base", self.raised_base, 0.0)
        if 0 < self.raised_base <= 1:
            raise ValueError(f"raised_base must be 0 (no raised-base row) or > 1, got {self.raised_base}")

    def variants(self) -> list[str]:
        """The rows beyond L: every scaling, then the raised base."""
        return list(self.scalings) + ([RAISED_BASE] if self.raised_base else [])


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


def check_has_rope(config: dict[str, Any], where: str) -> None:
    """Refuse a checkpoint whose config describes no RoPE (GPT-2, BERT, ...): bench --model and
    extend measure RoPE scalings, which such a model has no place for."""
    model_type = config.get("model_type")
    keys = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_dim", "rotary_pct", "partial_rotary_factor")
    has_rope = any(config.get(k) is not None for k in keys) or config.get("position_embedding_type") == "rotary"
    if not has_rope:
        raise ValueError(f"{where}: model_type {model_type!r} has no RoPE (position_embedding_type / rope_theta absent): "
                         "bench --model and extend measure RoPE scalings")


def _model_trained_length(ckpt: Checkpoint, stated: int | None) -> int:
    own = trained_length(ckpt.config)
    if stated is None:
        return own
    check_int("--trained-length", stated, minimum=2)
    if stated > own:
        raise ValueError(f"--trained-length must be at most the checkpoint's own trained length {own}, got {stated}")
    return stated


def model_settings(preset: str, model: str | Path, *, tasks: list[str] | None = None, data: str | None = None,
                   corpus: str = "code", raised_base: float | None = None, bf16: bool = False,
                   overrides: dict[str, Any] | None = None, trained_length: int | None = None,
                   install: bool = True) -> tuple[ModelBenchSettings, Checkpoint]:
    """Settings for ``model`` (a folder, a .gguf file or a named model: :func:`posenc.hf.models.resolve_model`)
    with the sizes of :data:`MODEL_PRESETS` [``preset``] (the synthetic bench's for ``micro``;
    lengths as multiples of L), then ``overrides`` (fields of :data:`_EVAL_FIELDS`).
    ``trained_length``: a shorter L than the checkpoint's own (a quick run); ``corpus``: the lm
    task's named corpus (``code``, ``prose``); ``raised_base``: the raised-base row's factor
    (None: 16; 0: no such row)."""
    from ..bench.settings import PRESETS
    from .models import MODELS, resolve_model

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    unknown = sorted(set(overrides or {}) - set(_EVAL_FIELDS))
    if unknown:
        raise ValueError(f"overrides: {', '.join(unknown)} not an evaluation setting; valid: {', '.join(_EVAL_FIELDS)}")
    if tasks:
        for t in tasks:
            if t not in MODEL_TASKS:
                raise ValueError(f"--tasks with --model: unknown task {t!r}; valid tasks: {', '.join(MODEL_TASKS)}")
    if corpus == "prose" and (not tasks or "lm" in tasks):
        load_named_corpus(corpus, max_bytes=1)  # a missing package: its install command, before loading a model
    ckpt = open_checkpoint(resolve_model(model, install=install))
    check_has_rope(ckpt.config, f"MODEL {str(model)!r}")
    fields = ("passkey_eval_factors", "passkey_depths", "passkey_examples", "lm_eval_factors", "lm_eval_tokens")
    if preset in MODEL_PRESETS:
        base = dict(MODEL_PRESETS[preset])
    else:  # the smoke preset: the synthetic bench's sizes, one scaling
        base = {k: PRESETS[preset][k] for k in fields if k in PRESETS[preset]}
        base["scalings"] = tuple(s for s in PRESETS[preset].get("scalings", MODEL_SCALINGS) if s in MODEL_SCALINGS)
    if tasks:
        base["tasks"] = tuple(dict.fromkeys(tasks))
    name = str(model)
    s = ModelBenchSettings(
        model=str(ckpt.path.resolve()), fingerprint=fingerprint(ckpt),
        trained_length=_model_trained_length(ckpt, trained_length),
        label=name if name in MODELS else ckpt.name, dtype="bfloat16" if bf16 else "float32", data=data, corpus=corpus,
        **({} if raised_base is None else dict(raised_base=raised_base)),
        **(base | dict(overrides or {})),
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
    """A transformers causal LM behind the interface the bench's evaluation calls: ``nll(ids)``
    (summed next-token loss, logits never kept for the whole window) and greedy
    ``generate(prompts, n)`` (the KV cache; the prefill keeps the last position's logits only)."""

    def __init__(self, model: nn.Module, head_chunk: int = _HEAD_CHUNK):
        super().__init__()
        self.model = model
        check_int("head_chunk", head_chunk, minimum=1)
        self.head_chunk = head_chunk
        cfg = getattr(model.config, "get_text_config", lambda: model.config)()
        self.softcap = getattr(cfg, "final_logit_softcapping", None)  # Gemma 2: tanh cap on the logits

    def head(self, hidden: Tensor) -> Tensor:
        """Logits (..., V) float32 of final hidden states (..., C), as the model's own forward makes them."""
        logits = self.model.get_output_embeddings()(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @torch.no_grad()
    def nll(self, ids: Tensor) -> tuple[float, int]:
        """(sum of -log p(ids[:, t+1] | ids[:, :t+1]) over t, number of predicted tokens) for (B, T) ids:
        the decoder once, then the LM head on ``head_chunk`` positions at a time."""
        base = self.model.base_model
        decoder = self.model.model if base is self.model else base  # Llama4ForCausalLM is its own base_model
        hidden = decoder(input_ids=ids[:, :-1], use_cache=False).last_hidden_state  # (B, T-1, C)
        total = 0.0
        for i in range(0, hidden.shape[1], self.head_chunk):
            logits = self.head(hidden[:, i : i + self.head_chunk])  # (B, c, V)
            target = ids[:, i + 1 : i + 1 + self.head_chunk]  # (B, c)
            total += float(F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum").double())
        return total, ids[:, 1:].numel()

    @torch.no_grad()
    def generate(self, prompts: Tensor, n: int) -> Tensor:
        """``prompts`` (B, P) followed by ``n`` greedily decoded tokens: (B, P + n)."""
        out = self.model(input_ids=prompts, use_cache=True, logits_to_keep=1)  # logits (B, 1, V)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]  # (B, 1)
        for _ in range(n - 1):
            out = self.model(input_ids=tokens[-1], past_key_values=out.past_key_values, use_cache=True)
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat([prompts, *tokens], dim=1)


def token_perplexity(lm: HFCausalLM, stream: Tensor, length: int, windows: int) -> dict[str, float]:
    """Perplexity on the 1-D ``stream`` cut into ``windows`` non-overlapping windows of ``length``
    tokens, each read on its own (every token but each window's first is predicted):
    ``{"ppl", "nll", "tokens", "windows"}``, as :func:`posenc.bench.evaluate.perplexity`."""
    check_int("length", length, minimum=2)
    windows = min(windows, len(stream) // length)
    if windows < 1:
        raise ValueError(f"the stream has {len(stream)} tokens; need at least one window of {length}")
    total, count = 0.0, 0
    for i in range(windows):
        t, c = lm.nll(stream[None, i * length : (i + 1) * length])
        total, count = total + t, count + c
    nll = total / count
    return {"ppl": math.exp(nll), "nll": nll, "tokens": count, "windows": windows}


def check_finite_weights(model: nn.Module, where: str) -> None:
    """Refuse weights holding NaN or inf (a corrupt file evaluates to 0 % and null perplexities)."""
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{where}: tensor {name!r} holds non-finite values (NaN/inf): the checkpoint is corrupt")


def scaling_params(variant: str, factor: float, L: int) -> dict[str, Any]:
    """The parameters that evaluate a model trained at ``L`` at ``factor * L`` with ``variant``
    (the scaling's own rule in the registry, :meth:`~posenc.rotary.scaling.Scaling.at_factor`)."""
    return SCALINGS[variant].at_factor(float(factor), int(L))


@contextlib.contextmanager
def _variant(model: nn.Module, variant: str, factor: float, L: int, raised_base: float = 0.0):
    """The model with RoPE scaling ``variant`` patched in for the duration (base: as loaded;
    :data:`RAISED_BASE`: the model's own RoPE with its base times ``raised_base``).

    GPT-J's own sin/cos table ends at ``n_positions`` (transformers indexes past it at 2L), so
    its base is posenc's RoPE with the model's own frequencies and no scaling (``default``),
    which equals the loaded model's logits up to float32 rounding (tests/test_hf_patch.py)."""
    if variant == "base" and getattr(model.config, "model_type", None) != "gptj":
        yield
        return
    from .patch import patch_model, unpatch_model

    if variant == "base":
        patch_model(model, scaling="default")
    elif variant == RAISED_BASE:
        from ..rotary import from_hf

        patch_model(model, base=from_hf(model.config).config.base * raised_base)
    else:
        patch_model(model, scaling=variant, **scaling_params(variant, factor, L))
    try:
        yield
    finally:
        unpatch_model(model)


def _sizes(cfg: dict[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    """(width C, layers, heads, head dim D, key/value heads, MLP width, vocabulary) of a Llama-style
    config.json (or GPT-J's n_embd / n_layer / n_head / n_inner), with the defaults transformers
    uses where a key is absent."""
    C = int(cfg.get("hidden_size") or cfg.get("n_embd") or 0)
    heads = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 1)
    return (C, int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0), heads,
            int(cfg.get("head_dim") or C // heads), int(cfg.get("num_key_value_heads") or heads),
            int(cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * C), int(cfg.get("vocab_size") or 0))


def _forward_flops(cfg: dict[str, Any], n: int, scored: int) -> float:
    """FLOPs of one forward over ``n`` tokens with ``scored`` positions through the LM head:
    2 per weight per token in the decoder, causal attention 2 n^2 (H * D) per layer, the head."""
    C, layers, heads, D, kv, inter, V = _sizes(cfg)
    per_layer = C * (heads * D) * 2 + C * (kv * D) * 2 + 3 * C * inter
    return 2.0 * layers * per_layer * n + 2.0 * layers * n * n * heads * D + 2.0 * C * V * scored


def _peak_bytes(cfg: dict[str, Any], n: int, batch: int, weights: int, item: int) -> int:
    """Peak memory of one forward over (batch, n): the interpreter and libraries, the weights, the
    KV cache of every layer, one layer's activations (the MLP's three (n, intermediate) tensors)
    and one head chunk's logits with their log-softmax (the largest term up to a few thousand
    tokens: 400 MB for SmolLM2; measured by benchmarks/real_speed.py)."""
    C, layers, heads, D, kv, inter, V = _sizes(cfg)
    cache = 2 * layers * n * kv * D * item * batch
    act = batch * n * (3 * inter + 6 * C + 2 * heads * D) * item
    return _PROCESS_BYTES + weights + cache + act + 8 * batch * min(n, _HEAD_CHUNK) * V


def estimate_cost(lm: HFCausalLM, cfg: dict[str, Any], cells: list[tuple[int, int, int]]) -> tuple[float, int, float]:
    """(seconds, peak bytes, measured FLOP/s) for ``cells`` = [(tokens, batch, scored positions)],
    the rate measured on one forward of 256 tokens (a lower bound of the rate at length: the
    estimate errs long)."""
    n0 = min(256, int(cfg.get("max_position_embeddings") or cfg.get("n_positions") or 256))  # GPT-J: n_positions
    ids = torch.zeros(1, n0, dtype=torch.long, device=next(lm.model.parameters()).device)
    lm.nll(ids[:, :16])  # the first call of a fresh model allocates and initializes: not timed
    t0 = time.perf_counter()
    lm.nll(ids)
    rate = _forward_flops(cfg, n0, n0) / max(time.perf_counter() - t0, 1e-6)
    seconds = sum(b * _forward_flops(cfg, n, k) for n, b, k in cells) / rate
    p = next(lm.model.parameters())
    weights = sum(t.numel() * t.element_size() for t in lm.model.parameters())
    peak = max((_peak_bytes(cfg, n, b, weights, p.element_size()) for n, b, _ in cells), default=weights)
    return seconds, peak, rate


# --------------------------------------------------------------------------- the run


def _token_stream(tokenizer: Any, data: str | None, need: int, corpus_name: str = "code") -> Tensor:
    """The validation split of ``data``, else of the named corpus (as in the bench) tokenized:
    at least ``need`` tokens."""
    # the validation split is 1/9 of max_bytes; 8 bytes per token is more than any tokenizer needs
    max_bytes = 9 * 8 * need + 9
    corpus = load_corpus(data, max_bytes=max_bytes) if data is not None else load_named_corpus(corpus_name, max_bytes)
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


def _passkey_batch(n: int) -> int:
    return max(1, _BATCH_TOKENS // n)  # a batch of passkey prompts holds about _BATCH_TOKENS tokens


def _cells(s: ModelBenchSettings, task: str, variants: list[str], lengths: list[int],
           passkey: TextPasskey | None, stream_len: int) -> list[tuple[int, int, int]]:
    """(tokens, batch, scored positions) of every forward the task will run (for the estimate)."""
    cells = []
    for v in variants:
        for n in lengths:
            if v != "base" and n <= s.trained_length:
                continue
            if task == "lm":
                w = min(max(1, s.lm_eval_tokens // n), stream_len // n)
                cells += [(n, 1, n)] * w
            else:
                b = _passkey_batch(n)
                per_depth = -(-s.passkey_examples // b)
                cells += [(n, min(b, s.passkey_examples), 1)] * per_depth * len(s.passkey_depths)
    return cells


def _evaluate_variant(lm: HFCausalLM, s: ModelBenchSettings, task: str, variant: str, lengths: list[int],
                      passkey: TextPasskey | None, stream: Tensor | None, bar: Any) -> list[dict]:
    L = s.trained_length
    points = []
    for n in lengths:
        if variant != "base" and n <= L:
            continue  # scalings are for lengths beyond L
        with _variant(lm.model, variant, n / L, L, s.raised_base):
            if task == "lm":
                assert stream is not None
                r = token_perplexity(lm, stream, n, windows=max(1, s.lm_eval_tokens // n))
                points.append(dict(variant=variant, length=n, depth=None, value=r["ppl"]))
                bar.update()
            else:
                assert passkey is not None
                for d in s.passkey_depths:
                    acc = exact_match(lm, passkey, n, s.passkey_examples, eval_seed=s.eval_seed, depth=d,
                                      batch_size=_passkey_batch(n))
                    points.append(dict(variant=variant, length=n, depth=d, value=acc))
                    bar.update()
    return points


def run_model_bench(s: ModelBenchSettings, out: str | Path, *, resume: bool = False, overwrite: bool = False,
                    progress: bool = True, device: str | None = None, model: nn.Module | None = None) -> dict:
    """Evaluate the checkpoint of ``s`` into ``out`` (module docstring); returns results.json's content.

    ``model``: the already loaded transformers model (tests); else loaded in ``s.dtype``.
    """
    from ..progress import bar as progress_bar

    from ..files import OutDirLock, write_json
    from ..bench.report import write_outputs
    from ..bench.summary import collect, read_record
    from ..bench.runs import check_out_dir, check_run_dir

    out = Path(out)
    ckpt = open_checkpoint(s.model)
    if fingerprint(ckpt) != s.fingerprint:
        raise ValueError(f"MODEL {s.model!r} changed since these settings were made (its config or weights' headers)")
    check_has_rope(ckpt.config, f"MODEL {s.model!r}")
    label = s.label or ckpt.name
    dev = device or "cpu"
    with OutDirLock(out):
        trusted = check_out_dir(out, s, resume=resume, overwrite=overwrite)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "bench.json", s.to_json(), indent=2)
        tokenizer = load_tokenizer(ckpt)
        if model is None:
            model = load_model(ckpt, torch.bfloat16 if s.dtype == "bfloat16" else torch.float32, device=dev,
                               progress=progress)
        check_finite_weights(model, f"MODEL {s.model!r}")
        lm = HFCausalLM(model).eval()
        has_patch = _has_patch()
        records, plans, cells = [], [], []
        for task in s.tasks:
            run_dir = out / "runs" / task / label / "seed0"
            run_dir.mkdir(parents=True, exist_ok=True)
            check_run_dir(run_dir, dict(s.comparable(), task=task, encoding=label, seed=0), trust_unrecorded=trusted)
            done = run_dir / "result.json"
            if done.exists():
                records.append(read_record(done))
                continue
            passkey = TextPasskey(tokenizer) if task == "passkey" else None
            lengths = _lengths(s, task, passkey)
            stream = None
            if task == "lm":
                stream = _token_stream(tokenizer, s.data, max(lengths) + 1, s.corpus).to(dev)
            variants = ["base"] + (s.variants() if any(n > s.trained_length for n in lengths) else [])
            if len(variants) > 1 and not has_patch:
                print("posenc bench: RoPE scalings need posenc.hf.patch_model, not in this build: base model only",
                      file=sys.stderr)
                variants = ["base"]
            todo = [v for v in variants if not (run_dir / "variants" / f"{v}.json").exists()]
            cells += _cells(s, task, todo, lengths, passkey, 0 if stream is None else len(stream))
            plans.append((task, run_dir, passkey, lengths, stream, variants))
        if cells:
            seconds, peak, rate = estimate_cost(lm, ckpt.config, cells)
            print(f"posenc bench: {label}: {len(cells)} forwards of up to {max(n for n, _, _ in cells)} tokens; "
                  f"estimated {seconds / 60:.1f} min at {rate / 1e9:.0f} GFLOP/s (measured here), "
                  f"peak memory about {peak / 2**30:.2f} GiB", file=sys.stderr, flush=True)
        for task, run_dir, passkey, lengths, stream, variants in plans:
            points: list[dict] = []
            vdir = run_dir / "variants"
            vdir.mkdir(exist_ok=True)
            per_len = len(s.passkey_depths) if task == "passkey" else 1
            total = sum(per_len * sum(1 for n in lengths if v == "base" or n > s.trained_length) for v in variants)
            bar = progress_bar(total, f"{task}/{label}", enabled=progress)
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
            record = dict(task=task, encoding=label, seed=0, train_length=s.trained_length,
                          metric="ppl" if task == "lm" else "accuracy", train_loss=None, train_seconds=0.0,
                          parameters=sum(p.numel() for p in model.parameters()), points=points)
            write_json(run_dir / "result.json", record)
            records.append(read_record(run_dir / "result.json"))
        records.sort(key=lambda r: s.tasks.index(r["task"]))
        results = collect(s, records)
        write_outputs(results, out)
    return results


def _has_patch() -> bool:
    try:
        from .patch import patch_model  # noqa: F401
    except ImportError:
        return False
    return True


def variant_label(settings: dict[str, Any], variant: str) -> str:
    """A scaled row's name (``YaRN``, ``base x16``) from results.json's settings."""
    if variant == RAISED_BASE:
        return f"base x{settings['raised_base']:g}"
    return SCALINGS[variant].label


def _corpus_name(settings: dict[str, Any]) -> str:
    if settings.get("data"):
        return settings["data"]
    return PROSE.title if settings.get("corpus") == "prose" else "the Python standard library sources"


def format_model_table(results: dict[str, Any]) -> str:
    """The results of one checkpoint in its own units: token perplexity and passkey accuracy
    (mean over depths) per variant and length; rows are the model itself and each scaling."""
    s = results["settings"]
    L = s["trained_length"]
    label = s.get("label") or Path(s["model"]).name
    lines = []
    for run in results["runs"]:
        task, pts = run["task"], run["points"]
        lengths = sorted({p["length"] for p in pts})
        variants = list(dict.fromkeys(p["variant"] for p in pts))
        cells: dict[tuple[str, int], list[float]] = {}
        for p in pts:
            cells.setdefault((p["variant"], p["length"]), []).append(p["value"])
        if task == "lm":
            what = f"token perplexity (lower is better) on {_corpus_name(s)}"
        else:
            what = (f"passkey accuracy, % (mean of depths {', '.join(f'{d:g}' for d in s['passkey_depths'])}; "
                    f"{s['passkey_examples']} example(s) per depth)")
        lines.append(f"{label}: {what}; L = {L} tokens")
        heads = [f"{n / L:g}L={n}" for n in lengths]
        names = {v: label if v == "base" else f"+ {variant_label(s, v)}" for v in variants}
        width = max(len(n) for n in names.values())
        lines.append(f"{'':<{width}}  " + "  ".join(f"{h:>12}" for h in heads))
        for v in variants:
            row = []
            for n in lengths:
                vals = cells.get((v, n))
                if not vals:
                    row.append(f"{'-':>12}")
                elif task == "lm":
                    row.append(f"{vals[0]:>12.3f}" if vals[0] is not None else f"{'nan':>12}")
                else:
                    row.append(f"{100 * sum(vals) / len(vals):>12.0f}")
            lines.append(f"{names[v]:<{width}}  " + "  ".join(row))
        lines.append("")
    return "\n".join(lines).rstrip()


def run_from_args(args: Any) -> int:
    """``posenc bench --model MODEL ...`` (called by :mod:`posenc.cli.bench`)."""
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
                          corpus=args.corpus or "code", raised_base=args.raised_base,
                          overrides={k: tuple(v) if isinstance(v, list) else v for k, v in given.items()},
                          trained_length=getattr(args, "trained_length", None),
                          install=not getattr(args, "no_install", False))
    results = run_model_bench(s, args.out, resume=args.resume, overwrite=args.overwrite,
                              progress=not args.no_progress, device=args.device)
    print(format_model_table(results))
    print(f"wrote {args.out}/results.json, results.csv and plots/")
    return 0
