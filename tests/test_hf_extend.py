"""``posenc extend`` on models with a RoPE per layer type (Gemma 3) and on NoPE/RoPE hybrids
(SmolLM3, Llama 4, Cohere2): tiny random models built with transformers, saved, extended end to
end, and every candidate's written config loaded by plain transformers, whose logits must be the
patched model's.

The reference is transformers itself: a config.json is right when transformers, reading it
with the same weights, computes what the patched model computed. Gemma 3's scaling goes to its
full layers, so its config must keep the sliding layers' RoPE apart (``rope_parameters`` keyed
by layer type); Llama 4 and Cohere2 rotate interleaved pairs in their attention code, which
their config does not spell. The written configs are also checked to differ from the
checkpoint's where the RoPE was scaled, so the comparison can fail.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")

from posenc.hf import patch_model, unpatch_model  # noqa: E402
from posenc.hf.extend import ExtendSettings, extend, extended_config, write_extended  # noqa: E402

VOCAB, L, N, WINDOW = 260, 64, 256, 8  # bytes as tokens (no tokenizer saved); N: past a passkey prompt
SLIDING, FULL = "sliding_attention", "full_attention"
_SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
              num_hidden_layers=4, max_position_embeddings=L, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
FAMILIES = {  # model_type -> (config class, causal LM class, config kwargs)
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(head_dim=8, layer_types=[SLIDING, FULL, SLIDING, FULL], sliding_window=WINDOW,
                         query_pre_attn_scalar=8, rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": 1e4},
                                                                   FULL: {"rope_type": "default", "rope_theta": 1e6}})),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM",
                    dict(head_dim=8, intermediate_size_mlp=64, num_local_experts=2, attention_chunk_size=WINDOW,
                         floor_scale=4, attn_scale=0.5, attn_temperature_tuning=True)),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=WINDOW)),
}


def make(name: str) -> torch.nn.Module:
    cfg_cls, lm_cls, kw = FAMILIES[name]
    torch.manual_seed(0)
    return getattr(transformers, lm_cls)(getattr(transformers, cfg_cls)(**(_SIZES | kw))).eval()


def from_config(config: dict, state: dict) -> torch.nn.Module:
    """Plain transformers' model of a config.json dict, with ``state`` as its weights."""
    config = dict(config)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(config.pop("model_type"),
                                                                                              **config)).eval()
    model.load_state_dict(state)
    return model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and b.abs().max() > 0
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("name", list(FAMILIES))
@torch.no_grad()
def test_extend_writes_configs_plain_transformers_loads_with_the_patched_logits(name, tmp_path):
    model = make(name)
    model.save_pretrained(tmp_path / "ckpt")
    own = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    ev = extend(tmp_path / "ckpt", ExtendSettings(to=N, factors=(1.0,)), tmp_path / "out", progress=False, loaded=model)
    rows = ev["candidates"]
    scaled = [r for r in rows if r["scaling"] is not None]
    assert rows[0]["hf"] is None and len(scaled) >= 5, [r["label"] for r in rows]
    assert {r["scaling"] for r in scaled} >= {"linear", "dynamic", "yarn"}
    ids = torch.randint(3, VOCAB, (1, 96), generator=torch.Generator().manual_seed(1))  # past L: the scalings act
    unscaled = model(input_ids=ids).logits
    state = model.state_dict()
    for r in scaled:
        if name == "gemma3_text":  # the scaling on the full layers, the sliding layers' RoPE as it was
            assert set(r["hf"]["rope_parameters"]) == {SLIDING, FULL}, r["label"]
            assert r["hf"]["rope_parameters"][SLIDING] == {"rope_type": "default", "rope_theta": 1e4}, r["label"]
        patch_model(model, scaling=r["scaling"], **r["params"])
        try:
            want = model(input_ids=ids).logits
        finally:
            unpatch_model(model)
        assert rel(want, unscaled) > 1e-4, r["label"]  # the scaling changes these logits
        got = from_config(extended_config(own, r["hf"], N), state)(input_ids=ids).logits
        assert rel(got, want) <= 1e-5, r["label"]
    # the folder itself, as a user loads it: the winner, and a scaled candidate written the same way
    winner = next(r for r in rows if r["label"] == ev["winner"])
    dynamic = next(r for r in scaled if r["scaling"] == "dynamic")  # Gemma 3: a top-level key only one type needs
    write_extended(tmp_path / "ckpt", tmp_path / "dyn", extended_config(own, dynamic["hf"], N), {})
    for folder, r in ((tmp_path / "out", winner), (tmp_path / "dyn", dynamic)):
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        if r["scaling"] is not None:
            patch_model(model, scaling=r["scaling"], **r["params"])
        try:
            want = model(input_ids=ids).logits
        finally:
            unpatch_model(model)
        assert rel(loaded(input_ids=ids).logits, want) <= 1e-5, (folder.name, r["label"])


def test_extended_config_drops_the_hub_spelling_it_supersedes():
    """A Hub-spelled Gemma 3 config.json (rope_theta, rope_local_base_freq, rope_scaling at the
    top level) written with rope_parameters keyed by layer type keeps none of those keys: they
    would contradict it."""
    hub = dict(model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4,
               rope_scaling={"rope_type": "linear", "factor": 8.0}, max_position_embeddings=L)
    hf = {"rope_parameters": {SLIDING: {"rope_type": "default", "rope_theta": 1e4},
                              FULL: {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "head_dim": 8}
    out = extended_config(hub, hf, N)
    assert out == dict(model_type="gemma3_text", max_position_embeddings=N, **hf)
