"""llama.cpp's converter: the RoPE metadata ``convert_hf_to_gguf.py`` writes into a .gguf for a
config.json (:func:`gguf_rope_metadata`), and the same metadata read back from a file
(:func:`read_gguf_metadata`).

Re-derived from llama.cpp commit 0c1e570 as vendored by llama-cpp-python 0.3.36:
``conversion/base.py`` (``TextModel.__init__``: the rope dict is ``rope_parameters`` or
``rope_scaling``, a legacy ``type`` is mirrored to ``rope_type``, top-level thetas and
``original_max_position_embeddings`` are mirrored into it; ``TextModel.set_gguf_parameters``:
linear -> type + factor, yarn -> type + factor + original length (+ the yarn keys it finds),
longrope -> type only, dynamic and llama3 -> nothing here, anything else -> a warning and
nothing), ``conversion/llama.py`` (``LlamaModel.generate_extra_tensors``: llama3 scaling becomes
a ``rope_freqs`` tensor of per-pair divisors of theta, computed from float32 frequencies),
``conversion/deepseek.py`` (``DeepseekV2Model``: ``rope.dimension_count = qk_rope_head_dim``,
``yarn_log_multiplier = 0.1 * mscale_all_dim``), ``conversion/phi.py`` (``Phi3MiniModel``: does
not call the base class, so no ``rope.scaling.type``; long/short factors become the
``rope_factors_long``/``rope_factors_short`` tensors and the attention factor
``rope.scaling.attn_factor``), ``conversion/gemma.py`` (``Gemma3Model``) and
``conversion/gpt_oss.py``.

The result maps GGUF keys (``"{arch}.rope.freq_base"``...) to values, floats rounded to
float32 as the file stores them, plus the factor tensors as lists under ``"rope_freqs"``,
``"rope_factors_long"``, ``"rope_factors_short"`` and the converter's surprises under
``"posenc.notes"`` (not a GGUF key: never written to a file).
"""

from __future__ import annotations

import copy
import math
import struct
from pathlib import Path
from typing import Any, Mapping

from .base import Unsupported

__all__ = ["ARCHITECTURES", "FACTOR_TENSORS", "NOTES", "f32", "gguf_rope_metadata", "open_gguf", "read_gguf_metadata"]

#: HF ``architectures[0]`` -> the GGUF arch its converter class writes (the families modelled here)
ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "LLaMAForCausalLM": "llama", "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "DeepseekV2ForCausalLM": "deepseek2",
    "DeepseekV3ForCausalLM": "deepseek2", "Phi3ForCausalLM": "phi3", "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3", "GptOssForCausalLM": "gpt-oss", "SmolLM3ForCausalLM": "smollm3",
}
# a config without ``architectures`` (the converter needs it): its model_type's usual class
_BY_MODEL_TYPE = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2",
                  "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2", "phi3": "phi3", "gemma3": "gemma3",
                  "gemma3_text": "gemma3", "gpt_oss": "gpt-oss", "smollm3": "smollm3"}
_LLAMA_CLASSES = ("llama", "smollm3")  # LlamaModel and its subclasses: rope.dimension_count, rope_freqs
FACTOR_TENSORS = ("rope_freqs", "rope_factors_long", "rope_factors_short")
NOTES = "posenc.notes"


