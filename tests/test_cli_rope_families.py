"""``posenc rope`` on ten real families' published config.json (tests/engine_configs.py): every
engine's reading is shown, and the disagreements the engines' trackers report are found where
they apply (and nowhere else)."""

from __future__ import annotations

import json

import pytest

from engine_configs import FAMILIES
from posenc.cli import main


def rope_json(tmp_path, capsys, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["rope", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def found(data, engine, kind=None):
    return [d for d in data["disagreements"] if d["engine"] == engine and (kind is None or d["kind"] == kind)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_engine_is_read_or_refuses_in_one_line(tmp_path, capsys, family):
    data = rope_json(tmp_path, capsys, FAMILIES[family])
    assert set(data["engines"]) == {"transformers", "vllm", "sglang", "llama.cpp", "mlx-lm"}
    for engine, reading in data["engines"].items():
        if isinstance(reading, dict):
            assert engine != "transformers" and "\n" not in reading["refuses"]
        else:
            assert reading and all(len(r["inv_freq"]) == r["rotary_dim"] // 2 for r in reading)


@pytest.mark.parametrize("family", ["Qwen2.5 YaRN", "Mistral", "SmolLM3", "Llama 3.1"])
def test_agreeing_families_show_no_disagreement(tmp_path, capsys, family):
    assert rope_json(tmp_path, capsys, FAMILIES[family])["disagreements"] == []


def test_dynamic_ntk_is_static_in_vllm_and_sglang(tmp_path, capsys):
    config = dict(FAMILIES["Mistral"], rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    data = rope_json(tmp_path, capsys, config)
    for engine in ("vllm", "sglang"):
        assert found(data, engine, "beyond"), engine
    assert not found(data, "mlx-lm")  # mlx-lm recomputes per call, as transformers


def test_phi3_longrope_switch_differs_per_engine(tmp_path, capsys):
    data = rope_json(tmp_path, capsys, FAMILIES["Phi-3 LongRoPE"])
    assert found(data, "vllm", "beyond") and found(data, "vllm", "frequencies")  # short factors only by default
    assert found(data, "mlx-lm", "beyond")  # long factors always
    assert not found(data, "llama.cpp", "beyond")


def test_gemma3_scaling_dropped_by_sglang_on_the_global_layers_only(tmp_path, capsys):
    data = rope_json(tmp_path, capsys, FAMILIES["Gemma 3"])
    (d,) = found(data, "sglang")
    assert d["layer_type"] == "full_attention" and d["kind"] == "frequencies"
    assert [x for x in data["disagreements"] if x["engine"] != "sglang"] == []


def test_gpt_oss_truncate_false_is_lost_in_llama_cpp_and_mlx(tmp_path, capsys):
    data = rope_json(tmp_path, capsys, FAMILIES["gpt-oss"])
    assert {d["engine"] for d in data["disagreements"]} == {"llama.cpp", "mlx-lm"}
    assert all(d["kind"] == "frequencies" and d["phase"] > 0.1 for d in data["disagreements"])


def test_deepseek_v3_softmax_scale_agrees_and_refusals_are_named(tmp_path, capsys):
    data = rope_json(tmp_path, capsys, FAMILIES["DeepSeek-V3"])
    (t,) = data["engines"]["transformers"]
    assert t["softmax_scale"] == pytest.approx((0.1 * __import__("math").log(40) + 1) ** 2, rel=1e-12)
    assert data["disagreements"] == []
    scout = rope_json(tmp_path, capsys, FAMILIES["Llama 4 Scout"])
    assert {e for e, r in scout["engines"].items() if isinstance(r, dict)} == {"llama.cpp", "mlx-lm"}
