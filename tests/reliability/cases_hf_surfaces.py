"""The Hugging Face surfaces of issue 24: messages that name the key or file at fault, the one
trained length (GPT-J's ``n_positions`` too), checked reads of config.json and weights for
``posenc probe`` and the relative loaders, and one writer per probe ``--out``.

Each case builds what it needs in a fresh temporary directory (the current directory while it
runs). Weight files are written by hand (an 8-byte header length, the JSON header, then the
bytes), so no case loads a model: each refusal comes before transformers reads a tensor.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Callable

from . import Case

A = "hf surfaces"

_LLAMA = dict(model_type="llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
              intermediate_size=64, vocab_size=260, max_position_embeddings=64, rope_theta=10000.0)
_BERT = dict(model_type="bert", hidden_size=32, num_attention_heads=4, num_hidden_layers=1, max_position_embeddings=16,
             position_embedding_type="relative_key")
_DEBERTA = dict(model_type="deberta-v2", hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
                relative_attention=True, pos_att_type=["c2p", "p2c"], max_position_embeddings=64)
# one float32 tensor of 4 elements: 16 bytes of data after the header
_HEADER = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}


def _in_tmp(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
            return fn()

    return run


def _folder(config: object = _LLAMA, data: int = 16, name: str = "ckpt") -> Path:
    """config.json (any JSON value) and model.safetensors holding ``data`` of its 16 data bytes."""
    p = Path(name)
    p.mkdir()
    (p / "config.json").write_text(json.dumps(config))
    raw = json.dumps(_HEADER).encode()
    (p / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data)
    return p


def _probe(folder: Callable[[], Path]) -> Callable[[], object]:
    def run() -> object:
        from posenc.hf.probe import ProbeSettings, probe

        return probe(folder(), "out", ProbeSettings(tokens=8, points=4, dtype="float32", scalings=()), progress=False)

    return _in_tmp(run)


def _loader(name: str, folder: Callable[[], Path]) -> Callable[[], object]:
    def run() -> object:
        from posenc import hf

        return getattr(hf, name)(folder())

    return _in_tmp(run)


def _from_hf(config: dict, **kw) -> Callable[[], object]:
    def run() -> object:
        from posenc.rotary import from_hf

        return from_hf(config, **kw)

    return run


def _patch_other_head_size() -> object:
    import torch
    import transformers

    from posenc.encoding import Dims
    from posenc.hf import patch_model
    from posenc.rotary import RotaryConfig, RotaryEmbedding

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=16)).eval()
    return patch_model(model, RotaryEmbedding(RotaryConfig(), Dims(d_model=32, num_heads=2, head_dim=16)))


def _trained_length(config: dict) -> Callable[[], object]:
    def run() -> object:
        from posenc.hf import trained_length

        return f"trained length {trained_length(config)}"

    return run


def _gptj_probe_settings() -> object:
    from posenc.hf import trained_length
    from posenc.rotary import from_hf

    config = dict(model_type="gptj", n_embd=32, n_head=4, n_layer=2, n_positions=64, rotary_dim=8, vocab_size=260)
    rope = from_hf(config)
    return (f"read: trained length {trained_length(config)} (n_positions), rotary_dim {rope.rotary_dim}, "
            f"layout {rope.config.layout}")


def _bench_model(folder: Callable[[], Path]) -> Callable[[], object]:
    def run() -> object:
        from posenc.hf import model_settings, run_model_bench

        try:
            settings, _ = model_settings("micro", folder(), tasks=["lm"])
            run_model_bench(settings, "out", progress=False)
        except ValueError as e:  # bench --model names the folder by its absolute path: shown as TMP
            return f"refused: {str(e).replace(os.getcwd(), 'TMP')}"
        return "not refused"

    return _in_tmp(run)


def _bad_bin() -> Path:
    p = Path("ckpt")
    p.mkdir()
    (p / "config.json").write_text(json.dumps(_DEBERTA))
    (p / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not a zip")
    return p


def _second_probe() -> str:
    from posenc.files import OutDirLock

    from posenc.hf.probe import ProbeSettings, probe

    with OutDirLock("out"):
        try:
            probe(_folder(), "out", ProbeSettings(tokens=8, points=4, dtype="float32", scalings=()), progress=False)
        except ValueError as e:  # the pid varies from run to run: the case shows it as PID
            return f"refused: {str(e).replace(str(os.getpid()), 'PID')}; out holds {sorted(os.listdir('out'))}"
    return "not refused"


def _text_dir() -> object:
    from posenc.hf.probe import ProbeSettings, probe

    Path("notes").mkdir()
    return probe(_folder(), "out", ProbeSettings(tokens=8, points=4, dtype="float32", scalings=()), text="notes",
                 progress=False)


CASES = [
    # messages that name the key at fault
    Case(A, "`from_hf` on a config without model_type and without its sizes",
         r"^config needs 'head_dim', or 'hidden_size' and 'num_attention_heads' to derive it$",
         _from_hf({"rope_theta": 10000.0})),
    Case(A, "`from_hf` with hidden_size not divisible by num_attention_heads",
         r"^hidden_size \(100\) must be divisible by num_attention_heads \(3\) to give the head size",
         _from_hf({"hidden_size": 100, "num_attention_heads": 3})),
    Case(A, "`from_hf` on GPT-J with n_embd not divisible by n_head",
         r"^n_embd \(100\) must be divisible by n_head \(3\)",
         _from_hf({"model_type": "gptj", "n_embd": 100, "n_head": 3, "rotary_dim": 8})),
    Case(A, "`patch_model(model, rope=...)` with a RoPE built for another head size",
         r"^rope.head_dim must be 8, the checkpoint's \(model_type 'llama'\); got 16 \(build it for the checkpoint's heads",
         _patch_other_head_size),
    # one trained length
    Case(A, "GPT-J config (n_positions, no max_position_embeddings) for probe / bench --model",
         r"read: trained length 64 \(n_positions\), rotary_dim 8, layout interleaved", _gptj_probe_settings, error=None),
    Case(A, "config with n_positions 1", r"^n_positions \(the trained length\) must be an int >= 2, got 1",
         _trained_length({"n_positions": 1})),
    Case(A, "Llama 3.1 config: the rope dict's original_max_position_embeddings is the trained length",
         r"trained length 8192", error=None,
         run=_trained_length({"max_position_embeddings": 131072, "rope_scaling": {
             "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}})),
    # checked reads: probe
    Case(A, "`posenc probe` on a safetensors file cut after its intact header",
         r"^ckpt/model.safetensors is truncated: its header describes \d+ bytes, the file has \d+",
         _probe(lambda: _folder(data=8))),
    Case(A, "`posenc probe` on weights of another architecture (transformers would fill the rest at random)",
         r"^MODEL_DIR 'ckpt' lacks \d+ weight\(s\) its llama model needs \(.*\): the checkpoint is incomplete",
         _probe(lambda: _folder())),
    Case(A, "`posenc bench --model` on a safetensors file cut after its intact header",
         r"^refused: TMP/ckpt/model.safetensors is truncated: its header describes \d+ bytes, the file has \d+",
         _bench_model(lambda: _folder(data=8)), error=None),
    Case(A, "`posenc bench --model` on weights of another architecture",
         r"^refused: MODEL_DIR 'TMP/ckpt' lacks \d+ weight\(s\) its llama model needs", _bench_model(lambda: _folder()),
         error=None),
    Case(A, "`posenc bench --model` on a config.json that holds a list",
         r"^refused: (TMP/)?ckpt/config.json must hold a JSON object, got list", _bench_model(lambda: _folder(config=[1, 2])),
         error=None),
    Case(A, "`posenc probe` on a config.json that holds a list", r"^ckpt/config.json must hold a JSON object, got list",
         _probe(lambda: _folder(config=[1, 2]))),
    Case(A, "`posenc probe --text DIR`", r"^--text must be a text file, got 'notes', which is a directory$",
         _in_tmp(_text_dir)),
    Case(A, "a second `posenc probe` on the same --out",
         r"refused: --out out is in use by another posenc bench \(pid PID\).*; out holds \['.lock'\]",
         _in_tmp(_second_probe), error=None),
    # checked reads: the relative loaders
    Case(A, "`relative_from_bert` on a config.json that is not JSON",
         r"^ckpt/config.json is not valid JSON", _loader("relative_from_bert", lambda: _write_config(_folder(_BERT), "{x"))),
    Case(A, "`relative_from_bert` on a config.json that holds a list",
         r"^ckpt/config.json must hold a JSON object, got list", _loader("relative_from_bert", lambda: _folder([_BERT]))),
    Case(A, "`relative_from_deberta` on a safetensors file cut after its intact header",
         r"^ckpt/model.safetensors is truncated: its header describes",
         _loader("relative_from_deberta", lambda: _folder(_DEBERTA, data=4))),
    Case(A, "`relative_from_deberta` on a corrupt pytorch_model.bin",
         r"^ckpt/pytorch_model.bin cannot be read as a torch state dict", _loader("relative_from_deberta", _bad_bin)),
]


def _write_config(folder: Path, text: str) -> Path:
    (folder / "config.json").write_text(text)
    return folder