def f32(x: float) -> float:
    """``x`` rounded to float32, as a GGUF float32 field stores it."""
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def _find(h: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """``ModelBase.find_hparam(keys, optional=True)``: the first key present, else None."""
    return next((h[k] for k in keys if k in h), None)


def _arch(config: Mapping[str, Any], notes: list[str]) -> str:
    archs = config.get("architectures")
    if isinstance(archs, (list, tuple)) and archs:
        if archs[0] not in ARCHITECTURES:
            raise ValueError(f"architectures[0] must be one of {', '.join(sorted(ARCHITECTURES))} "
                             f"(the converters modelled here), got {archs[0]!r}")
        return ARCHITECTURES[archs[0]]
    model_type = config.get("model_type")
    if model_type not in _BY_MODEL_TYPE:
        raise ValueError("config needs 'architectures' (convert_hf_to_gguf.py picks its converter by "
                         f"architectures[0]) or a model_type in {', '.join(sorted(_BY_MODEL_TYPE))}; got {model_type!r}")
    notes.append(f"no 'architectures' in the config: read as model_type {model_type!r}'s converter")
    return _BY_MODEL_TYPE[model_type]


def _rope_parameters(h: dict[str, Any]) -> dict[str, Any]:
    """``TextModel.__init__``'s ``self.rope_parameters``, mirrored keys included."""
    rp = h.get("rope_parameters", h.get("rope_scaling")) or {}
    if not isinstance(rp, dict):
        raise TypeError(f"rope_parameters / rope_scaling must be a dict, got {type(rp).__name__}")
    rp = copy.deepcopy(rp)
    if "full_attention" not in rp and "sliding_attention" not in rp:
        theta = _find(h, ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"))
        local = _find(h, ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq"))
        partial = _find(h, ("partial_rotary_factor", "rope_pct", "rope_percent"))
        original = h.get("original_max_position_embeddings")
        if local is not None:
            rp["sliding_attention"] = {"rope_theta": local}
        if "rope_theta" not in rp and theta is not None:
            rp["rope_theta"] = theta
        if "rope_type" not in rp and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
        if "partial_rotary_factor" not in rp and partial is not None:
            rp["partial_rotary_factor"] = partial
        if "original_max_position_embeddings" not in rp and original is not None:
            rp["original_max_position_embeddings"] = original
    return rp


def _base_rope(meta: dict, k: str, rp: dict, notes: list[str]) -> None:
    """``TextModel.set_gguf_parameters``' rope block (the full-attention dict)."""
    p = rp.get("full_attention", rp)
    kind = p.get("rope_type")
    if kind is not None:
        factor = p.get("factor")
        if kind == "linear" and factor is not None:
            meta[k + "rope.scaling.type"], meta[k + "rope.scaling.factor"] = "linear", f32(factor)
        elif kind == "yarn" and factor is not None:
            if "original_max_position_embeddings" not in p:
                raise Unsupported("convert_hf_to_gguf.py fails on yarn without original_max_position_embeddings (KeyError)")
            meta[k + "rope.scaling.type"], meta[k + "rope.scaling.factor"] = "yarn", f32(factor)
            meta[k + "rope.scaling.original_context_length"] = int(p["original_max_position_embeddings"])
            for src, dst in (("extrapolation_factor", "yarn_ext_factor"), ("beta_fast", "yarn_beta_fast"),
                             ("beta_slow", "yarn_beta_slow")):
                if p.get(src) is not None:
                    meta[k + "rope.scaling." + dst] = f32(p[src])
            attn = p.get("attention_factor", p.get("attn_factor"))
            if attn is not None:
                meta[k + "rope.scaling.yarn_attn_factor"] = f32(attn)
            if p.get("truncate") is False:
                notes.append("truncate=false is not written: llama.cpp always rounds YaRN's ramp ends (floor/ceil)")
        elif kind in ("su", "longrope"):
            meta[k + "rope.scaling.type"] = "longrope"
        elif kind == "dynamic":
            notes.append("rope_type 'dynamic' is not written (the converter leaves it to HunYuan): plain RoPE")
        elif str(kind).lower() == "llama3":
            pass  # LlamaModel writes it as the rope_freqs tensor
        elif kind != "default":
            notes.append(f"rope_type {kind!r} is unknown to the converter (a warning): plain RoPE")
        if kind in ("linear", "yarn") and factor is None:
            notes.append(f"rope_type {kind!r} without a factor is not written: plain RoPE")
    if p.get("rope_theta") is not None:
        meta[k + "rope.freq_base"] = f32(p["rope_theta"])
    local = rp.get("sliding_attention", {}).get("rope_theta")
    if local is not None:
        meta[k + "rope.freq_base_swa"] = f32(local)


def _llama3_factors(h: Mapping[str, Any], p: Mapping[str, Any]) -> list[float]:
    """``LlamaModel.generate_extra_tensors``: per pair, 1 (short wavelengths), ``factor`` (long
    ones) or the smooth blend between; wavelengths from float32 frequencies, as the converter."""
    import torch

    base = p.get("rope_theta", 10000.0)
    dim = h.get("head_dim") or h["hidden_size"] // h["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = p.get("factor", 8.0), p.get("low_freq_factor", 1.0), p.get("high_freq_factor", 4.0)
    old = p.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / f32(freq)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(f32(factor))
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(f32(1 / ((1 - smooth) / factor + smooth)))
    return out


def _phi3(meta: dict, k: str, h: dict, rp: dict) -> None:
    """``Phi3MiniModel.set_gguf_parameters`` / ``generate_extra_tensors`` (no base-class call)."""
    n_embd, n_head = _find(h, ("hidden_size", "n_embd")), _find(h, ("num_attention_heads", "n_head"))
    max_pos = _find(h, ("n_positions", "max_position_embeddings"))
    if None in (n_embd, n_head, max_pos) or "original_max_position_embeddings" not in rp:
        raise Unsupported("convert_hf_to_gguf.py's Phi3 converter needs hidden_size, num_attention_heads, "
                          "max_position_embeddings and original_max_position_embeddings (KeyError)")
    orig = int(rp["original_max_position_embeddings"])
    rope_dims = int(rp.get("partial_rotary_factor", 1.0) * n_embd) // n_head
    meta[k + "context_length"], meta[k + "rope.scaling.original_context_length"] = int(max_pos), orig
    meta[k + "embedding_length"], meta[k + "attention.head_count"] = int(n_embd), int(n_head)
    meta[k + "rope.dimension_count"] = rope_dims
    meta[k + "rope.freq_base"] = f32(rp.get("full_attention", rp)["rope_theta"])
    meta[k + "attention.sliding_window"] = int(h.get("sliding_window") or 0)
    long, short = rp.get("long_factor"), rp.get("short_factor")
    if not long:
        return
    scale = max_pos / orig
    kind = str(rp.get("rope_type", "")).lower()
    if kind in ("su", "longrope"):
        attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
    elif kind == "yarn":
        attn = 0.1 * math.log(scale) + 1.0 if scale > 1.0 else 1.0
    else:
        raise Unsupported(f"convert_hf_to_gguf.py's Phi3 converter refuses rope type {kind or None!r} with "
                          "long_factor (NotImplementedError/KeyError): only su, longrope and yarn")
    if short is None or len(long) != len(short) or len(long) != rope_dims / 2:
        raise Unsupported(f"convert_hf_to_gguf.py's Phi3 converter needs long_factor and short_factor of "
                          f"{rope_dims // 2} values each (ValueError)")
    meta[k + "rope.scaling.attn_factor"] = f32(attn)
    meta["rope_factors_long"] = [f32(v) for v in long]
    meta["rope_factors_short"] = [f32(v) for v in short]


def gguf_rope_metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The RoPE-related GGUF metadata (and factor tensors) convert_hf_to_gguf.py writes for
    ``config`` (a parsed config.json); raises :class:`Unsupported` where the converter fails."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict (a parsed config.json), got {type(config).__name__}")
    notes: list[str] = []
    arch = _arch(config, notes)
    h = dict(config)
    if isinstance(h.get("text_config"), Mapping):
        h = {**h, **h["text_config"]}
    rp = _rope_parameters(h)
    k = arch + "."
    meta: dict[str, Any] = {"general.architecture": arch}
    layers = _find(h, ("n_layers", "num_hidden_layers", "n_layer", "num_layers"))
    if layers is None:
        raise ValueError("config needs num_hidden_layers (the converter's block_count)")
    meta[k + "block_count"] = int(layers)
    if arch == "phi3":
        _phi3(meta, k, h, rp)
    else:
        n_ctx = _find(h, ("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
                          "model_max_length"))
        if arch == "gemma3":
            n_ctx = h.get("max_position_embeddings", 131072)
        if n_ctx is not None:
            meta[k + "context_length"] = int(n_ctx)
        for key, names in (("embedding_length", ("hidden_size", "n_embd", "dim")),
                           ("attention.head_count", ("num_attention_heads", "n_head", "n_heads"))):
            if (v := _find(h, names)) is not None:
                meta[k + key] = int(v)
        _base_rope(meta, k, rp, notes)
        if h.get("head_dim") is not None:
            meta[k + "attention.key_length"] = int(h["head_dim"])
    p = rp.get("full_attention", rp)
    if arch in _LLAMA_CLASSES:
        meta[k + "rope.dimension_count"] = int(h.get("head_dim") or h["hidden_size"] // h["num_attention_heads"])
        if str(p.get("rope_type", "")).lower() == "llama3":
            meta["rope_freqs"] = _llama3_factors(h, p)
        if arch == "smollm3" and "no_rope_layers" in h:
            notes.append("no_rope_layers is not written: llama.cpp's smollm3 skips RoPE on every 4th layer")
    elif str(p.get("rope_type", "")).lower() == "llama3":
        notes.append(f"llama3 scaling is dropped: only LlamaModel writes rope_freqs, {arch}'s converter does not")
    if arch == "deepseek2":
        for key in ("qk_rope_head_dim", "qk_nope_head_dim", "kv_lora_rank"):
            if key not in h:
                raise Unsupported(f"convert_hf_to_gguf.py's DeepseekV2 converter needs {key} (KeyError)")
        meta[k + "rope.dimension_count"] = int(h["qk_rope_head_dim"])
        meta[k + "attention.key_length"] = int(h["kv_lora_rank"]) + int(h["qk_rope_head_dim"])
        meta[k + "attention.key_length_mla"] = int(h["qk_nope_head_dim"]) + int(h["qk_rope_head_dim"])
        if rp.get("mscale_all_dim") is not None:
            meta[k + "rope.scaling.yarn_log_multiplier"] = f32(0.1 * rp["mscale_all_dim"])
        if p.get("mscale") is not None and p.get("mscale") != p.get("mscale_all_dim"):
            notes.append("rope mscale is not written (only mscale_all_dim): llama.cpp takes mscale = mscale_all_dim")
    elif arch == "gemma3":
        meta[k + "attention.key_length"] = int(h.get("head_dim", 256))
        meta[k + "rope.freq_base"] = f32(p.get("rope_theta", 1_000_000.0))
        if h.get("sliding_window_pattern") != 1 and h.get("sliding_window"):
            meta[k + "attention.sliding_window"] = int(h["sliding_window"])
    elif arch == "gpt-oss":
        if "sliding_window" not in h:
            raise Unsupported("convert_hf_to_gguf.py's GptOss converter needs sliding_window (KeyError)")
        meta[k + "attention.sliding_window"] = int(h["sliding_window"])
    if notes:
        meta[NOTES] = notes
    return meta


def open_gguf(path: str | Path, label: str | None = None) -> Any:
    """A ``gguf.GGUFReader`` of ``path``, or one ValueError naming it (``label``: how messages
    name the file, default its path): missing, not a GGUF (its first four bytes), truncated or
    corrupt. The ``gguf`` package missing is :class:`posenc._optional.MissingExtra`. Every
    reader of a .gguf in posenc opens it here."""
    from .._optional import require

    path = Path(path)
    label = str(path) if label is None else label
    if not path.is_file():
        raise ValueError(f"{label}: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{label} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    gguf = require("gguf", extra="hf")
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, KeyError, IndexError, OSError, UnicodeDecodeError, struct.error) as e:
        raise ValueError(f"{label}: the GGUF file is unreadable (truncated or corrupt): {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The key/values of the .gguf file at ``path`` (:func:`open_gguf`), plus the values of its
    ``rope_freqs`` / ``rope_factors_long`` / ``rope_factors_short`` tensors when present."""
    reader = open_gguf(path)
    try:
        meta = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
        for t in reader.tensors:
            stem = t.name.removesuffix(".weight")
            if stem in FACTOR_TENSORS:
                meta[stem] = [float(v) for v in t.data.reshape(-1).tolist()]
    except (ValueError, KeyError, IndexError, OSError, UnicodeDecodeError, struct.error) as e:
        raise ValueError(f"{path}: the GGUF file is unreadable (truncated or corrupt): {_first_line(e)}") from None
    return meta
