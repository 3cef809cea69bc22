"""What an evaluation of a checkpoint will cost, said before it starts: time from the FLOPs of
each forward at a rate measured here on one short forward, and peak memory from the config's
sizes (checked against measurements by benchmarks/real_speed.py).

A forward is a cell ``(tokens, batch, scored positions)``: ``scored`` positions go through the
LM head (every position for perplexity, the last one for a generation's prefill).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .evaluation import HEAD_CHUNK, HFCausalLM

__all__ = ["PROCESS_BYTES", "estimate_cost", "forward_flops", "peak_bytes"]

PROCESS_BYTES = 512 * 2**20  # python, torch and transformers before any weight


def _sizes(cfg: dict[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    """(width C, layers, heads, head dim D, key/value heads, MLP width, vocabulary) of a Llama-style
    config.json (or GPT-J's n_embd / n_layer / n_head / n_inner), with the defaults transformers
    uses where a key is absent."""
    C = int(cfg.get("hidden_size") or cfg.get("n_embd") or 0)
    heads = int(cfg.get("num_attention_heads") or cfg.get("n_head") or 1)
    return (C, int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0), heads,
            int(cfg.get("head_dim") or C // heads), int(cfg.get("num_key_value_heads") or heads),
            int(cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * C), int(cfg.get("vocab_size") or 0))


def forward_flops(cfg: dict[str, Any], n: int, scored: int) -> float:
    """FLOPs of one forward over ``n`` tokens with ``scored`` positions through the LM head:
    2 per weight per token in the decoder, causal attention 2 n^2 (H * D) per layer, the head."""
    C, layers, heads, D, kv, inter, V = _sizes(cfg)
    per_layer = C * (heads * D) * 2 + C * (kv * D) * 2 + 3 * C * inter
    return 2.0 * layers * per_layer * n + 2.0 * layers * n * n * heads * D + 2.0 * C * V * scored


def peak_bytes(cfg: dict[str, Any], n: int, batch: int, weights: int, item: int) -> int:
    """Peak memory of one forward over (batch, n): the interpreter and libraries, the weights, the
    KV cache of every layer, one layer's activations (the MLP's three (n, intermediate) tensors)
    and one head chunk's logits with their log-softmax (the largest term up to a few thousand
    tokens: 400 MB for SmolLM2; measured by benchmarks/real_speed.py)."""
    C, layers, heads, D, kv, inter, V = _sizes(cfg)
    cache = 2 * layers * n * kv * D * item * batch
    act = batch * n * (3 * inter + 6 * C + 2 * heads * D) * item
    return PROCESS_BYTES + weights + cache + act + 8 * batch * min(n, HEAD_CHUNK) * V


def estimate_cost(lm: HFCausalLM, cfg: dict[str, Any], cells: list[tuple[int, int, int]]) -> tuple[float, int, float]:
    """(seconds, peak bytes, measured FLOP/s) for ``cells`` = [(tokens, batch, scored positions)],
    the rate measured on one forward of 256 tokens (a lower bound of the rate at length: the
    estimate errs long)."""
    n0 = min(256, int(cfg.get("max_position_embeddings") or cfg.get("n_positions") or 256))  # GPT-J: n_positions
    ids = torch.zeros(1, n0, dtype=torch.long, device=next(lm.model.parameters()).device)
    lm.nll(ids[:, :16])  # the first call of a fresh model allocates and initializes: not timed
    t0 = time.perf_counter()
    lm.nll(ids)
    rate = forward_flops(cfg, n0, n0) / max(time.perf_counter() - t0, 1e-6)
    seconds = sum(b * forward_flops(cfg, n, k) for n, b, k in cells) / rate
    p = next(lm.model.parameters())
    weights = sum(t.numel() * t.element_size() for t in lm.model.parameters())
    peak = max((peak_bytes(cfg, n, b, weights, p.element_size()) for n, b, _ in cells), default=weights)
    return seconds, peak, rate
