"""Multi-head latent attention (posenc.mla): its sizes, the encodings it takes, and the latent
cache slot it needs."""

from __future__ import annotations

import torch

import posenc
from posenc.kv_cache import KVCache
from posenc.mla import MLAConfig, MultiHeadLatentAttention
from posenc.positions import SequenceInfo

from . import Case

SIZES = dict(d_model=32, num_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
CFG = MLAConfig(**SIZES)


def _config(**changes) -> MLAConfig:
    return MLAConfig(**(SIZES | changes))


def _step(cache: KVCache, mla=None) -> None:
    mla = MultiHeadLatentAttention(CFG, CFG.build_encoding("rope")) if mla is None else mla
    mla(torch.zeros(1, 3, 32), SequenceInfo.from_offset(1, 3), cache=cache)


A = "mla"
CASES = [
    Case(A, "MLAConfig: kv_lora_rank=0", r"kv_lora_rank must be >= 1, got 0", run=lambda: _config(kv_lora_rank=0)),
    Case(A, "MLAConfig: an odd qk_rope_head_dim (RoPE rotates pairs)", r"qk_rope_head_dim must be even .* got 7",
         run=lambda: _config(qk_rope_head_dim=7)),
    Case(A, "MLAConfig: q_lora_rank=0 (None is the single q_proj)", r"q_lora_rank must be >= 1, got 0",
         run=lambda: _config(q_lora_rank=0)),
    Case(A, "MLAConfig: kv_lora_rank as a float", r"kv_lora_rank must be an int, got float 16\.0",
         run=lambda: _config(kv_lora_rank=16.0), error=TypeError),
    Case(A, "MLAConfig: norm_eps=0", r"norm_eps must be > 0, got 0", run=lambda: _config(norm_eps=0.0)),
    Case(A, "MLAConfig.from_hf: a Llama config (no latent sizes)",
         r"config lacks kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim: not a multi-head latent "
         r"attention config \(model_type 'llama'\)",
         run=lambda: MLAConfig.from_hf({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})),
    Case(A, "MultiHeadLatentAttention: a RoPE built for the whole head, not the rope slice",
         r"encoding 'rope' is built for 4 heads of 16 dims, but this attention rotates 4 heads of "
         r"qk_rope_head_dim=8: build it with MLAConfig.build_encoding",
         run=lambda: MultiHeadLatentAttention(CFG, posenc.build("rope", d_model=32, num_heads=4, head_dim=16))),
    Case(A, "MultiHeadLatentAttention: an encoding with content-dependent terms (Shaw)",
         r"encoding 'shaw' has content-dependent terms, which read a layer's q/k projections",
         run=lambda: MultiHeadLatentAttention(CFG, CFG.build_encoding("shaw"))),
    Case(A, "MultiHeadLatentAttention: path='fast'", r"path must be one of .*'naive', 'absorbed', 'auto'.*got 'fast'",
         run=lambda: MultiHeadLatentAttention(CFG, path="fast")),
    Case(A, "MultiHeadLatentAttention: a KVCache without a latent slot for the layer",
         r"cache layer 0 is not a LatentCache: build the cache with KVCache\(n, latent_layers=\[\.\.\., 0, \.\.\.\]\)",
         run=lambda: _step(KVCache(1))),
    Case(A, "Attention: a KVCache whose slot holds latents",
         r"cache layer 0 holds latents \(B, T, R\) and key slices \(B, T, r\) of multi-head latent attention, got "
         r"tensors of shapes \(1, 4, 3, 8\)",
         run=lambda: posenc.Attention(32, 4)(torch.zeros(1, 3, 32), SequenceInfo.from_offset(1, 3),
                                             cache=KVCache(1, latent_layers=[0]))),
    Case(A, "KVCache: latent_layers naming a layer past the last", r"latent_layers entry must be in \[0, 1\], got 2",
         run=lambda: KVCache(2, latent_layers=[2])),
    Case(A, "MultiHeadLatentAttention: x of the wrong width", r"x must have shape \(B, T, 32\), got \(1, 3, 16\)",
         run=lambda: MultiHeadLatentAttention(CFG)(torch.zeros(1, 3, 16), SequenceInfo.from_offset(1, 3))),
]


def _model(**kw) -> None:
    posenc.Transformer(posenc.ModelConfig(d_model=32, n_head=4, n_layer=1, **kw))


MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
CASES += [
    Case(A, "ModelConfig: mla's num_heads other than n_head", r"mla: num_heads must be the model's n_head \(4\), got 8",
         run=lambda: posenc.ModelConfig(d_model=32, n_head=4, mla=MLA | {"num_heads": 8})),
    Case(A, "ModelConfig: mla with grouped key/value heads (n_kv_head)",
         r"n_kv_head must be None with mla \(its keys and values come from one latent per token\), got 2",
         run=lambda: posenc.ModelConfig(d_model=32, n_head=4, n_kv_head=2, mla=MLA)),
    Case(A, "ModelConfig: an unknown key in mla", r"mla: unknown key 'kv_rank'; valid: d_model, num_heads, kv_lora_rank",
         run=lambda: posenc.ModelConfig(d_model=32, n_head=4, mla={"kv_rank": 16}), error=TypeError),
    Case(A, "ModelConfig: mla without its sizes", r"mla: .*missing .* required positional arguments?: 'kv_lora_rank'",
         run=lambda: posenc.ModelConfig(d_model=32, n_head=4, mla={}), error=TypeError),
    Case(A, "ModelConfig: mla with an odd qk_rope_head_dim",
         r"mla: qk_rope_head_dim must be even \(it is split into pairs\), got 5",
         run=lambda: posenc.ModelConfig(d_model=32, n_head=4, mla=MLA | {"qk_rope_head_dim": 5})),
    Case(A, "Transformer: mla layers with an encoding of content-dependent terms (Shaw)",
         r"encoding 'shaw' has content-dependent terms",
         run=lambda: _model(mla=MLA, encoding="shaw")),
]
