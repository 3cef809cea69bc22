"""Gemma 4 in posenc.hf: rope_parameters keyed by layer type, the sliding layers plain RoPE
(base 10000) and the full layers p-RoPE (transformers' ``rope_type="proportional"``, p = 0.25,
base 1e6) on their own head size (``global_head_dim``). References: transformers' own rotary
buffers per layer type, the unpatched model, and transformers' Gemma 4 built with another p.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")

from posenc.hf import patch_model, patched_rope, unpatch_model  # noqa: E402
from posenc.rotary import from_hf  # noqa: E402
from posenc.rotary.hf_config import layer_ropes  # noqa: E402

from hf_helpers import logits, rel  # noqa: E402

VOCAB, T = 64, 24
SLIDING, FULL = "sliding_attention", "full_attention"
_KW = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
           intermediate_size=64, num_hidden_layers=3, sliding_window=8, max_position_embeddings=32,
           vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8, initializer_range=0.2,
           pad_token_id=0, bos_token_id=1, eos_token_id=2)


def config(**over):
    return transformers.Gemma4TextConfig(**(_KW | {"global_head_dim": 16} | over))


def make(**over) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.Gemma4ForCausalLM(config(**over)).eval()


@pytest.fixture(scope="module")
def model():
    return make()


def test_layer_ropes_equal_transformers_buffers_per_layer_type(model):
    cfg = model.config
    assert cfg.layer_types == [SLIDING, SLIDING, FULL]
    raw = {k: v for k, v in cfg.to_dict().items() if k != "per_layer_config"} | {"global_head_dim": 16}
    for form in (cfg, cfg.to_dict(), raw):  # per_layer_config as transformers writes it, or global_head_dim
        ropes = layer_ropes(form)
        assert [(r.config.scaling, r.dims.head_dim) for r in ropes] == [("default", 8), ("default", 8),
                                                                         ("proportional", 16)]
        assert ropes[2].config.proportion == 0.25 and ropes[2].config.base == 1e6
        for t, rope in ((SLIDING, ropes[0]), (FULL, ropes[2])):
            want = getattr(model.model.rotary_emb, f"{t}_inv_freq").double()
            torch.testing.assert_close(rope.inv_freq, want, rtol=1e-6, atol=0)
    # no per_layer_config and no global_head_dim: transformers' default, 512
    assert from_hf({k: v for k, v in raw.items() if k != "global_head_dim"}, layer_type=FULL).dims.head_dim == 512


def test_same_config_same_logits_and_unpatch_restores_bitwise(model):
    original = model.model.rotary_emb
    ids = torch.randint(3, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    packed = torch.tensor([[*range(10), *range(14)], [*range(T)]])
    mask = torch.tensor([[0, 0, 0, *[1] * (T - 3)], [1] * T])
    cases = [{}, {"position_ids": packed}, {"attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}]
    want = [logits(model, ids, **kw) for kw in cases]
    assert rel(want[1], want[0]) > 1e-3
    patch_model(model)
    assert patched_rope(model, FULL).config.scaling == "proportional"
    for kw, w in zip(cases, want):
        assert rel(logits(model, ids, **kw), w) <= 1e-5, list(kw)
    assert unpatch_model(model) is True and model.model.rotary_emb is original
    assert all(torch.equal(logits(model, ids, **kw), w) for kw, w in zip(cases, want))


def test_another_p_on_the_full_layers_equals_transformers_with_it(model):
    """Gemma 4 has no default target for a scaling (both layer types are its own): it is named."""
    with pytest.raises(ValueError, match=r"^layer_type must be given: this model has a RoPE per layer type "
                                         r"\('full_attention', 'sliding_attention'\)"):
        patch_model(model, scaling="proportional", proportion=0.5)
    rope = dict(model.config.rope_parameters)
    twin = transformers.Gemma4ForCausalLM(config(rope_parameters=rope | {FULL: rope[FULL] | {
        "partial_rotary_factor": 0.5}})).eval()
    twin.load_state_dict(model.state_dict())
    ids = torch.randint(3, VOCAB, (2, T), generator=torch.Generator().manual_seed(2))
    want = logits(twin, ids)
    assert rel(want, logits(model, ids)) > 1e-4
    try:
        got = patch_model(model, layer_type=FULL, scaling="proportional", proportion=0.5)
        assert got.dims.head_dim == 16 and patched_rope(model, SLIDING).dims.head_dim == 8
        assert rel(logits(model, ids), want) <= 1e-5
    finally:
        unpatch_model(model)


def test_full_layers_of_two_head_sizes_are_refused():
    cfg = config(num_hidden_layers=4, layer_types=[SLIDING, FULL, SLIDING, FULL]).to_dict()
    cfg["per_layer_config"] = {"1": {"head_dim": 16}, "3": {"head_dim": 32}}
    with pytest.raises(ValueError, match=r"^per_layer_config gives the 'full_attention' layers head sizes \[16, 32\]: "
                                         r"one RoPE per layer type needs one head size$"):
        layer_ropes(cfg)
