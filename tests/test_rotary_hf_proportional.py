"""p-RoPE in transformers' spelling: ``rope_type="proportional"``, whose rope-dict
``partial_rotary_factor`` is the fraction p of the pairs that rotate (over the whole head:
exponents 2i/head_dim), and ``factor`` divides every frequency. ``from_hf`` reads it (also a
top-level ``partial_rotary_factor``, which transformers moves into the rope dict) and ``to_hf``
writes it; both are checked against transformers' ``ROPE_INIT_FUNCTIONS["proportional"]`` on
the same config, and ``patch_model`` against transformers' Llama built with that rope type.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

import posenc  # noqa: E402
from posenc.hf import patch_model  # noqa: E402
from posenc.rotary import from_hf, to_hf  # noqa: E402

# (head_dim, rope dict, top-level keys): Gemma 4's full layers (p = 0.25, base 1e6), a factor,
# p = 0 (nothing rotates), p given at the top level only
CASES = [
    (256, {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}, {}),
    (64, {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 4.0, "rope_theta": 5e5}, {}),
    (32, {"rope_type": "proportional", "partial_rotary_factor": 0.0, "rope_theta": 1e4}, {}),
    (48, {"rope_type": "proportional", "rope_theta": 1e4}, {"partial_rotary_factor": 0.75}),
]


def llama_config(head_dim: int, rope: dict, top: dict):
    return transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                    rope_parameters=copy.deepcopy(rope), **top)


def transformers_inv_freq(config) -> torch.Tensor:
    inv, af = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    assert af == 1.0
    return inv


@pytest.mark.parametrize("head_dim,rope,top", CASES)
def test_from_hf_reads_transformers_spelling(head_dim, rope, top):
    want = transformers_inv_freq(llama_config(head_dim, rope, top))
    raw = {"model_type": "llama", "hidden_size": 2 * head_dim, "num_attention_heads": 2, "head_dim": head_dim,
           "rope_parameters": copy.deepcopy(rope)} | top
    for config in (raw, llama_config(head_dim, rope, top)):  # a config.json dict and a PretrainedConfig
        ours = from_hf(config)
        assert ours.config.scaling == "proportional" and ours.rotary_dim == head_dim  # the whole head
        p = rope.get("partial_rotary_factor", top.get("partial_rotary_factor"))
        assert ours.config.proportion == p and ours.config.factor == rope.get("factor", 1.0)
        assert torch.equal(ours.inv_freq == 0, want == 0)  # the same pairs stop rotating
        torch.testing.assert_close(ours.inv_freq, want.double(), rtol=1e-6, atol=0)  # transformers: float32


@pytest.mark.parametrize("head_dim,rope,top", CASES)
def test_to_hf_round_trips_and_transformers_reads_it(head_dim, rope, top):
    ours = from_hf({"hidden_size": 2 * head_dim, "num_attention_heads": 2, "head_dim": head_dim,
                    "rope_parameters": copy.deepcopy(rope)} | top)
    written = to_hf(ours)
    assert written["rope_parameters"]["rope_type"] == "proportional"
    assert written["rope_parameters"]["partial_rotary_factor"] == ours.config.proportion
    back = from_hf(written)
    same = ("scaling", "proportion", "factor", "base", "rotary_dim")
    assert [getattr(back.config, k) for k in same] == [getattr(ours.config, k) for k in same]
    assert torch.equal(back.inv_freq, ours.inv_freq)
    want = transformers_inv_freq(transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2,
                                                          **copy.deepcopy(written)))
    torch.testing.assert_close(ours.inv_freq, want.double(), rtol=1e-6, atol=0)


def test_patch_model_equals_transformers_proportional_llama():
    """A plain Llama patched with p-RoPE = transformers' Llama with rope_type 'proportional'
    (same weights); and that checkpoint patched with its own config equals itself."""
    kw = dict(vocab_size=64, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=64, num_hidden_layers=2, max_position_embeddings=32, initializer_range=0.2)
    torch.manual_seed(0)
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    rope = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "factor": 2.0, "rope_theta": 10000.0}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw, rope_parameters=rope)).eval()
    hf.load_state_dict(plain.state_dict())
    ids = torch.randint(3, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        assert (want - plain(ids).logits).abs().max() > 1e-3
        patch_model(plain, scaling="proportional", proportion=0.25, factor=2.0)
        torch.testing.assert_close(plain(ids).logits, want, rtol=0, atol=1e-5 * float(want.abs().max()))
        assert patch_model(hf).config.proportion == 0.25
        torch.testing.assert_close(hf(ids).logits, want, rtol=0, atol=1e-5 * float(want.abs().max()))


def test_refusals():
    with pytest.raises(ValueError, match=r"^rotary_dim must be head_dim \(64\) to write rope type 'proportional'"):
        to_hf(posenc.build("rope", d_model=128, num_heads=2, rotary_dim=32, scaling="proportional", proportion=0.5))
    with pytest.raises(ValueError, match=r"^rope type 'proportional' rotates the whole head .*model_type 'gpt_neox' "
                                         r"sets a rotated width \(rotary_pct, default 0.25\)"):
        from_hf({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 2,
                 "rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.5}})
    with pytest.raises(ValueError, match=r"^rope_parameters\['partial_rotary_factor'\] must be in \[0.0, 1.0\], "
                                         r"got 1.5$"):
        from_hf({"hidden_size": 64, "num_attention_heads": 2,
                 "rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 1.5}})
    with pytest.raises(ValueError, match=r"^partial_rotary_factor=0.5 and rope_parameters\['partial_rotary_factor'\]"
                                         r"=0.25 disagree; give one$"):
        from_hf({"hidden_size": 64, "num_attention_heads": 2, "partial_rotary_factor": 0.5,
                 "rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.25}})
