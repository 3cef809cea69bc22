"""llama.cpp's and mlx-lm's RoPE rules (posenc.engines.llamacpp / gguf_meta / mlx_lm): files and
configs the engines refuse, flags llama.cpp does not know, unreadable .gguf files."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Callable

from posenc.engines import Unsupported
from posenc.engines.gguf_meta import gguf_rope_metadata, read_gguf_metadata
from posenc.engines.llamacpp import llamacpp_rope, rope_from_gguf_metadata
from posenc.engines.mlx_lm import mlx_lm_rope

from . import Case

SMOL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "num_attention_heads": 9,
        "num_hidden_layers": 30, "head_dim": 64, "max_position_embeddings": 8192, "rope_theta": 100000}
PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 96, "num_attention_heads": 4,
        "num_hidden_layers": 2, "max_position_embeddings": 131072, "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 12, "short_factor": [1.0] * 12}}


def in_tmp(fn: Callable[[], object]) -> Callable[[], object]:
    """Run ``fn`` in a fresh folder (relative paths: the same message on every machine)."""
    def run() -> object:
        with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
            return fn()
    return run


def _read(name: str, data: bytes | None) -> object:
    if data is not None:
        Path(name).write_bytes(data)
    return read_gguf_metadata(name)


def _flags(**flags) -> object:
    return rope_from_gguf_metadata(gguf_rope_metadata(SMOL), {k.replace("_", "-"): v for k, v in flags.items()})


L, M = "engines: llama.cpp", "engines: mlx-lm"
CASES = [
    Case(L, "read_gguf_metadata on a missing file", r"^missing\.gguf: no such file$",
         run=in_tmp(lambda: _read("missing.gguf", None))),
    Case(L, "read_gguf_metadata on a JSON file", r"^config\.json is not a GGUF file \(it starts with b'\{\"a\"', not b'GGUF'\)$",
         run=in_tmp(lambda: _read("config.json", b'{"a": 1}'))),
    Case(L, "read_gguf_metadata on a truncated file",
         r"^cut\.gguf: the GGUF file is unreadable \(truncated or corrupt\): ",
         run=in_tmp(lambda: _read("cut.gguf", b"GGUF\x03\x00\x00\x00\x01"))),
    Case(L, "a config of an architecture not modelled", r"^architectures\[0\] must be one of .*got 'FalconForCausalLM'$",
         run=lambda: llamacpp_rope({**SMOL, "architectures": ["FalconForCausalLM"]})),
    Case(L, "a config that is not a dict", r"^config must be a dict \(a parsed config\.json\), got list$",
         run=lambda: llamacpp_rope([]), error=TypeError),
    Case(L, "Phi-3 without original_max_position_embeddings (the converter's KeyError)",
         r"^convert_hf_to_gguf\.py's Phi3 converter needs .*original_max_position_embeddings \(KeyError\)$",
         run=lambda: llamacpp_rope(PHI3), error=Unsupported),
    Case(L, "Phi-3 long_factor of the wrong length", r"needs long_factor and short_factor of 12 values each",
         run=lambda: llamacpp_rope({**PHI3, "original_max_position_embeddings": 4096, "rope_scaling": {
             **PHI3["rope_scaling"], "long_factor": [1.0] * 11}}), error=Unsupported),
    Case(L, "SmolLM3 with llama3 scaling (a rope_freqs tensor its loader does not load)",
         r"^llama\.cpp refuses the file: its smollm3 loader does not load rope_freqs \(wrong number of tensors\)$",
         run=lambda: llamacpp_rope({**SMOL, "architectures": ["SmolLM3ForCausalLM"], "rope_scaling": {
             "rope_type": "llama3", "factor": 8.0}}), error=Unsupported),
    Case(L, "metadata without general.architecture", r"^general\.architecture must be one of .*got None$",
         run=lambda: rope_from_gguf_metadata({})),
    Case(L, "metadata without context_length", r"^GGUF metadata lacks llama\.context_length \(llama\.cpp refuses",
         run=lambda: rope_from_gguf_metadata({"general.architecture": "llama"})),
    Case(L, "an unknown rope.scaling.type", r"^llama\.rope\.scaling\.type must be one of none, linear, yarn, longrope",
         run=lambda: rope_from_gguf_metadata({**gguf_rope_metadata(SMOL), "llama.rope.scaling.type": "ntk"})),
    Case(L, "an unknown flag", r"^unknown llama\.cpp flag '--rope-sclae'; known: --rope-scaling, ",
         run=lambda: rope_from_gguf_metadata(gguf_rope_metadata(SMOL), {"--rope-sclae": 2})),
    Case(L, "--rope-scaling longrope", r"^--rope-scaling must be none, linear or yarn .*got 'longrope'$",
         run=lambda: _flags(rope_scaling="longrope")),
    Case(L, "--rope-scale 0", r"^--rope-scale must be > 0, got 0$", run=lambda: _flags(rope_scale=0)),
    Case(L, "--ctx-size 1.5", r"^--ctx-size must be an integer >= 0 \(0: the model's\), got 1\.5$",
         run=lambda: _flags(ctx_size=1.5)),
    Case(L, "--rope-freq-base nan", r"^--rope-freq-base must be a finite number, got nan$",
         run=lambda: _flags(rope_freq_base=float("nan"))),
    Case(L, "--yarn-attn-factor with YaRN on (handled: llama_context overwrites it)",
         r"overwritten when ext_factor != 0", error=None,
         run=lambda: "; ".join(_flags(rope_scaling="yarn", rope_scale=2, yarn_attn_factor=0.5)[0].notes)),
    Case(M, "a model type not modelled", r"^model_type must be one of .*got 'falcon'$",
         run=lambda: mlx_lm_rope({**SMOL, "model_type": "falcon"})),
    Case(M, "rope type su on a llama model", r"^mlx-lm 0\.32\.2 raises ValueError: Unsupported RoPE type su ",
         run=lambda: mlx_lm_rope({**SMOL, "rope_scaling": {"type": "su", "factor": 2.0}}), error=Unsupported),
    Case(M, "linear without a factor", r"^mlx-lm 0\.32\.2 fails on rope type 'linear' without rope_scaling\['factor'\]",
         run=lambda: mlx_lm_rope({**SMOL, "rope_scaling": {"type": "linear"}}), error=Unsupported),
    Case(M, "Phi-3 rope_scaling without 'type'", r"must contain keys \{'long_factor', 'type'\}$",
         run=lambda: mlx_lm_rope({**PHI3, "rope_scaling": {"rope_type": "longrope", "long_factor": [1.0] * 12}}),
         error=Unsupported),
    Case(M, "SmolLM3 no_rope_layers of the wrong length", r"`no_rope_layers` length mismatch$",
         run=lambda: mlx_lm_rope({**SMOL, "model_type": "smollm3", "no_rope_layers": [1, 0]}), error=Unsupported),
    Case(M, "num_hidden_layers missing", r"^config num_hidden_layers must be an integer > 0, got None$",
         run=lambda: mlx_lm_rope({k: v for k, v in SMOL.items() if k != "num_hidden_layers"})),
]
