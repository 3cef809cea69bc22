"""Rotary family: raw Hugging Face configs read by from_hf, and xPos in narrow dtypes."""

from __future__ import annotations

import torch

import posenc
from posenc.rotary import from_hf

from . import Case

LLAMA = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 2, "max_position_embeddings": 4096}
PHI3 = {"model_type": "phi3", "hidden_size": 128, "num_attention_heads": 2, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096}


def _describe(rope) -> str:
    return f"rotary_dim={rope.rotary_dim} of head_dim={rope.dims.head_dim}, base={rope.config.base:g}, " \
           f"layout={rope.config.layout}, rope type={rope.config.scaling}"


def _pretrained_config() -> str:
    import transformers

    cfg = transformers.GPTNeoXConfig(hidden_size=256, num_attention_heads=4, rotary_pct=0.25, rotary_emb_base=1e6)
    return "read via to_dict(): " + _describe(from_hf(cfg))


def _xpos_half(offset: int, scale: float = 1.0):
    xpos = posenc.build("xpos", d_model=8, num_heads=1)
    q = torch.ones(1, 1, 1, 8, dtype=torch.float16)
    pos = torch.tensor([[offset]])
    return xpos.rotate(q, scale * q, pos, pos)


def _xpos_model_half() -> None:
    torch.manual_seed(0)
    model = posenc.Transformer(posenc.ModelConfig(encoding="xpos", d_model=64, n_head=4, n_layer=1)).half().eval()
    with torch.no_grad():
        model(torch.zeros(1, 16, dtype=torch.long), posenc.SequenceInfo.from_offset(1, 16, 4600))


