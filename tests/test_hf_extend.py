"""``posenc extend`` on models with a RoPE per layer type (Gemma 3) and on NoPE/RoPE hybrids
(SmolLM3, Llama 4, Cohere2): tiny random models built with transformers, saved, extended end to
end, and every candidate's written config loaded by plain transformers, whose logits must be the
patched model's.

The reference is transformers itself: a config.json is right when transformers, reading it
with the same weights, computes what the patched model computed. Gemma 3's scaling goes to its
full layers, so its config must keep the sliding layers' RoPE apart (``rope_parameters`` keyed
by layer type); Llama 4 and Cohere2 rotate interleaved pairs in their attention code, which
their config does not spell. The written configs are also checked to differ from the
checkpoint's where the RoPE was scaled, so the comparison can fail.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")

from posenc.hf import patch_model, unpatch_model  # noqa: E402
from posenc.hf.extend import ExtendSettings, extend, extended_config, write_extended  # noqa: E402

VOCAB, L, N, WINDOW = 260, 64, 256, 8  # bytes as tokens (no tokenizer saved); N: past a passkey prompt
SLIDING, FULL = "sliding_attention", "full_attention"
_SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
              num_hidden_layers=4, max_position_embeddings=L, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
FAMILIES = {  # model_type -> (config class, causal LM class, config kwargs)
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(head_dim=8, layer_types=[SLIDING, FULL, SLIDING, FULL], sliding_window=WINDOW,
                         query_pre_attn_scalar=8, rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": 1e4},
                                                                   FULL: {"rope_type": "default", "rope_theta": 1e6}})),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM",
                    dict(head_dim=8, intermediate_size_mlp=64, num_local_experts=2, attention_chunk_size=WINDOW,
                         floor_scale=4, attn_scale=0.5, attn_temperature_tuning=True)),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=WINDOW)),
}


def make(name: str) -> torch.nn.Module:
    cfg_cls, lm_cls, kw = FAMILIES[name]
    torch.manual_seed(0)
    return getattr(transformers, lm_cls)(getattr(transformers, cfg_cls)(**(_SIZES | kw))).eval()


def from_config(config: dict, state: dict) -> torch.nn.Module:
    """Plain transformers' model of a config.json dict, with ``state`` as its weights."""
    config = dict(config)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(config.pop("model_type"),
                                                                                              **config)).eval()
    model.load_state_dict(state)
    return model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and b.abs().max() > 0
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("name", list(FAMILIES))
@torch.no_grad()
def test_extend_writes_configs_plain_transformers_loads_with_the_patched_logits(name, tmp_path):
    model = make(name)
    model.save_pretrained(tmp_path / "ckpt")
    own = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    ev = extend(tmp_path / "ckpt", ExtendSettings(to=N, factors=(1.0,)), tmp_path / "out", progress=False, loaded=model)
    rows = ev["candidates"]
    scaled = [r for r in rows if r["scaling"] is not None]
    assert rows[0]["hf"] is None and len(scaled) >= 5, [r["label"] for r in rows]
    assert {r["scaling"] for r in scaled} >= {"linear", "dynamic", "yarn"}
    ids = torch.randint(3, VOCAB, (1, 96), generator=torch.Generator().manual_seed(1))  # past L: the scalings act
    unscaled = model(input_ids=ids).logits
    state = model.state_dict()
    for r in scaled:
        if name == "gemma3_text":  # the scaling on the full layers, the sliding layers' RoPE as it was
            assert set(r["hf"]["rope_parameters"]) == {SLIDING, FULL}, r["label"]
            assert r["hf"]["rope_parameters"][SLIDING] == {"rope_type": "default", "rope_theta": 1e4}, r["label"]
        patch_model(model, scaling=r["scaling"], **r["params"])
        try:
            want = model(input_ids=ids).logits
        finally:
            unpatch_model(model)
        assert rel(want, unscaled) > 1e-4, r["label"]  # the scaling changes these logits
        got = from_config(extended_config(own, r["hf"], N), state)(input_ids=ids).logits
        assert rel(got, want) <= 1e-5, r["label"]
    # the folder itself, as a user loads it: the winner, and a scaled candidate written the same way
    winner = next(r for r in rows if r["label"] == ev["winner"])
    dynamic = next(r for r in scaled if r["scaling"] == "dynamic")  # Gemma 3: a top-level key only one type needs
    write_extended(tmp_path / "ckpt", tmp_path / "dyn", extended_config(own, dynamic["hf"], N), {})
    for folder, r in ((tmp_path / "out", winner), (tmp_path / "dyn", dynamic)):
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        if r["scaling"] is not None:
            patch_model(model, scaling=r["scaling"], **r["params"])
        try:
            want = model(input_ids=ids).logits
        finally:
            unpatch_model(model)
        assert rel(loaded(input_ids=ids).logits, want) <= 1e-5, (folder.name, r["label"])


