"""Hugging Face per-layer RoPE (issue 23): Gemma 3's RoPE per layer type, the NoPE/RoPE hybrids
(SmolLM3, Llama 4, Cohere2) and p-RoPE's transformers spelling, on bad arguments and configs.
The models are tiny random-init transformers models (imported only when a case runs)."""

from __future__ import annotations

from . import Case

A = "hf hybrids"
_SIZES = dict(vocab_size=32, hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
              intermediate_size=16, max_position_embeddings=16)


def _gemma3():
    import torch
    import transformers

    torch.manual_seed(0)
    return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **_SIZES, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=4)).eval()


def _llama():
    import transformers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**_SIZES, num_hidden_layers=1)).eval()


def _patch(*args, **kw):
    from posenc.hf import patch_model

    return patch_model(*args, **kw)


def _patched_rope_of_gemma3():
    from posenc.hf import patched_rope

    model = _gemma3()
    _patch(model)
    return patched_rope(model)


def _from_hf(config, **kw):
    from posenc.rotary import from_hf

    return from_hf(config, **kw)


def _layer_ropes(config):
    from posenc.rotary.hf_config import layer_ropes

    return layer_ropes(config)


_COHERE2 = {"model_type": "cohere2", "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 2,
            "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
_SMOLLM3 = {"model_type": "smollm3", "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 4}

CASES = [
    Case(A, "patch_model layer_type= on a model with one RoPE (Llama)",
         r"layer_type must be None for model_type 'llama': one RoPE serves all its layers \(a RoPE per layer type: "
         r"gemma3_text\); got 'full_attention'", run=lambda: _patch(_llama(), layer_type="full_attention", base=2.0)),
    Case(A, "patch_model on Gemma 3 with a layer type it does not have",
         r"layer_type must be one of this model's layer types 'full_attention', 'sliding_attention'; got "
         r"'chunked_attention'", run=lambda: _patch(_gemma3(), layer_type="chunked_attention", base=2.0)),
    Case(A, "patched_rope of a patched Gemma 3 without layer_type",
         r"layer_type must be given: this model has a RoPE per layer type \('full_attention', 'sliding_attention'\)",
         run=_patched_rope_of_gemma3),
    Case(A, "from_hf of a Cohere2 global (NoPE) layer type",
         r"layer type 'full_attention' of model_type 'cohere2' has no rotary embedding \(NoPE\): only its "
         r"'sliding_attention' layers rotate", run=lambda: _from_hf(_COHERE2, layer_type="full_attention")),
    Case(A, "from_hf of a Llama 4 full-attention layer type (its NoPE layers)",
         r"layer type 'full_attention' of model_type 'llama4_text' has no rotary embedding \(NoPE\): no_rope_layers "
         r"is 0 for each of its layers \[3\]", run=lambda: _from_hf({
             "model_type": "llama4_text", "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 4,
             "no_rope_layers": [1, 1, 1, 0], "layer_types": ["chunked_attention"] * 3 + ["full_attention"]},
             layer_type="full_attention")),
    Case(A, "layer_ropes with no_rope_layers shorter than the layers (SmolLM3)",
         r"no_rope_layers must list one flag per layer \(1: RoPE, 0: NoPE; num_hidden_layers = 4\), got \[1, 1, 0\]",
         run=lambda: _layer_ropes(_SMOLLM3 | {"no_rope_layers": [1, 1, 0]})),
    Case(A, "layer_ropes with a no_rope_layers flag of 2",
         r"no_rope_layers must list one flag per layer .*got \[1, 2, 1, 0\]",
         run=lambda: _layer_ropes(_SMOLLM3 | {"no_rope_layers": [1, 2, 1, 0]})),
    Case(A, "from_hf of rope type 'proportional' in a family with its own rotated width (GPT-NeoX)",
         r"rope type 'proportional' rotates the whole head \(its partial_rotary_factor is the fraction of pairs "
         r"that rotate\), but model_type 'gpt_neox' sets a rotated width \(rotary_pct, default 0.25\)",
         run=lambda: _from_hf({"model_type": "gpt_neox", "hidden_size": 16, "num_attention_heads": 2,
                               "rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.5}})),
    Case(A, "from_hf of rope type 'proportional' with partial_rotary_factor 1.5",
         r"rope_parameters\['partial_rotary_factor'\] must be in \[0.0, 1.0\], got 1.5",
         run=lambda: _from_hf({"hidden_size": 16, "num_attention_heads": 2, "rope_parameters": {
             "rope_type": "proportional", "partial_rotary_factor": 1.5}})),
]
