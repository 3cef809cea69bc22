"""A transformers causal LM evaluated on real text: what ``bench --model`` and ``extend`` share.

* :class:`HFCausalLM`: the model behind the interface the evaluation calls, ``nll(ids)`` and
  greedy ``generate(prompts, n)``, neither keeping full logits. A real vocabulary makes them
  the largest tensor of a forward (SmolLM2: 49152 floats per position, 3.2 GB for one window
  of 16384 tokens), so ``nll`` runs the decoder to its final hidden states and the LM head on
  :data:`HEAD_CHUNK` positions at a time, and a prefill keeps the last position's logits only.
* :func:`token_stream` and :func:`token_perplexity`: a corpus's validation part in the
  checkpoint's tokens, scored in non-overlapping windows each read on its own.
* The checks made before any evaluation: :func:`check_has_rope`,
  :func:`check_finite_weights`, :func:`stated_trained_length`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..bench.data import ByteCorpus, load_corpus, load_named_corpus
from ..config import check_int
from .checkpoint import Checkpoint, trained_length

__all__ = ["HEAD_CHUNK", "HFCausalLM", "check_finite_weights", "check_has_rope", "stated_trained_length",
           "text_corpus", "token_perplexity", "token_stream"]

HEAD_CHUNK = 1024  # positions per LM-head call: (1024, V) float32 logits, 200 MB for V = 49152


def check_has_rope(config: dict[str, Any], where: str) -> None:
    """Refuse a checkpoint whose config describes no RoPE (GPT-2, BERT, ...): bench --model and
    extend measure RoPE scalings, which such a model has no place for. A multimodal config
    (Qwen2-VL, Gemma 3) keeps its language model's RoPE in ``text_config``: read there too, and an
    M-RoPE model type counts as RoPE whatever its config spells."""
    from ..rotary.mrope import MROPE_MODEL_TYPES

    model_type = config.get("model_type")
    keys = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_dim", "rotary_pct", "partial_rotary_factor")
    text = config.get("text_config")
    readings = [config] + ([text] if isinstance(text, dict) else [])
    has_rope = model_type in MROPE_MODEL_TYPES or any(
        any(c.get(k) is not None for k in keys) or c.get("position_embedding_type") == "rotary" for c in readings)
    if not has_rope:
        raise ValueError(f"{where}: model_type {model_type!r} has no RoPE (position_embedding_type / rope_theta absent): "
                         "bench --model and extend measure RoPE scalings")


def check_finite_weights(model: nn.Module, where: str) -> None:
    """Refuse weights holding NaN or inf (a corrupt file evaluates to 0 % and null perplexities)."""
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{where}: tensor {name!r} holds non-finite values (NaN/inf): the checkpoint is corrupt")


def stated_trained_length(ckpt: Checkpoint, stated: int | None) -> int:
    """L for an evaluation: the checkpoint's own trained length, or a shorter one ``stated`` for a
    quick run (``--trained-length``; longer than the checkpoint's own is refused)."""
    own = trained_length(ckpt.config)
    if stated is None:
        return own
    check_int("--trained-length", stated, minimum=2)
    if stated > own:
        raise ValueError(f"--trained-length must be at most the checkpoint's own trained length {own}, got {stated}")
    return stated


class HFCausalLM(nn.Module):
    """A transformers causal LM behind the interface the bench's evaluation calls: ``nll(ids)``
    (summed next-token loss, logits never kept for the whole window) and greedy
    ``generate(prompts, n)`` (the KV cache; the prefill keeps the last position's logits only)."""

    def __init__(self, model: nn.Module, head_chunk: int = HEAD_CHUNK):
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
    def token_losses(self, ids: Tensor) -> Tensor:
        """-log p(ids[:, t+1] | ids[:, :t+1]) for every t, (B, T-1) float32, of (B, T) ids: the
        decoder once, then the LM head on ``head_chunk`` positions at a time (the (T, V) logits
        are never held)."""
        base = self.model.base_model
        decoder = self.model.model if base is self.model else base  # Llama4ForCausalLM is its own base_model
        hidden = decoder(input_ids=ids[:, :-1], use_cache=False).last_hidden_state  # (B, T-1, C)
        losses = []
        for i in range(0, hidden.shape[1], self.head_chunk):
            logits = self.head(hidden[:, i : i + self.head_chunk])  # (B, c, V)
            target = ids[:, i + 1 : i + 1 + self.head_chunk]  # (B, c)
            # over the last (contiguous) dim, as transformers' own loss: a strided class dim sums in another order
            losses.append(F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view(target.shape))
        return torch.cat(losses, dim=1) if losses else hidden.new_zeros(ids.shape[0], 0)

    def nll(self, ids: Tensor) -> tuple[float, int]:
        """(sum of the token losses of (B, T) ``ids``, in float64; the number of predicted tokens)."""
        losses = self.token_losses(ids)
        return float(losses.double().sum()), losses.numel()

    @torch.no_grad()
    def generate(self, prompts: Tensor, n: int) -> Tensor:
        """``prompts`` (B, P) followed by ``n`` greedily decoded tokens: (B, P + n).

        The KV cache goes in and out as ``cache``, transformers 5.24's name for it (its forwards
        take ``past_key_values`` only through a shim that warns it goes in 5.40:
        ``deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")`` in
        models/llama/modeling_llama.py); the model makes its own cache (a DynamicCache, or the
        hybrid one its config asks for) on the prefill."""
        out = self.model(input_ids=prompts, use_cache=True, logits_to_keep=1)  # logits (B, 1, V)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]  # (B, 1)
        for _ in range(n - 1):
            out = self.model(input_ids=tokens[-1], cache=out.cache, use_cache=True)
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat([prompts, *tokens], dim=1)


def text_corpus(data: str | None, need: int, corpus_name: str = "code") -> ByteCorpus:
    """The corpus :func:`token_stream` reads for ``need`` tokens: ``data``, else the named corpus
    (its record is what results.json keeps of the text)."""
    # the validation split is 1/9 of max_bytes; 8 bytes per token is more than any tokenizer needs
    max_bytes = 9 * 8 * need + 9
    return load_corpus(data, max_bytes=max_bytes) if data is not None else load_named_corpus(corpus_name, max_bytes)


def token_stream(tokenizer: Any, data: str | None, need: int, corpus_name: str = "code", *,
                 asks: str = "the lm task") -> Tensor:
    """The validation split of ``data``, else of the named corpus (as in the bench) tokenized:
    at least ``need`` tokens. ``asks``: the setting that needs them, named when the text is
    too short (a huge ``--to`` is the length's fault, not the corpus's)."""
    corpus = text_corpus(data, need, corpus_name)
    ids = tokenizer.encode(bytes(corpus.val.tolist()).decode("utf-8", errors="replace"))
    if len(ids) < need:
        source = f"--data {data!r}" if data is not None else f"the {corpus_name} corpus ({corpus.source})"
        raise ValueError(f"{asks} needs {need} tokens of text; the validation part of {source} is {len(ids)}: "
                         "ask for fewer tokens, or give a larger corpus with --data")
    return torch.tensor(ids, dtype=torch.long)


def token_perplexity(lm: HFCausalLM, stream: Tensor, length: int, windows: int, *, trained: int | None = None,
                     block: int = 256, reps: int = 1000) -> dict[str, float]:
    """Perplexity on the 1-D ``stream`` cut into ``windows`` non-overlapping windows of ``length``
    tokens, each read on its own (every token but each window's first is predicted):
    ``{"ppl", "nll", "tokens", "windows", "low", "high"}``, ``low``/``high`` the 95 % block-bootstrap
    interval over the scored tokens (:func:`posenc.intervals.block_bootstrap_ppl`, blocks of
    ``block`` consecutive scored tokens). With ``trained`` = L < ``length`` - 1 (some query sits at
    a position >= L), also ``beyond``, ``beyond_low``, ``beyond_high`` and ``beyond_tokens``: the
    same over the tokens predicted by the queries at positions >= L alone, the predictions that
    attend over a distance the model was never trained on."""
    from ..intervals import block_bootstrap_ppl

    check_int("length", length, minimum=2)
    if trained is not None:
        check_int("trained", trained, minimum=1)
    windows = min(windows, len(stream) // length)
    if windows < 1:
        raise ValueError(f"the stream has {len(stream)} tokens; need at least one window of {length}")
    losses = torch.stack([lm.token_losses(stream[None, i * length : (i + 1) * length])[0]
                          for i in range(windows)]).double().cpu()  # (windows, length - 1)
    ppl, low, high = block_bootstrap_ppl(losses.flatten(), block=block, reps=reps)
    nll = float(losses.mean())
    out = {"ppl": ppl, "nll": nll, "tokens": losses.numel(), "windows": windows, "low": low, "high": high}
    if trained is not None and trained < length - 1:  # some query sits at a position >= L
        past = losses[:, trained:]  # loss t: the query at position t, whose keys reach distance t (>= L: untrained)
        b, b_low, b_high = block_bootstrap_ppl(past.flatten(), block=block, reps=reps)
        out |= {"beyond": b, "beyond_low": b_low, "beyond_high": b_high, "beyond_tokens": past.numel()}
    return out
