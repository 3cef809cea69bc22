"""posenc.engines: the EngineRope record, transformers' reading (the reference) and the
disagreement report, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.engines import ENGINES, EngineRope, Unsupported, engine_rule, register_engine
from posenc.engines.compare import disagreements, read_all
from posenc.engines.transformers import deepseek_softmax_scale

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 3,
         "rope_theta": 10000.0, "max_position_embeddings": 4096}


def theta(base: float, d: int) -> torch.Tensor:
    return torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)


@pytest.fixture
def fake_engine():
    """Register engines under test names; removed afterwards (the registry is global)."""
    added = []

    def add(name, rule):
        register_engine(name, version="0", summary="test")(rule)
        added.append(name)

    yield add
    for name in added:
        ENGINES.pop(name)


def test_transformers_reads_plain_llama_as_the_paper():
    (r,) = engine_rule("transformers")(LLAMA)
    assert r.layers is None and r.layer_type is None and r.beyond == "static"
    assert torch.allclose(r.inv_freq, theta(10000.0, 16), rtol=1e-12, atol=0)
    assert r.logit_scale() == 1.0


def test_transformers_dynamic_is_length_dependent_as_transformers_formula():
    cfg = dict(LLAMA, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    (r,) = engine_rule("transformers")(cfg)
    assert r.beyond == "dynamic"
    n, d = 16384, 16
    base = 10000.0 * ((2.0 * n / 4096) - 1) ** (d / (d - 2))  # dynamic_rope_update's base
    inv, factor = r.frequencies(n)
    assert torch.allclose(inv, theta(base, d), rtol=1e-12, atol=0) and factor == 1.0
    assert torch.equal(r.frequencies(1000)[0], r.inv_freq)  # below the original length: the plain table


def test_gemma3_gives_one_rope_per_layer_type():
    cfg = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
           "num_hidden_layers": 6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0,
           "max_position_embeddings": 32768, "sliding_window": 512,
           "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    ropes = {r.layer_type: r for r in engine_rule("transformers")(cfg)}
    assert set(ropes) == {"sliding_attention", "full_attention"}
    assert ropes["sliding_attention"].layers == (0, 1, 2, 3, 4) and ropes["full_attention"].layers == (5,)
    assert torch.allclose(ropes["sliding_attention"].inv_freq, theta(10000.0, 16), rtol=1e-12, atol=0)
    assert torch.allclose(ropes["full_attention"].inv_freq, theta(1e6, 16) / 8, rtol=1e-12, atol=0)


def test_deepseek_softmax_scale_is_mscale_squared():
    cfg = {"rope_scaling": {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0}}
    m = 0.1 * 1.0 * math.log(40.0) + 1.0
    assert deepseek_softmax_scale(cfg) == pytest.approx(m * m, rel=1e-15)
    assert deepseek_softmax_scale({"rope_scaling": {"type": "yarn", "factor": 40.0}}) == 1.0
    assert deepseek_softmax_scale({}) == 1.0


def test_disagreements_state_frequency_phase_scale_and_refusal(fake_engine):
    ref = engine_rule("transformers")(LLAMA)[0]
    inv = ref.inv_freq.clone()
    inv[-1] *= 1.01  # the slowest pair 1 % fast
    fake_engine("test-freq", lambda c: [EngineRope("test-freq", inv, attention_factor=1.1)])
    fake_engine("test-refuse", lambda c: (_ for _ in ()).throw(Unsupported("no such scaling here")))
    fake_engine("test-same", lambda c: [EngineRope("test-same", ref.inv_freq.clone())])
    readings = read_all(LLAMA, ["transformers", "test-freq", "test-refuse", "test-same"])
    found = disagreements(readings, 8192)
    by = {(d.engine, d.kind): d for d in found}
    assert set(by) == {("test-freq", "frequencies"), ("test-freq", "scale"), ("test-refuse", "refuses")}
    assert by[("test-freq", "frequencies")].phase == pytest.approx(8191 * float(ref.inv_freq[-1]) * 0.01, rel=1e-9)
    assert by[("test-freq", "scale")].scale == pytest.approx(1.21, rel=1e-12)
    assert "no such scaling here" in by[("test-refuse", "refuses")].line


def test_disagreements_see_static_against_dynamic(fake_engine):
    cfg = dict(LLAMA, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    ref = engine_rule("transformers")(cfg)[0]
    fake_engine("test-static", lambda c: [EngineRope("test-static", ref.inv_freq.clone())])
    found = disagreements(read_all(cfg, ["transformers", "test-static"]), 16384)
    kinds = {d.kind for d in found}
    assert kinds == {"beyond", "frequencies"}  # dynamic vs static, and so other angles at 16384
    assert disagreements(read_all(cfg, ["transformers", "test-static"]), 4096)  # the kinds still differ


def test_engine_rope_refuses_bad_records():
    with pytest.raises(ValueError, match="rotary_dim"):
        EngineRope("x", torch.ones(4), rotary_dim=6)
    with pytest.raises(ValueError, match="at_length"):
        EngineRope("x", torch.ones(4), beyond="dynamic")
    with pytest.raises(ValueError, match="layout"):
        EngineRope("x", torch.ones(4), layout="diagonal")
    with pytest.raises(ValueError, match="length"):
        disagreements({"transformers": []}, 1)
    with pytest.raises(ValueError, match="unknown engine"):
        engine_rule("tgi")
