"""Training-free attention methods (``posenc.methods``, ``patch_model(model, method=...)``) on bad
parameters, models and inputs. The models are tiny random-init transformers models."""

from __future__ import annotations

import torch

from . import Case

A = "attention methods"


def _build(name, **kw):
    from posenc.methods import build_method

    return build_method(name, **kw)


def _llama():
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=16)).eval()


def _patch(model=None, **kw):
    from posenc.hf import patch_model

    return patch_model(_llama() if model is None else model, **kw)


def _gemma():
    import transformers

    return transformers.GemmaForCausalLM(transformers.GemmaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=16))


def _attend(**kw):
    from posenc.methods import build_method, method_attention

    q = torch.zeros(1, 2, 4, 8)
    pos = torch.arange(4)[None]
    args = dict(q=q, k=q, v=q, method=build_method("rerope", window=2), q_pos=pos, k_pos=pos,
                inv_freq=torch.ones(4)) | kw
    return method_attention(**args)


CASES = [
    Case(A, "Self-Extend with group_size 0", r"group_size must be in \[1, ",
         run=lambda: _build("self_extend", group_size=0, neighbor_window=4)),
    Case(A, "Self-Extend with neighbor_window 0", r"neighbor_window must be in \[1, ",
         run=lambda: _build("self_extend", group_size=2, neighbor_window=0)),
    Case(A, "Self-Extend with a fractional group_size", r"group_size must be an int, got float 2.5",
         run=lambda: _build("self_extend", group_size=2.5, neighbor_window=4), error=TypeError),
    Case(A, "Self-Extend without neighbor_window", r"method 'self_extend' needs neighbor_window",
         run=lambda: _build("self_extend", group_size=2)),
    Case(A, "Dual Chunk Attention with local_size >= chunk_size", r"local_size must be in \[0, 7\], got 8",
         run=lambda: _build("dual_chunk", chunk_size=8, local_size=8)),
    Case(A, "ReRoPE with window 0", r"window must be in \[1, ", run=lambda: _build("rerope", window=0)),
    Case(A, "leaky ReRoPE with slope 1.5", r"slope must be in \[0.0, 1.0\], got 1.5",
         run=lambda: _build("rerope", window=4, slope=1.5)),
    Case(A, "an unknown method", r"method must be one of 'self_extend', 'rerope', 'dual_chunk'; got 'chunk'",
         run=lambda: _build("chunk")),
    Case(A, "a parameter of another method", r"method 'rerope' takes window, slope; got unknown group_size",
         run=lambda: _build("rerope", window=4, group_size=2)),
    Case(A, "patch_model with a method parameter but no method",
         r"group_size is a parameter of an attention method: pass method=",
         run=lambda: _patch(group_size=2)),
    Case(A, "patch_model(method='self_extend') given ReRoPE's window",
         r"window is a parameter of method 'rerope', not 'self_extend'",
         run=lambda: _patch(method="self_extend", group_size=2, neighbor_window=4, window=3)),
    Case(A, "patch_model with block_rows 0", r"block_rows must be an int >= 1",
         run=lambda: _patch(method="rerope", window=4, block_rows=0)),
    Case(A, "a method on a model type it does not support (Gemma)",
         r"model_type must be one of llama, mistral, qwen2, qwen3 for method=...; got 'gemma'",
         run=lambda: _patch(_gemma(), method="rerope", window=4)),
    Case(A, "method_attention with fewer keys than queries", r"the keys \(2\) must include the 4 queries",
         run=lambda: _attend(k=torch.zeros(1, 2, 2, 8), v=torch.zeros(1, 2, 2, 8), k_pos=torch.arange(2)[None])),
    Case(A, "method_attention with float positions", r"q_pos must be integer positions",
         run=lambda: _attend(q_pos=torch.zeros(1, 4))),
    Case(A, "method_attention with more frequencies than the head size", r"inv_freq must be \(r/2,\) with 0 < r <= "
         r"head size 8", run=lambda: _attend(inv_freq=torch.ones(5))),
]