A = "rotary"
CASES = [
    Case(A, "from_hf: raw Pythia/GPT-NeoX config.json (rotary_pct, rotary_emb_base)",
         r"rotary_dim=16 of head_dim=64, base=1e\+06, layout=half",
         run=lambda: _describe(from_hf({"model_type": "gpt_neox", "hidden_size": 256, "num_attention_heads": 4,
                                        "rotary_pct": 0.25, "rotary_emb_base": 1e6})), error=None),
    Case(A, "from_hf: raw GPT-J config.json (rotary_dim, n_embd, n_head)", r"rotary_dim=16 .*layout=interleaved",
         run=lambda: _describe(from_hf({"model_type": "gptj", "n_embd": 256, "n_head": 4, "rotary_dim": 16})),
         error=None),
    Case(A, "from_hf: raw DeepSeek-V3 config.json (qk_rope_head_dim, rope_interleave absent, yarn)",
         r"rotary_dim=64 of head_dim=64, base=10000, layout=interleaved, rope type=yarn",
         run=lambda: _describe(from_hf({"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
                                        "qk_rope_head_dim": 64, "rope_theta": 10000, "max_position_embeddings": 163840,
                                        "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                                         "mscale": 1.0, "mscale_all_dim": 1.0,
                                                         "original_max_position_embeddings": 4096}})), error=None),
    Case(A, "from_hf: a transformers PretrainedConfig object", r"read via to_dict\(\): rotary_dim=16",
         run=_pretrained_config, error=None),
    Case(A, "from_hf: GPT-NeoX's rotary_pct in a llama config", r"'rotary_pct' not read for model_type 'llama'",
         run=lambda: from_hf(LLAMA | {"rotary_pct": 0.25})),
    Case(A, "from_hf: top-level rope_theta in a gpt_neox config (transformers drops it)",
         r"'rope_theta' not read for model_type 'gpt_neox'.*rotary_emb_base",
         run=lambda: from_hf({"model_type": "gpt_neox", "hidden_size": 256, "num_attention_heads": 4,
                              "rope_theta": 1e6})),
    Case(A, "from_hf: rope_scaling in a gptj config (GPT-J has no scaling)", r"'rope_scaling' not read for model_type 'gptj'",
         run=lambda: from_hf({"model_type": "gptj", "n_embd": 256, "n_head": 4, "rotary_dim": 16,
                              "rope_scaling": {"type": "linear", "factor": 2.0}})),
    Case(A, "from_hf: DeepSeek-V3's rope_interleave in a qwen2 config", r"'rope_interleave' not read for model_type 'qwen2'",
         run=lambda: from_hf(LLAMA | {"model_type": "qwen2", "rope_interleave": True})),
    Case(A, "from_hf: partial_rotary_factor 0.5 in a llama config (transformers rotates the whole head)",
         r"partial_rotary_factor must be 1 for model_type 'llama'",
         run=lambda: from_hf(LLAMA | {"partial_rotary_factor": 0.5})),
    Case(A, "from_hf: rope_theta=None", r"rope_theta must be a number, got NoneType None", error=TypeError,
         run=lambda: from_hf(LLAMA | {"rope_theta": None})),
    Case(A, "from_hf: negative rope_theta", r"rope_theta must be > 0, got -10000",
         run=lambda: from_hf(LLAMA | {"rope_theta": -10000})),
    Case(A, "from_hf: factor='two'", r"rope_scaling\['factor'\] must be a float or None, got str 'two'", error=TypeError,
         run=lambda: from_hf(LLAMA | {"rope_scaling": {"rope_type": "linear", "factor": "two"}})),
    Case(A, "from_hf: a scalar short_factor", r"rope_scaling\['short_factor'\] must be a tuple \(or list\) of floats, got float 1.0",
         error=TypeError,
         run=lambda: from_hf(PHI3 | {"rope_scaling": {"type": "longrope", "short_factor": 1.0,
                                                      "long_factor": [1.0] * 32}})),
    Case(A, "from_hf: short_factor of the wrong length", r"rope_scaling\['short_factor'\] must have rotary_dim/2 = 32 entries",
         run=lambda: from_hf(PHI3 | {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48,
                                                      "long_factor": [1.0] * 32}})),
    Case(A, "from_hf: yarn truncate=None (transformers reads it as false, absent as true)",
         r"rope_scaling\['truncate'\] must be a bool, got NoneType None", error=TypeError,
         run=lambda: from_hf(LLAMA | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": None}})),
    Case(A, "from_hf: rope_theta at the top level and in rope_parameters, different",
         r"rope_theta=10000 and rope_parameters\['rope_theta'\]=500000 disagree",
         run=lambda: from_hf(LLAMA | {"rope_theta": 10000, "rope_parameters": {"rope_theta": 500000}})),
    Case(A, "from_hf: rotary_pct giving an odd rotary dim", r"rotary_pct=0.3 gives int\(head_dim 64 \* 0.3\) = 19",
         run=lambda: from_hf({"model_type": "gpt_neox", "hidden_size": 256, "num_attention_heads": 4,
                              "rotary_pct": 0.3})),
    Case(A, "from_hf: per-layer-type rope_parameters (Gemma 3) without layer_type",
         r"pass layer_type= one of 'full_attention', 'sliding_attention'",
         run=lambda: from_hf({"model_type": "gemma3_text", "head_dim": 64, "num_attention_heads": 2,
                              "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})),
    Case(A, "from_hf: an unsupported model_type", r"model_type must be one of 'llama', .* got 'falcon'",
         run=lambda: from_hf(LLAMA | {"model_type": "falcon"})),
    Case(A, "from_hf: DeepSeek-V3 head_dim different from qk_rope_head_dim", r"head_dim=128 and qk_rope_head_dim=64 disagree",
         run=lambda: from_hf({"model_type": "deepseek_v3", "num_attention_heads": 2, "qk_rope_head_dim": 64,
                              "head_dim": 128})),
    Case(A, "xPos float16 model at position 4600 (was NaN logits)",
         r"positions must be <= 3966 for xPos with scale_base=512, gamma=0.4 in torch.float16.*Use scale_base >= 596",
         run=_xpos_model_half),
    Case(A, "xPos float16 key overflowing 65504 below the position limit",
         r"xPos rotated keys overflow torch.float16 .* at positions up to 3900",
         run=lambda: _xpos_half(3900, scale=10.0)),
]
