"""The tiny byte-level Llama the real-model evaluation tests share (cost, evaluation, tasks,
bench --model): 260 token ids (a byte tokenizer's 256 bytes and specials), one layer, trained
length L = 256, since a byte-level passkey prompt needs about 250 tokens."""

from __future__ import annotations

import torch
import transformers

L = 256


def byte_llama_config(**overrides) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(**(dict(
        vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=L, rope_theta=10000.0) | overrides))


def byte_llama(**overrides) -> transformers.LlamaForCausalLM:
    """The model with seed-0 weights, in eval mode."""
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(byte_llama_config(**overrides)).eval()