def test_extended_config_drops_the_hub_spelling_it_supersedes():
    """A Hub-spelled Gemma 3 config.json (rope_theta, rope_local_base_freq, rope_scaling at the
    top level) written with rope_parameters keyed by layer type keeps none of those keys: they
    would contradict it."""
    hub = dict(model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4,
               rope_scaling={"rope_type": "linear", "factor": 8.0}, max_position_embeddings=L)
    hf = {"rope_parameters": {SLIDING: {"rope_type": "default", "rope_theta": 1e4},
                              FULL: {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "head_dim": 8}
    out = extended_config(hub, hf, N)
    assert out == dict(model_type="gemma3_text", max_position_embeddings=N, **hf)


# ---- what config.json, the tokenizer and the text decide: refused before any weight is read

_SMALL_HEADER = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()


def _folder(path, config: dict):
    """A checkpoint folder of ``config`` whose one safetensors file holds no model weight: loading
    it would fail, so a refusal that comes out of extend came before any weight was read."""
    import struct

    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(_SMALL_HEADER)) + _SMALL_HEADER + b"\0" * 16)
    return path


_LLAMA = dict(model_type="llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
              intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=L, rope_theta=10000.0)
# Qwen2-VL as transformers 5 writes it: the language model's M-RoPE in text_config, no rope key at the top
_QWEN2_VL = dict(model_type="qwen2_vl", vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2),
                 text_config=dict(model_type="qwen2_vl_text", hidden_size=32, num_attention_heads=4,
                                  num_key_value_heads=2, num_hidden_layers=2, intermediate_size=64, vocab_size=VOCAB,
                                  max_position_embeddings=L,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                   "mrope_section": [2, 1, 1]}))


@pytest.fixture
def no_weights(monkeypatch):
    """extend with loading the model (and, unless allowed, the tokenizer) made a test failure."""
    import posenc.hf.checkpoint as checkpoint

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(checkpoint, "load_model", refuse)
    return refuse


def test_qwen2_vl_is_refused_as_m_rope_not_as_ropeless(tmp_path, no_weights):
    """The family's own reading comes first: Qwen2-VL keeps its M-RoPE in text_config, and extend
    says it cannot write a scaled M-RoPE (it used to say the model had no RoPE at all)."""
    from posenc.hf.evaluation import check_has_rope

    ckpt = _folder(tmp_path / "qwen2vl", _QWEN2_VL)
    with pytest.raises(ValueError) as e:
        extend(ckpt, ExtendSettings(to=2 * L), progress=False)
    msg = str(e.value)
    assert "model_type 'qwen2_vl' rotates with M-RoPE" in msg and "has no RoPE" not in msg and "\n" not in msg
    check_has_rope(_QWEN2_VL, "MODEL")  # the general check reads text_config: a RoPE is there
    check_has_rope(dict(model_type="qwen2_vl"), "MODEL")  # an M-RoPE type is RoPE whatever it spells
    with pytest.raises(ValueError, match="has no RoPE"):
        check_has_rope(dict(model_type="gpt2", text_config=dict(n_positions=64)), "MODEL")


def test_to_within_l_is_refused_before_the_tokenizer_or_the_weights(tmp_path, no_weights, monkeypatch):
    import posenc.hf.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "load_tokenizer", no_weights)
    ckpt = _folder(tmp_path / "ckpt", _LLAMA)
    with pytest.raises(ValueError, match=rf"--to must exceed the trained length L = {L} .*got {L}$"):
        extend(ckpt, ExtendSettings(to=L), progress=False)


