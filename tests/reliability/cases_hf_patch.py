"""``posenc.hf.patch_model`` / ``unpatch_model`` and the BERT / DeBERTa loaders on bad models,
arguments and checkpoints (issue 13). The models are tiny random-init transformers models
(transformers is the optional extra ``posenc[hf]``, imported only when a case runs)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from . import Case

A = "hf patch"


def _llama():
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=16)).eval()


def _patch(*args, **kw):
    from posenc.hf import patch_model

    return patch_model(*args, **kw)


def _gpt2():
    import transformers

    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2))


def _olmo():
    import transformers

    return transformers.OlmoForCausalLM(transformers.OlmoConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16))


def _deepseek_v3():
    import transformers

    torch.manual_seed(0)
    return transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        vocab_size=32, hidden_size=32, intermediate_size=32, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=2, num_experts_per_tok=1, n_group=1, topk_group=1,
        kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
        max_position_embeddings=64)).eval()


def _interleaved_rope():
    from posenc.encoding import Dims
    from posenc.rotary import RotaryConfig, RotaryEmbedding

    return RotaryEmbedding(RotaryConfig(layout="interleaved"), Dims(d_model=16, num_heads=2, head_dim=8))


def _unpatch_unpatched() -> str:
    from posenc.hf import unpatch_model

    return f"unpatch_model on a model never patched returns {unpatch_model(_llama())}"


def _repatch() -> str:
    from posenc.hf import patch_model, patched_rope

    model = _llama()
    patch_model(model, scaling="yarn", factor=4.0)
    rope = patch_model(model, base=500000.0)
    return (f"patch_model twice: the second replaces the first (scaling={rope.config.scaling!r}, "
            f"base={rope.config.base:g}, in use: {patched_rope(model) is rope})")


def _deberta_cfg(**over):
    cfg = dict(model_type="deberta-v2", hidden_size=16, num_attention_heads=2, num_hidden_layers=1,
               relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=4, max_relative_positions=8)
    return cfg | over


def _loader(name: str, *args, **kw):
    from posenc import hf

    return getattr(hf, name)(*args, **kw)


def _empty_folder():
    # A fixed folder name: the message goes into the generated docs/reliability.md.
    d = Path(tempfile.gettempdir()) / "posenc_reliability_empty"
    d.mkdir(exist_ok=True)
    return _loader("relative_from_bert", str(d))


_BERT = dict(position_embedding_type="relative_key", hidden_size=16, num_attention_heads=2,
             max_position_embeddings=8)

CASES = [
    Case(A, "patch_model on something that is not a transformers model",
         r"model must be a transformers PreTrainedModel .*got Linear",
         run=lambda: _patch(torch.nn.Linear(2, 2)), error=TypeError),
    Case(A, "patch_model on a model without RoPE (GPT-2)",
         r"model_type 'gpt2' has no rotary embeddings .*supports: llama, mistral, qwen2, qwen3, gemma, gemma2, "
         r"phi, phi3, stablelm, gpt_neox, gemma3_text, gemma4_text, smollm3, deepseek_v3, cohere2, qwen2_vl_text, "
         r"qwen2_5_vl_text, qwen3_vl_text, llama4_text, gptj",
         run=lambda: _patch(_gpt2())),
    Case(A, "patch_model on a RoPE model type it does not support (olmo)",
         r"model_type must be one of llama, .*, gptj for patch_model; got 'olmo'", run=lambda: _patch(_olmo())),
    Case(A, "patch_model scaling='linear', factor=0.5", r"factor must be in \[1.0, inf\), got 0.5",
         run=lambda: _patch(_llama(), scaling="linear", factor=0.5)),
    Case(A, "patch_model with a misspelled scaling parameter", r"unknown parameter\(s\) 'fctor'",
         run=lambda: _patch(_llama(), scaling="linear", fctor=2.0), error=TypeError),
    Case(A, "patch_model scaling='nope'", r"scaling must be one of 'default', 'linear', .*'yarn'.*; got 'nope'",
         run=lambda: _patch(_llama(), scaling="nope")),
    Case(A, "patch_model with a rope of another layout than the checkpoint's",
         r"rope.layout must be 'half', the checkpoint's \(model_type 'llama'\); got 'interleaved'",
         run=lambda: _patch(_llama(), _interleaved_rope())),
    Case(A, "patch_model with rope='yarn' (a string, not a module)", r"rope must be a posenc RotaryEmbedding .*got str",
         run=lambda: _patch(_llama(), "yarn"), error=TypeError),
    Case(A, "unpatch_model on a model that was never patched", r"returns False", run=_unpatch_unpatched, error=None),
    Case(A, "patch_model called again on a patched model", r"second replaces the first \(scaling='default', "
         r"base=500000, in use: True\)", run=_repatch, error=None),
    Case(A, "relative_from_bert on a checkpoint with absolute positions",
         r"position_embedding_type must be one of 'relative_key', 'relative_key_query' for relative_from_bert; "
         r"got 'absolute'", run=lambda: _loader("relative_from_bert", {}, config=_BERT | {
             "position_embedding_type": "absolute"})),
    Case(A, "relative_from_bert with a distance table of the wrong size",
         r"distance_embedding.weight must have shape \(15, 8\) for this config, got \(9, 8\)",
         run=lambda: _loader("relative_from_bert", {"encoder.layer.0.attention.self.distance_embedding.weight":
                                                    torch.zeros(9, 8)}, config=_BERT)),
    Case(A, "relative_from_bert on a folder without config.json", r"has no config.json", run=_empty_folder),
    Case(A, "relative_from_bert on a state dict without config", r"config is needed with a state dict",
         run=lambda: _loader("relative_from_bert", {})),
    Case(A, "relative_from_deberta without relative_attention", r"config\['relative_attention'\] must be true",
         run=lambda: _loader("relative_from_deberta", {}, config=_deberta_cfg(relative_attention=False))),
    Case(A, "relative_from_deberta with pos_att_type ['c2c']",
         r"pos_att_type'\] entries must be 'c2p' or 'p2c'; got \['c2c'\]",
         run=lambda: _loader("relative_from_deberta", {}, config=_deberta_cfg(pos_att_type=["c2c"]))),
    Case(A, "relative_from_deberta with position_buckets='4' (a string)",
         r"config\['position_buckets'\] must be an int, got str '4'",
         run=lambda: _loader("relative_from_deberta", {}, config=_deberta_cfg(position_buckets="4")), error=TypeError),
    Case(A, "relative_from_bert with distance tables for layers 0 and 2 only",
         r"distance_embedding weights found for layers \[0, 2\]: expected 0..1",
         run=lambda: _loader("relative_from_bert", {
             f"encoder.layer.{i}.attention.self.distance_embedding.weight": torch.zeros(15, 8) for i in (0, 2)},
             config=_BERT)),
    Case(A, "relative_from_deberta on a state dict without rel_embeddings",
         r"expected one encoder.rel_embeddings.weight in the source, found 0",
         run=lambda: _loader("relative_from_deberta", {}, config=_deberta_cfg())),
    Case(A, "patch_model of DeepSeek-V3 (MLA) with a YaRN whose mscale_all_dim needs another softmax scale",
         r"model_type 'deepseek_v3': its attention multiplies the softmax scale by YaRN's mscale\(factor, "
         r"mscale_all_dim\)\^2, fixed when the model was built",
         run=lambda: _patch(_deepseek_v3(), scaling="yarn", factor=4.0, mscale=1.0, mscale_all_dim=1.0)),
]
