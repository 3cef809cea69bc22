"""``posenc rope FILE``: the table, the JSON and the one-line errors, on config.json files
written here (transformers is always read; the other engines as they are registered)."""

from __future__ import annotations

import json

import pytest
import torch

from posenc.cli import main

LLAMA = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_hidden_layers": 4,
         "rope_theta": 100000.0, "max_position_embeddings": 8192}


def write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return path


def test_table_names_the_engines_and_the_length(tmp_path, capsys):
    path = write(tmp_path, dict(LLAMA, rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                     "original_max_position_embeddings": 8192}))
    assert main(["rope", str(path), "--length", "16384"]) == 0
    out = capsys.readouterr().out
    assert "engines compared at 16384 tokens" in out and "transformers" in out
    assert "rules derived from: transformers 5.23" in out


def test_folder_and_json_give_the_full_vectors(tmp_path, capsys):
    write(tmp_path, LLAMA)
    assert main(["rope", str(tmp_path), "--engines", "transformers", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (rope,) = data["engines"]["transformers"]
    expected = [100000.0 ** (-2 * i / 64) for i in range(32)]
    assert torch.allclose(torch.tensor(rope["inv_freq"], dtype=torch.float64), torch.tensor(expected, dtype=torch.float64), rtol=1e-12)
    assert data["length"] == 8192 and data["disagreements"] == []


@pytest.mark.parametrize("content, args, message", [
    (None, ["missing.json"], "no such file"),
    ("{not json", ["config.json"], "not a JSON config"),
    ("[1, 2]", ["config.json"], "must hold a JSON object"),
    (json.dumps(LLAMA), ["config.json", "--engines", "tgi"], "--engines: unknown tgi"),
    (json.dumps({k: v for k, v in LLAMA.items() if k != "max_position_embeddings"}), ["config.json"], "--length"),
])
def test_bad_input_is_one_line(tmp_path, capsys, content, args, message):
    if content is not None:
        write(tmp_path, content)
    assert main(["rope", str(tmp_path / args[0]), *args[1:]]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_folder_without_config_is_refused(tmp_path, capsys):
    assert main(["rope", str(tmp_path)]) == 2
    assert "a folder without config.json" in capsys.readouterr().err


def test_a_gguf_file_is_read_by_transformers_and_by_llamacpp_from_its_metadata(tmp_path, capsys):
    pytest.importorskip("gguf")
    from test_hf_export_llamacpp import tiny_gguf

    path = tiny_gguf(tmp_path / "tiny.gguf", ctx=8192, base=100000.0, rope_freqs=True)
    assert main(["rope", str(path), "--length", "16384", "--engines", "llama.cpp", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = 100000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)  # rope_freqs of ones: unchanged
    for engine in ("transformers", "llama.cpp"):
        (rope,) = out["engines"][engine]
        assert torch.allclose(torch.tensor(rope["inv_freq"], dtype=torch.float64), want, rtol=1e-6)
    assert out["disagreements"] == []
