"""bfloat16 models: where a patched model and the unpatched one differ, and why.

Measured on the tiny models below (24 tokens; the same at 200): a model loaded with
``from_pretrained(dtype=torch.bfloat16)`` keeps transformers' ``inv_freq`` buffers in float32,
and the patched logits equal the unpatched ones bit for bit (both round float32 cos/sin to
bfloat16 last; posenc's float64 angles differ from transformers' float32 ones by far less
than a bfloat16 ulp at these positions). A model cast with ``model.to(torch.bfloat16)``
rounds transformers' own ``inv_freq`` buffers to bfloat16 (relative error up to 2^-8 per
frequency, so angle errors that grow with the position): there the unpatched model differs
from the patched one by 1.3e-2 to 1.5e-2 of the largest logit at 24 tokens (4e-2 to 2.3e-1 at
200), and putting the float32 buffers back makes the two agree again bit for bit. posenc's
frequencies are float64 Python-side tensors that the cast does not touch, so the difference
is transformers' rounded buffer, not posenc's cos/sin.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")

from posenc.hf import patch_model, unpatch_model  # noqa: E402
from posenc.hf.patch import patched_ropes  # noqa: E402

T = 24
_SIZES = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
              num_hidden_layers=4, max_position_embeddings=32, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
FAMILIES = {  # model_type -> (config class, causal LM class, config kwargs)
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM",
                    dict(head_dim=8, intermediate_size_mlp=64, num_local_experts=2, attention_chunk_size=8,
                         floor_scale=4, attn_scale=0.5, attn_temperature_tuning=True)),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=8)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(head_dim=8, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8,
                         query_pre_attn_scalar=8)),
}


def make(name: str) -> torch.nn.Module:
    cfg_cls, lm_cls, kw = FAMILIES[name]
    torch.manual_seed(0)
    return getattr(transformers, lm_cls)(getattr(transformers, cfg_cls)(**(_SIZES | kw))).eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and b.abs().max() > 0
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def freq_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """transformers' frequency buffers (Gemma 3: one per layer type), the ones its rotary reads."""
    return {k: v for k, v in model.model.rotary_emb.named_buffers() if k.endswith("inv_freq") and "original" not in k}


def patched_and_unpatched(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        patch_model(model)
        try:
            patched = model(input_ids=ids).logits
        finally:
            unpatch_model(model)
    return patched, plain


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bf16_from_pretrained_patched_equals_unpatched(name, tmp_path):
    make(name).save_pretrained(tmp_path / "ckpt")
    cls = getattr(transformers, FAMILIES[name][1])
    model = cls.from_pretrained(str(tmp_path / "ckpt"), dtype=torch.bfloat16).eval()
    bufs = freq_buffers(model)
    assert bufs and all(b.dtype == torch.float32 for b in bufs.values())  # as transformers loads them
    ids = torch.randint(3, 64, (2, T), generator=torch.Generator().manual_seed(1))
    patched, plain = patched_and_unpatched(model, ids)
    assert patched.dtype == torch.bfloat16
    assert rel(patched, plain) <= 2e-3  # measured: 0 (bit for bit)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bf16_cast_difference_is_transformers_rounded_inv_freq(name):
    model = make(name)
    exact = {k: v.clone() for k, v in freq_buffers(model).items()}  # float32
    cast = copy.deepcopy(model).to(torch.bfloat16)
    rounded = freq_buffers(cast)
    assert rounded and all(b.dtype == torch.bfloat16 for b in rounded.values())
    err = max(float(((rounded[k].double() - exact[k].double()) / exact[k].double()).abs().max()) for k in exact)
    assert 1e-4 < err <= 2**-8  # each frequency rounded to bfloat16: half an ulp, up to 2^-8 of it
    ids = torch.randint(3, 64, (2, T), generator=torch.Generator().manual_seed(1))
    patched, plain = patched_and_unpatched(cast, ids)
    assert rel(patched, plain) > 5e-3  # the difference reported (1.3e-2 to 1.5e-2 here)
    patch_model(cast)
    ropes = patched_ropes(cast)
    ropes = ropes.values() if isinstance(ropes, dict) else [ropes]
    assert all(r.inv_freq.dtype == torch.float64 for r in ropes)  # posenc's are not rounded by the cast
    unpatch_model(cast)
    for k, v in exact.items():  # transformers' float32 frequencies back in the cast model
        setattr(cast.model.rotary_emb, k, v)
    patched, plain = patched_and_unpatched(cast, ids)
    assert rel(patched, plain) <= 2e-3  # measured: 0 (bit for bit): the rounded buffer was the whole difference
