"""posenc.hf.export.vllm: extend's winner as vLLM 0.33.0's ``--hf-overrides`` and serve line.

The reference for each winner is the RoPE the patched model ran with, built independently of the
export: the checkpoint's RoPE (``from_hf`` of its config) with the winner's scaling set. The
overrides are applied as vLLM applies them (a dict value replaces the config's, a flat value
updates it) and read back by ``posenc.rotary.from_hf``: its frequencies and attention factor
must be the reference's.
"""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from posenc.hf.export import Winner
from posenc.hf.export.vllm import apply_overrides, dual_chunk_config, vllm_export, vllm_overrides
from posenc.methods import METHODS
from posenc.rotary import from_hf, to_hf
from posenc.rotary.scaling import SCALINGS

# SmolLM2-135M's RoPE: llama, theta 100000, L = 8192, head_dim 64
CONFIG = dict(model_type="llama", hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
              rope_theta=100000.0, max_position_embeddings=8192, num_hidden_layers=30, rope_scaling=None)
L, N = 8192, 16384


def scaled(name: str, params: dict) -> torch.nn.Module:
    rope = from_hf(CONFIG)
    rope.set_scaling(name, **params)
    return rope


def row(label, scaling=None, method=None, params=None, ppl=10.0, passkey=1.0):
    params = dict(params or {})
    hf = to_hf(scaled(scaling, params)) if scaling else None
    return dict(label=label, scaling=scaling, method=method, params=params, hf=hf, ppl=ppl, passkey=passkey,
                passkey_high=1.0)


def grid() -> list[dict]:
    """The model, each scaling at N / L (perplexity rising down the list: linear is the best
    scaling), each method (perplexity 5: a method wins whenever it is chosen)."""
    rows = [row("none", ppl=30.0)]
    for i, name in enumerate(["linear", "ntk", "dynamic", "yarn", "llama3"]):
        rows.append(row(name, name, params=SCALINGS[name].at_factor(N / L, L), ppl=12.0 + i))
    for name in METHODS:
        rows.append(row(name, method=name, params=METHODS[name].recommended(L, N), ppl=5.0))
    return rows


def winner(label: str, config=CONFIG) -> Winner:
    rows = grid()
    return Winner(tuple(rows), [r["label"] for r in rows].index(label), config, L, N, "/models/smollm2")


def read_back(overrides: dict, config=CONFIG):
    return from_hf(apply_overrides(config, overrides))


@pytest.mark.parametrize("name", ["linear", "ntk", "yarn", "llama3"])
def test_overrides_read_back_give_the_winners_frequencies(name):
    w = winner(name)
    overrides, notes, written = vllm_overrides(w)
    assert notes == [] and written is w.row
    ref = scaled(name, w.row["params"])
    got = read_back(overrides)
    torch.testing.assert_close(got.inv_freq, ref.inv_freq, rtol=1e-12, atol=0)
    assert got.attention_factor == pytest.approx(ref.attention_factor, rel=1e-12)
    plain = from_hf(CONFIG)
    assert not torch.allclose(plain.inv_freq, ref.inv_freq)  # the comparison can fail
    assert overrides["max_position_embeddings"] >= N  # vLLM's --max-model-len N is then allowed


def test_yarn_and_ntk_spelled_as_vllm_reads_them():
    yarn = vllm_overrides(winner("yarn"))[0]["rope_parameters"]
    assert yarn["rope_type"] == "yarn" and yarn["factor"] == 2.0 and yarn["original_max_position_embeddings"] == L
    ntk = vllm_overrides(winner("ntk"))[0]["rope_parameters"]  # vLLM's own "ntk" type is another formula
    assert ntk == {"rope_type": "default", "rope_theta": pytest.approx(100000.0 * 2.0 ** (64 / 62), rel=1e-12)}


def test_dynamic_is_the_static_base_it_reaches_at_N():
    w = winner("dynamic")
    overrides, notes, written = vllm_overrides(w)
    assert len(notes) == 1 and "dynamic" in notes[0] and written["scaling"] == "ntk"
    ref_freq, ref_factor = scaled("dynamic", w.row["params"]).frequencies(N)
    got = read_back(overrides)
    torch.testing.assert_close(got.inv_freq, ref_freq, rtol=1e-12, atol=0)
    assert got.attention_factor == ref_factor


@pytest.mark.parametrize("method", list(METHODS))
def test_a_method_is_refused_in_one_note_and_the_best_rope_candidate_written(method):
    w = winner(method)
    overrides, notes, written = vllm_overrides(w)
    assert len(notes) == 1 and "cannot run" in notes[0] and "nearest: linear" in notes[0]
    assert written["label"] == "linear"  # the lowest perplexity among the RoPE rows
    torch.testing.assert_close(read_back(overrides).inv_freq, scaled("linear", {"factor": 2.0}).inv_freq)


def test_dual_chunk_on_qwen2_names_the_config_vllm_reads_and_why_it_cannot_run():
    qwen = dict(CONFIG, model_type="qwen2")
    overrides, notes, _ = vllm_overrides(winner("dual_chunk", qwen))
    dca = dual_chunk_config(METHODS["dual_chunk"].recommended(L, N), L)
    assert dca == {"chunk_size": 6144, "local_size": 1024, "original_max_position_embeddings": L}
    assert json.dumps(dca) in notes[0] and "no attention backend" in notes[0]
    assert "dual_chunk_attention_config" not in overrides


@pytest.mark.parametrize("name", ["yarn", "llama3", "dual_chunk"])
def test_files_and_the_serve_line_parse_back_to_the_same_json(name, tmp_path):
    w = winner(name)
    done = vllm_export(w, tmp_path)
    overrides = json.loads((tmp_path / "vllm.json").read_text())
    assert overrides == vllm_overrides(w)[0]
    lines = (tmp_path / "vllm.sh").read_text().splitlines()
    assert lines[0] == "#!/bin/sh" and lines[-1] == done["command"]
    argv = shlex.split(lines[-1])
    assert argv[:3] == ["vllm", "serve", "/models/smollm2"]
    assert argv[argv.index("--max-model-len") + 1] == str(N)
    assert json.loads(argv[argv.index("--hf-overrides") + 1]) == overrides
    assert all(x.startswith("#") for x in lines[1:-1]) and len(lines) - 3 == len(done["notes"])


def test_a_path_with_spaces_and_quotes_is_quoted():
    w = Winner(tuple(grid()), 4, CONFIG, L, N, "/models/it's a model")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        argv = shlex.split(vllm_export(w, Path(d))["command"])
    assert argv[2] == "/models/it's a model"


def test_yarn_below_N_warns_about_vllms_table():
    rows = [row("none", ppl=30.0), row("yarn x1.5", "yarn", params={"factor": 1.5, "original_max_position_embeddings": L})]
    _, notes, _ = vllm_overrides(Winner(tuple(rows), 1, CONFIG, L, N, "/m"))
    assert len(notes) == 1 and "12288 positions" in notes[0]
