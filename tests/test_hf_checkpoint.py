"""posenc.hf.checkpoint: the weight files posenc checks are the ones transformers loads.

posenc sizes, checks and fingerprints a folder's safetensors; transformers chooses its own file
(``model.safetensors``, an index's shards, ``transformers_weights``, else ``pytorch_model.bin``).
Each test builds a tiny Llama folder and compares what :func:`weight_files` names, and what
:func:`load_model` evaluates, with the tensors of a file written here.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from posenc.hf.checkpoint import fingerprint, load_model, open_checkpoint, weight_files  # noqa: E402

_CFG = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            intermediate_size=64, vocab_size=260, max_position_embeddings=64)


def _folder(path, seed=0):
    """A save_pretrained Llama folder; returns (folder, its state dict)."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_CFG))
    model.save_pretrained(path, safe_serialization=True)
    return path, {k: v.clone() for k, v in model.state_dict().items()}


def _other_weights(state):
    return {k: v + 1.0 for k, v in state.items()}


def _embed(model):
    return model.get_input_embeddings().weight.detach()


def test_a_safetensors_file_transformers_does_not_read_beside_a_bin_is_refused(tmp_path):
    """Before: posenc fingerprinted and sized other.safetensors while transformers evaluated the
    .bin (shown here: transformers' own choice is the .bin)."""
    folder, state = _folder(tmp_path / "m")
    (folder / "model.safetensors").rename(folder / "other.safetensors")
    torch.save(_other_weights(state), folder / "pytorch_model.bin")
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    assert torch.equal(_embed(plain), state["model.embed_tokens.weight"] + 1.0)  # the .bin, not what was checked
    with pytest.raises(ValueError, match=r"^MODEL_DIR '.*m' has no model\.safetensors or model\.safetensors\.index"
                                         r"\.json, the weights transformers reads \(found other\.safetensors, "
                                         r"pytorch_model\.bin\): rename the safetensors file to model\.safetensors"):
        open_checkpoint(folder)


def test_a_bin_beside_model_safetensors_is_never_loaded(tmp_path):
    folder, state = _folder(tmp_path / "m")
    torch.save(_other_weights(state), folder / "pytorch_model.bin")
    ckpt = open_checkpoint(folder)
    assert ckpt.weights == (folder / "model.safetensors",)
    model = load_model(ckpt, torch.float32, progress=False)
    for k, v in load_file(str(folder / "model.safetensors")).items():
        assert torch.equal(model.state_dict()[k], v), k


def test_a_stray_safetensors_file_is_not_counted(tmp_path):
    """Only the file transformers reads is sized and fingerprinted: a stray file changes neither."""
    folder, state = _folder(tmp_path / "m")
    before = fingerprint(open_checkpoint(folder))
    save_file({"x": torch.zeros(1000, 1000)}, str(folder / "adapter.safetensors"))
    ckpt = open_checkpoint(folder)
    assert ckpt.weights == (folder / "model.safetensors",) and fingerprint(ckpt) == before


def test_sharded_weights_are_the_index_shards(tmp_path):
    folder, state = _folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    keys = sorted(state)
    halves = {"a.safetensors": keys[: len(keys) // 2], "b.safetensors": keys[len(keys) // 2:]}
    for name, ks in halves.items():
        save_file({k: state[k].contiguous() for k in ks}, str(folder / name))
    index = {"metadata": {}, "weight_map": {k: name for name, ks in halves.items() for k in ks}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    ckpt = open_checkpoint(folder)
    assert ckpt.weights == (folder / "a.safetensors", folder / "b.safetensors")
    model = load_model(ckpt, torch.float32, progress=False)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items() if k in model.state_dict())
    index["weight_map"][keys[0]] = "../outside.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json names the shard '\.\./outside\.safetensors', "
                                         r"which is not a \.safetensors file beside it"):
        open_checkpoint(folder)
    (folder / "model.safetensors.index.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"is not a safetensors index \(a JSON object with a weight_map\)"):
        open_checkpoint(folder)


def test_transformers_weights_in_the_config_is_what_is_checked(tmp_path):
    """config.json's transformers_weights makes transformers read that file, so posenc checks it."""
    folder, state = _folder(tmp_path / "m")
    (folder / "model.safetensors").rename(folder / "chosen.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, transformers_weights="chosen.safetensors")))
    ckpt = open_checkpoint(folder)
    assert ckpt.weights == (folder / "chosen.safetensors",)
    model = load_model(ckpt, torch.float32, progress=False)
    assert torch.equal(_embed(model), state["model.embed_tokens.weight"])
    for bad in ("pytorch_model.bin", "../chosen.safetensors"):
        (folder / "config.json").write_text(json.dumps(dict(cfg, transformers_weights=bad)))
        with pytest.raises(ValueError, match=r"config\.json: transformers_weights"):
            open_checkpoint(folder)


def test_a_folder_without_safetensors_names_what_it_has(tmp_path):
    """No safetensors at all: the old one-line message, with what was found."""
    folder, state = _folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"has no \*\.safetensors weights \(found pytorch_model\.bin: convert"):
        weight_files(folder, {})