def test_out_with_a_stated_shorter_l_is_refused_and_nothing_is_written(tmp_path, no_weights, monkeypatch):
    """--trained-length is a demonstration: its config.json (original_max_position_embeddings = the
    stated L) would look like a shipped extension of a model that never needed one."""
    import posenc.hf.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "load_tokenizer", no_weights)
    ckpt = _folder(tmp_path / "ckpt", _LLAMA)
    with pytest.raises(ValueError, match=rf"--out with --trained-length 32, shorter than the model's own {L}: "):
        extend(ckpt, ExtendSettings(to=64, trained_length=32), tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_to_longer_than_the_text_is_blamed_on_to_before_loading(tmp_path, no_weights):
    ckpt = _folder(tmp_path / "ckpt", _LLAMA)
    data = tmp_path / "small.txt"
    data.write_text("alpha beta gamma delta\n" * 400)  # 9200 bytes: a validation part of ~920 byte tokens
    with pytest.raises(ValueError) as e:
        extend(ckpt, ExtendSettings(to=4096, data=str(data)), progress=False)
    assert str(e.value).startswith("--to 4096 with --windows 1 (windows of N tokens, and one more) needs 4097 tokens "
                                   f"of text; the validation part of --data {str(data)!r} is "), str(e.value)


@pytest.mark.parametrize("field, value, bound", [("to", 2**20 + 1, 2**20), ("passkey_examples", 10**9, 1000),
                                                 ("windows", 1001, 1000), ("trained_length", 2**21, 2**20)])
def test_settings_are_bounded(field, value, bound):
    with pytest.raises(ValueError, match=rf"must be in \[\d+, {bound}\], got {value}"):
        ExtendSettings(**(dict(to=128) | {field: value}))


def test_a_killed_runs_temporary_folder_is_removed_by_the_next(tmp_path):
    """kill -9 while write_extended copies: its hidden folder beside --out stays (no except ran);
    the next write removes it, since its writer is gone, and keeps a live writer's."""
    import signal
    import subprocess
    import sys
    import time

    src = _folder(tmp_path / "ckpt", _LLAMA)
    (src / "tokenizer.json").write_text("{}")  # a file write_extended copies: the copy blocks
    out = tmp_path / "out"
    script = ("import shutil, sys, time\n"
              "from pathlib import Path\n"
              "from posenc.hf.extend import write_extended\n"
              "shutil.copy2 = lambda *a, **k: time.sleep(600)\n"
              "write_extended(Path(sys.argv[1]), Path(sys.argv[2]), {}, {})\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(src), str(out)])
    tmp = tmp_path / f".out.tmp-{child.pid}"
    try:
        for _ in range(600):
            if tmp.is_dir():
                break
            time.sleep(0.1)
        assert tmp.is_dir(), "the child never made its temporary folder"
        live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            kept = tmp_path / f".out.tmp-{live.pid}"
            kept.mkdir()
            child.send_signal(signal.SIGKILL)
            child.wait()
            assert tmp.is_dir()  # kill -9: nothing cleaned up
            write_extended(src, out, dict(_LLAMA), {"winner": "none"})
            assert not tmp.exists() and kept.is_dir()
            assert json.loads((out / "config.json").read_text()) == _LLAMA
        finally:
            live.kill()
            live.wait()
    finally:
        child.kill()
        child.wait()


def test_a_demonstration_keeps_its_evidence_with_json(tmp_path, capsys):
    """``posenc extend --trained-length L --json PATH``: the evidence without a checkpoint folder;
    ``--json`` alone: one JSON document on stdout (no table), the same evidence."""
    from posenc.cli import main

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**_SIZES, rope_theta=1e4)).save_pretrained(tmp_path / "m")
    argv = ["extend", str(tmp_path / "m"), "--to", str(N), "--trained-length", str(L // 2), "--factors", "1",
            "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert "--out with --trained-length 32, shorter than the model's own 64" in capsys.readouterr().err
    assert main([*argv, "--json", str(tmp_path / "ev.json")]) == 0
    table = capsys.readouterr().out
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["trained_length"] == L // 2 and ev["settings"]["to"] == N and ev["winner"] in table
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)  # the whole of stdout: one document
    untimed = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert untimed(printed["candidates"]) == untimed(ev["candidates"]) and len(ev["candidates"]) >= 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.json", "m"]
