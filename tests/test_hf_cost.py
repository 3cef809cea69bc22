"""posenc.hf.cost: the estimate printed before an evaluation grows with its forwards."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from hf_byte_llama import byte_llama  # noqa: E402

from posenc.hf.evaluation import HFCausalLM  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return byte_llama()


def test_estimate_grows_with_length(model):
    from posenc.hf.cost import estimate_cost

    cfg = model.config.to_dict()
    weights = sum(p.numel() * 4 for p in model.parameters())
    short = estimate_cost(HFCausalLM(model), cfg, [(64, 1, 64)])
    long = estimate_cost(HFCausalLM(model), cfg, [(4096, 1, 4096)] * 2)
    assert 0 < short[0] < long[0] and weights < short[1] < long[1] and long[2] > 0
