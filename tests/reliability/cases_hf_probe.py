"""``posenc probe`` and ``posenc bench --model`` on bad checkpoint folders and options (issue 13).

Each case builds its folder in a fresh temporary directory (the current directory while it
runs). No case loads weights: every refusal here comes before transformers reads a tensor,
so the folders hold a config.json and a safetensors *header* only where one is needed.
"""

from __future__ import annotations

import contextlib
import json
import struct
import tempfile
from pathlib import Path
from typing import Callable

from . import Case

A = "hf probe"

_LLAMA = dict(model_type="llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
              intermediate_size=64, vocab_size=260, max_position_embeddings=64, rope_theta=10000.0)


def _in_tmp(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
            return fn()

    return run


def _folder(config: dict | None = _LLAMA, header: dict | None = None, name: str = "ckpt") -> Path:
    """A checkpoint folder: config.json and a model.safetensors holding only ``header``."""
    p = Path(name)
    p.mkdir()
    if config is not None:
        (p / "config.json").write_text(json.dumps(config))
    if header is not None:
        raw = json.dumps(header).encode()
        (p / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return p


_SMALL = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}


def _probe(**kw) -> Callable[[], object]:
    def run() -> object:
        from posenc.hf.probe import ProbeSettings, probe

        args = dict(kw)
        folder = args.pop("folder", lambda: _folder(header=_SMALL))()  # a factory: built in the case's folder
        return probe(folder, "out", ProbeSettings(**args.pop("settings", {})), progress=False, **args)

    return _in_tmp(run)


def _too_large() -> object:
    from posenc.hf.checkpoint import check_fits, open_checkpoint
    import torch

    # 2^40 bfloat16 elements: 2 TiB
    huge = {"w": {"dtype": "BF16", "shape": [2**20, 2**20], "data_offsets": [0, 2**41]}}
    # `available` given: the message must not depend on the machine (the CLI reads /proc/meminfo)
    return check_fits(open_checkpoint(_folder(header=huge)), torch.bfloat16, available=64 * 2**30)


def _no_safetensors() -> object:
    from posenc.hf.checkpoint import open_checkpoint

    p = _folder()
    (p / "pytorch_model.bin").write_bytes(b"\0")
    return open_checkpoint(p)


def _not_safetensors() -> object:
    from posenc.hf.checkpoint import estimate_bytes, open_checkpoint
    import torch

    p = _folder()
    (p / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    return estimate_bytes(open_checkpoint(p), torch.float32)


def _bad_json() -> object:
    from posenc.hf.checkpoint import open_checkpoint

    p = _folder(config=None, header=_SMALL)
    (p / "config.json").write_text("{not json")
    return open_checkpoint(p)


def _no_length() -> object:
    from posenc.hf.checkpoint import trained_length

    return trained_length({k: v for k, v in _LLAMA.items() if k != "max_position_embeddings"})


def _small_vocab() -> object:
    from posenc.hf.checkpoint import load_tokenizer, open_checkpoint

    return load_tokenizer(open_checkpoint(_folder(config=dict(_LLAMA, vocab_size=100), header=_SMALL)))


def _empty_text_folder() -> Path:
    Path("empty.txt").write_text("")
    return _folder(header=_SMALL)


def _bench_model_settings(**kw) -> Callable[[], object]:
    def run() -> object:
        from posenc.hf.bench_settings import model_settings

        args = dict(kw)
        return model_settings(args.pop("preset", "micro"), _folder(header=_SMALL), **args)

    return _in_tmp(run)


def _dir_arg(*extra: str) -> list[str]:
    return ["probe", "/nonexistent/posenc-model", "--out", "/tmp/posenc-probe-unused", *extra]


CASES = [
    Case(A, "MODEL_DIR is not a directory", r"MODEL '/nonexistent/posenc-model' is neither a folder, a \.gguf file nor a named model",
         argv=_dir_arg()),
    Case(A, "`posenc probe --layer -1`", r"argument --layer: must be a non-negative int, got -1",
         argv=["probe", ".", "--out", "/tmp/x", "--layer", "-1"]),
    Case(A, "`posenc probe --tokens 1`", r"argument --tokens: must be an int in \[2, 1048576\], got 1",
         argv=["probe", ".", "--out", "/tmp/x", "--tokens", "1"]),
    Case(A, "`posenc probe --extend 0`", r"argument --extend: must be a positive finite float, got 0",
         argv=["probe", ".", "--out", "/tmp/x", "--extend", "0"]),
    Case(A, "`posenc probe --dtype int8`", r"argument --dtype: invalid choice: 'int8'",
         argv=["probe", ".", "--out", "/tmp/x", "--dtype", "int8"]),
    Case(A, "checkpoint folder without config.json", r"MODEL_DIR 'ckpt' has no config.json",
         _probe(folder=lambda: _folder(config=None, header=_SMALL))),
    Case(A, "config.json that is not JSON", r"ckpt/config.json is not valid JSON", _in_tmp(_bad_json)),
    Case(A, "weights only as pytorch_model.bin", r"has no \*\.safetensors weights \(found pytorch_model\.bin: convert",
         _in_tmp(_no_safetensors)),
    Case(A, "a .safetensors file that is not one", r"model\.safetensors is not a safetensors file \(header length",
         _in_tmp(_not_safetensors)),
    Case(A, "a model larger than the available memory (from its safetensors headers, before loading)",
         r"needs about 2048\.00 GiB in bfloat16 \(from its safetensors headers\).*GiB of memory is available",
         _in_tmp(_too_large)),
    Case(A, "config without a RoPE posenc reads (model_type bert)", r"model_type must be one of .*got 'bert'",
         _probe(folder=lambda: _folder(config=dict(_LLAMA, model_type="bert"), header=_SMALL))),
    Case(A, "--layer past the model's layers", r"--layer must be in \[0, 1\] \(the model has 2 layers\), got 5",
         _probe(settings=dict(layers=(0, 5)))),
    Case(A, "--heads past the model's query heads", r"--heads must be in \[0, 3\] \(the model has 4 query heads\), got 4",
         _probe(settings=dict(heads=(4,)))),
    Case(A, "probe settings: extend below 1.25", r"extend must be >= 1\.25 .*got 1\.1", _probe(settings=dict(extend=1.1))),
    Case(A, "probe settings: an unknown scaling", r"scalings must be one of .*got 'longrope'",
         _probe(settings=dict(scalings=("longrope",)))),
    Case(A, "--text file that is empty", r"--text 'empty\.txt' gives 0 tokens; the probe needs at least 2",
         _probe(folder=_empty_text_folder, text="empty.txt", settings=dict(dtype="float32"))),
    Case(A, "--text file missing", r"--text: no such file: 'missing\.txt'", _probe(text="missing.txt"), error=FileNotFoundError),
    Case(A, "config without a trained length", r"neither original_max_position_embeddings nor max_position_embeddings",
         _no_length),
    Case(A, "no tokenizer saved and vocab_size < 256 (no byte-level fallback)",
         r"byte-level fallback tokenizer needs vocab_size >= 256, got 100", _in_tmp(_small_vocab)),
    Case(A, "`posenc bench --model` with a synthetic task", r"--tasks with --model: unknown task 'copy'; valid tasks: passkey, lm",
         _bench_model_settings(tasks=["copy"])),
    Case(A, "`posenc bench --model` with --encodings (nothing is trained)",
         r"--encodings do\(es\) not apply with --model", argv=["bench", "--model", ".", "--encodings", "rope", "--out", "/tmp/x"]),
    Case(A, "`posenc bench --model` with a model-size flag (--d-model)",
         r"--d-model do\(es\) not apply with --model .*evaluation settings that do: --passkey-eval-factors",
         argv=["bench", "--model", ".", "--d-model", "8", "--out", "/tmp/x"]),
    Case(A, "`posenc bench --model` settings: a passkey depth outside [0, 1]", r"passkey_depths must be .*1\.5",
         _bench_model_settings(overrides={"passkey_depths": (0.0, 1.5)})),
    Case(A, "`posenc bench --model` settings: an override that is not an evaluation setting",
         r"overrides: lr not an evaluation setting; valid: passkey_eval_factors",
         _bench_model_settings(overrides={"lr": 1e-3})),
    Case(A, "`posenc bench --model` with an unknown preset", r"unknown preset 'huge'; valid presets",
         _bench_model_settings(preset="huge")),
    Case(A, "`posenc probe --layer` naming a NoPE layer of a hybrid (SmolLM3's no_rope_layers)",
         r"--layer 1 of model_type 'smollm3' does not rotate \(NoPE: no_rope_layers\[1\] is 0\); the probe measures "
         r"RoPE's score against distance: probe one of its RoPE layers 0",
         _probe(folder=lambda: _folder(config=dict(_LLAMA, model_type="smollm3", no_rope_layers=[1, 0]), header=_SMALL),
                settings=dict(layers=(1,)))),
]
