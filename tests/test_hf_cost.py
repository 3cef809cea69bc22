"""posenc.hf.cost: the estimate printed before an evaluation grows with its forwards."""

from __future__ import annotations


import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf.evaluation import HFCausalLM  # noqa: E402

L = 256  # trained length: a byte-level passkey prompt needs ~250 tokens


def _config(**kw):
    return transformers.LlamaConfig(**(dict(
        vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=L, rope_theta=10000.0) | kw))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(_config()).eval()


def test_estimate_grows_with_length(model):
    from posenc.hf.cost import estimate_cost

    cfg = model.config.to_dict()
    weights = sum(p.numel() * 4 for p in model.parameters())
    short = estimate_cost(HFCausalLM(model), cfg, [(64, 1, 64)])
    long = estimate_cost(HFCausalLM(model), cfg, [(4096, 1, 4096)] * 2)
    assert 0 < short[0] < long[0] and weights < short[1] < long[1] and long[2] > 0
