"""posenc.hf.export.llamacpp and gguf_rope: extend's winner as llama.cpp's flags, and a GGUF whose
rope metadata says it, its tensors untouched.

A tiny GGUF (SmolLM2's llama metadata, a few tensors of random bytes: float32, float16 and a
Q8_0 block, written with gguf.GGUFWriter) is exported; the new file is read back with
GGUFReader: the rope keys must be the expected values, every other key the old one, every
tensor's bytes the old ones. The frequencies llama.cpp computes from the new file and the flags
(``posenc.engines.llamacpp``, a reading of llama.cpp's runtime) must be the winner's.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from posenc.hf.export import Winner  # noqa: E402
from posenc.hf.export.gguf_rope import check_gguf  # noqa: E402
from posenc.hf.export.llamacpp import llamacpp_export, llamacpp_flags  # noqa: E402
from test_hf_export_vllm import CONFIG, L, N, grid, scaled, winner  # noqa: E402

ARCH = "llama"


def tiny_gguf(path: Path, *, ctx: int = L, base: float = 100000.0, rope_freqs: bool = False) -> Path:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_block_count(2)
    w.add_context_length(ctx)
    w.add_embedding_length(576)
    w.add_feed_forward_length(1536)
    w.add_head_count(9)
    w.add_head_count_kv(3)
    w.add_rope_dimension_count(64)
    w.add_rope_freq_base(base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_string("general.name", "tiny smollm2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.add_tensor("token_embd.weight", rng.standard_normal((3, 576)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((64, 576)).astype(np.float16))
    w.add_tensor("blk.1.ffn_up.weight", rng.integers(0, 256, (4, 34), dtype=np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # 4 rows of one 32-value block
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def fields(path: Path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}


def tensor_bytes(path: Path) -> dict:
    return {t.name: hashlib.sha256(t.data.tobytes()).hexdigest() for t in gguf.GGUFReader(str(path)).tensors}


def as_dict(flags: list[str]) -> dict:
    """--name value pairs as posenc.engines.llamacpp takes them (-c is --ctx-size)."""
    out = {}
    for name, value in zip(flags[::2], flags[1::2]):
        name = "ctx-size" if name == "-c" else name.lstrip("-")
        out[name] = value if name == "rope-scaling" else float(value)
    return out


def llamacpp_freqs(path: Path | None, flags: list[str], metadata: dict | None = None):
    from posenc.engines.gguf_meta import read_gguf_metadata
    from posenc.engines.llamacpp import rope_from_gguf_metadata

    (rope,) = rope_from_gguf_metadata(metadata or read_gguf_metadata(path), as_dict(flags))
    return rope


ROPE_KEYS = {f"{ARCH}.context_length", f"{ARCH}.rope.freq_base", f"{ARCH}.rope.scaling.type",
             f"{ARCH}.rope.scaling.factor", f"{ARCH}.rope.scaling.original_context_length",
             f"{ARCH}.rope.scaling.attn_factor"}


def test_yarn_x2_gguf_changes_only_the_rope_keys_and_keeps_every_tensor_byte(tmp_path):
    src = tiny_gguf(tmp_path / "smol.gguf")
    (tmp_path / "out").mkdir()
    done = llamacpp_export(winner("yarn"), tmp_path / "out", gguf=src)
    new = Path(done["files"][0])
    assert new.name == f"smol.posenc-{N}.gguf" and done["notes"] == []
    old_f, new_f = fields(src), fields(new)
    assert {k: new_f[k] for k in ROPE_KEYS} == {
        f"{ARCH}.context_length": N, f"{ARCH}.rope.freq_base": 100000.0, f"{ARCH}.rope.scaling.type": "yarn",
        f"{ARCH}.rope.scaling.factor": 2.0, f"{ARCH}.rope.scaling.original_context_length": L,
        f"{ARCH}.rope.scaling.attn_factor": 1.0}
    assert {k: v for k, v in new_f.items() if k not in ROPE_KEYS} == {k: v for k, v in old_f.items()
                                                                        if k not in ROPE_KEYS}
    assert len(old_f) > len(ROPE_KEYS)  # the comparison covers keys
    assert tensor_bytes(new) == tensor_bytes(src) and len(tensor_bytes(src)) == 3
    record = json.loads(Path(done["files"][1]).read_text())
    assert record["tensors"] == tensor_bytes(src) and record["added"] == {}
    # llama.cpp's reading of the new file with the written flags: the winner's RoPE
    flags = shlex.split(done["command"])[3:]
    got, ref = llamacpp_freqs(new, flags), scaled("yarn", winner("yarn").row["params"])
    torch.testing.assert_close(got.inv_freq, ref.inv_freq, rtol=1e-6, atol=0)
    assert got.attention_factor == pytest.approx(ref.attention_factor, rel=1e-6)


@pytest.mark.parametrize("name,expected", [
    ("none", ["--rope-scaling", "none", "--rope-freq-base", "100000"]),
    ("linear", ["--rope-scaling", "linear", "--rope-scale", "2"]),
    ("ntk", ["--rope-scaling", "none", "--rope-freq-base", repr(100000.0 * 2.0 ** (64 / 62))]),
    ("yarn", ["--rope-scaling", "yarn", "--rope-scale", "2", "--yarn-orig-ctx", str(L), "--yarn-ext-factor", "1",
              "--yarn-beta-fast", "32", "--yarn-beta-slow", "1"]),
])
def test_flags_of_each_scaling_run_its_frequencies_in_llamacpp(name, expected, tmp_path):
    binary, flags, notes, _ = llamacpp_flags(winner(name))
    assert binary == "llama-server" and notes == [] and flags == expected + ["-c", str(N)]
    src = tiny_gguf(tmp_path / "smol.gguf")  # the checkpoint's own file, untouched: the flags do it all
    got = llamacpp_freqs(src, flags)
    ref = scaled(name, winner(name).row["params"]) if name != "none" else scaled("default", {})
    torch.testing.assert_close(got.inv_freq, ref.inv_freq, rtol=1e-6, atol=0)


def test_llama3_needs_the_gguf_and_gets_rope_freqs(tmp_path):
    _, flags, notes, written = llamacpp_flags(winner("llama3"))
    assert len(notes) == 1 and "rope_freqs" in notes[0] and written["label"] == "linear"
    src = tiny_gguf(tmp_path / "smol.gguf")
    (tmp_path / "out").mkdir()
    done = llamacpp_export(winner("llama3"), tmp_path / "out", gguf=src)
    new = Path(done["files"][0])
    assert done["notes"] == [] and done["written"] == "llama3"
    after = tensor_bytes(new)
    assert {k: after[k] for k in tensor_bytes(src)} == tensor_bytes(src) and set(after) - set(tensor_bytes(src)) == {
        "rope_freqs.weight"}
    factors = next(t for t in gguf.GGUFReader(str(new)).tensors if t.name == "rope_freqs.weight").data
    ref = scaled("llama3", winner("llama3").row["params"])
    expected = (scaled("default", {}).inv_freq / ref.inv_freq).numpy()
    np.testing.assert_allclose(factors, expected, rtol=1e-6)
    assert factors.min() == 1.0 and factors.max() == 2.0  # high frequencies kept, low ones / factor
    got = llamacpp_freqs(new, shlex.split(done["command"])[3:])
    torch.testing.assert_close(got.inv_freq, ref.inv_freq, rtol=1e-6, atol=0)


def test_self_extend_gets_grp_attn_with_G_and_W_from_its_parameters():
    w = winner("self_extend")
    G, W = w.row["params"]["group_size"], w.row["params"]["neighbor_window"]
    binary, flags, notes, _ = llamacpp_flags(w)
    assert binary == "llama-completion"
    got_G, got_W = int(flags[flags.index("--grp-attn-n") + 1]), int(flags[flags.index("--grp-attn-w") + 1])
    assert got_G == G == 3 and got_W == W - W % G == 2046 and got_W % got_G == 0
    assert any("multiple" in n for n in notes) and flags[:2] == ["--rope-scaling", "none"]


def test_a_group_dividing_the_window_is_kept_as_it_is():
    rows = list(grid())
    rows[-3] = dict(rows[-3], params={"group_size": 4, "neighbor_window": 2048})
    _, flags, notes, _ = llamacpp_flags(Winner(tuple(rows), len(rows) - 3, CONFIG, L, N, "/m"))
    assert flags[-4:] == ["--grp-attn-n", "4", "--grp-attn-w", "2048"] and not any("multiple" in n for n in notes)


@pytest.mark.parametrize("method", ["rerope", "dual_chunk"])
def test_rerope_and_dual_chunk_say_so_and_give_the_nearest(method):
    _, flags, notes, written = llamacpp_flags(winner(method))
    assert len(notes) == 1 and "cannot run" in notes[0] and written["label"] == "linear"
    assert flags[:4] == ["--rope-scaling", "linear", "--rope-scale", "2"]


def test_dynamic_is_the_static_base_it_reaches_at_N():
    _, flags, notes, _ = llamacpp_flags(winner("dynamic"))
    assert len(notes) == 1 and "dynamic" in notes[0]
    base = float(flags[flags.index("--rope-freq-base") + 1])
    assert base == pytest.approx(100000.0 * 2.0 ** (64 / 62), rel=1e-12)


def test_sh_without_gguf_names_a_placeholder_and_notes(tmp_path):
    done = llamacpp_export(winner("rerope"), tmp_path)
    text = (tmp_path / "llama.cpp.sh").read_text().splitlines()
    assert text[-1] == done["command"] and "MODEL.gguf" in text[-1] and done["files"] == [str(tmp_path / "llama.cpp.sh")]
    assert any("cannot run" in line for line in text if line.startswith("#"))


@pytest.mark.parametrize("kw,match", [(dict(ctx=4096), "context_length is 4096"), (dict(base=10000.0), "freq_base"),
                                      (dict(rope_freqs=True), "already has rope_freqs")])
def test_a_gguf_of_another_checkpoint_is_refused(kw, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        check_gguf(tiny_gguf(tmp_path / "x.gguf", **kw), winner("yarn"))


def test_not_a_gguf_is_refused(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        check_gguf(tmp_path / "x.gguf", winner("yarn"))


@torch.no_grad()
def test_extend_exports_vllm_and_llamacpp_end_to_end(tmp_path, capsys):
    """``posenc extend`` on a tiny random Llama, as the CLI calls it: the folder holds the
    checkpoint, vllm.json / vllm.sh, llama.cpp.sh and the GGUF, and the printed lines name them."""
    transformers = pytest.importorskip("transformers", minversion="5")
    from posenc.hf.extend import ExtendSettings, extend

    cfg = transformers.LlamaConfig(vocab_size=260, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "ckpt")
    src = tiny_gguf(tmp_path / "tiny.gguf", ctx=64, base=10000.0)
    ev = extend(tmp_path / "ckpt", ExtendSettings(to=256, factors=(1.0,), scalings=("yarn",), methods=()),
                tmp_path / "out", progress=False, loaded=model, export=("hf", "vllm", "llama.cpp"), gguf=src)
    out = tmp_path / "out"
    assert {"config.json", "extend.json", "vllm.json", "vllm.sh", "llama.cpp.sh", "tiny.posenc-256.gguf",
            "tiny.posenc-256.gguf.sha256.json"} <= {p.name for p in out.iterdir()}
    assert [e["target"] for e in ev["exports"]] == ["vllm", "llama.cpp"]
    assert json.loads((out / "extend.json").read_text())["exports"] == ev["exports"]  # the folder's record has them
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary left
    printed = capsys.readouterr().out
    for e in ev["exports"]:
        assert e["command"] in printed and all(f in printed for f in e["files"])
    written = ev["exports"][0]["written"]
    overrides = json.loads((out / "vllm.json").read_text())
    if written != "none":  # the winner's rope_parameters are config.json's
        assert overrides["rope_parameters"] == json.loads((out / "config.json").read_text())["rope_parameters"]
    assert overrides["max_position_embeddings"] == 256
    assert fields(out / "tiny.posenc-256.gguf")[f"{ARCH}.context_length"] == 256
