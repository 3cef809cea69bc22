"""llama.cpp's runtime reading of a .gguf's RoPE metadata (:func:`rope_from_gguf_metadata`), and
the registered rule ``"llama.cpp"`` = the converter (:mod:`.gguf_meta`) then the runtime.

Re-derived from llama.cpp commit 0c1e570 as vendored by llama-cpp-python 0.3.36:

* ``src/llama-model.cpp`` ``llama_model_base::load_hparams``: ``n_ctx_orig_yarn`` =
  ``rope.scaling.original_context_length`` else ``context_length``; ``rope.freq_base`` else
  10000; ``rope.scaling.type`` else "linear"; ``freq_scale = 1 / rope.scaling.factor`` (1 when
  absent); ``rope.scaling.attn_factor`` (Phi-3's); ``n_rot = rope.dimension_count`` else the
  head size. The per-arch loaders (``src/models/*.cpp``): deepseek2 reads
  ``yarn_log_multiplier / 0.1`` (= ``mscale_all_dim``); gemma3 and gpt-oss read the sliding
  layers' base (gemma3: scale 1, pattern 6; gpt-oss: the full layers' scale, pattern 2);
  smollm3 skips RoPE on every 4th layer. None of these arches reads the ``yarn_*`` keys the
  converter writes (only grok and mistral3 do): beta_fast 32, beta_slow 1, ext 1, attn 1.
* ``src/llama-context.cpp`` ``llama_context::llama_context``: the user's overrides (the CLI
  flags of ``common/arg.cpp``); scaling type none -> freq_scale 1; ext_factor 1 for YaRN else
  0; when ext_factor != 0 the YaRN attention factor is *recomputed* (a user's
  ``--yarn-attn-factor`` is lost) as ``mscale(s, 1)`` (deepseek2 with ``mscale_all_dim``:
  ``mscale(s, m) / mscale(s, m_all)`` with ``m = 1``, or ``m_all`` when it is not 1) and
  divided by ``1 + 0.1 ln s``, which ggml multiplies back; then times ``rope.scaling.attn_factor``.
* ``ggml/src/ggml-cpu/ops.cpp`` ``rope_yarn``: theta = theta_extrap / ff_i * (s_inv (1 - r_i) +
  r_i), r_i = ext * ramp_i, ramp_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1); cos and
  sin times ``attn_factor * (1 + 0.1 ln(1/freq_scale))`` when ext != 0; ``ggml/src/ggml.c``
  ``ggml_rope_yarn_corr_dims``: lo = max(0, floor(d ln(L/(2 pi beta_fast)) / (2 ln base))),
  hi = min(d - 1, ceil(... beta_slow ...)), always rounded (no ``truncate``).
* ``src/models/deepseek2.cpp``: kq_scale = mscale^2 / sqrt(d_k) with
  mscale = attn_factor (1 + 0.1 ln s) (1 + 0.1 m_all ln s): the softmax scale here.
* ``llama_model::get_rope_factors``: ``rope_freqs`` if present, else ``rope_factors_long`` when
  the per-sequence context (``-c``, padded to 256) exceeds ``n_ctx_orig_yarn``, else short.

Layout: llama.cpp's rope type NORM rotates consecutive pairs, NEOX pairs half a head apart.
llama/smollm3 are NORM on q/k weights the converter permuted (``LlamaModel.permute``), which
is HF's rotate_half on HF's weights: recorded as ``"half"``, the HF-equivalent layout.
deepseek2 is NORM on unpermuted weights (interleaved, as HF's DeepSeek); the others are NEOX.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from .base import EngineRope, Unsupported, register_engine
from .gguf_meta import NOTES, gguf_rope_metadata

__all__ = ["FLAGS", "llamacpp_rope", "rope_from_gguf_metadata"]

VERSION = "llama-cpp-python 0.3.36 (llama.cpp 0c1e570)"
SOURCE = ("llama.cpp 0c1e570 (llama-cpp-python 0.3.36): src/llama-model.cpp load_hparams, "
          "src/llama-context.cpp, ggml-cpu/ops.cpp rope_yarn, ggml.c ggml_rope_yarn_corr_dims")

# arch -> (layout in HF terms, why)
_LAYOUT = {"llama": "half", "smollm3": "half", "qwen2": "half", "phi3": "half", "gemma3": "half",
           "gpt-oss": "half", "deepseek2": "interleaved"}
_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
#: the runtime flags understood (common/arg.cpp), and their kinds
FLAGS = {"rope-scaling": str, "rope-scale": float, "rope-freq-scale": float, "rope-freq-base": float,
         "yarn-orig-ctx": int, "yarn-ext-factor": float, "yarn-attn-factor": float, "yarn-beta-fast": float,
         "yarn-beta-slow": float, "ctx-size": int}


def _mscale(scale: float, m: float) -> float:
    """llama-context.cpp's ``get_mscale``: 1 for scale <= 1, else 1 + 0.1 m ln(scale)."""
    return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0


def _flags(flags: Mapping[str, Any] | None) -> dict[str, Any]:
    """The flags by their CLI name (``--rope-scale``, ``rope_scale`` and ``rope-scale`` alike), checked."""
    out: dict[str, Any] = {}
    for raw, value in (flags or {}).items():
        name = str(raw).lstrip("-").replace("_", "-")
        if name not in FLAGS:
            raise ValueError(f"unknown llama.cpp flag {raw!r}; known: {', '.join('--' + f for f in FLAGS)}")
        kind = FLAGS[name]
        if kind is str:
            if value not in ("none", "linear", "yarn"):
                raise ValueError(f"--rope-scaling must be none, linear or yarn (llama.cpp's choices), got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"--{name} must be a finite number, got {value!r}")
        elif kind is int and (value != int(value) or value < 0):
            raise ValueError(f"--{name} must be an integer >= 0 (0: the model's), got {value!r}")
        elif name in ("rope-scale", "rope-freq-scale") and value <= 0:
            raise ValueError(f"--{name} must be > 0, got {value!r}")
        elif name == "rope-freq-base" and value < 0:
            raise ValueError(f"--rope-freq-base must be >= 0 (0: the model's), got {value!r}")
        out[name] = kind(value)
    return out


def _swa_layers(n_layer: int, pattern: Any) -> list[bool]:
    """``llama_hparams::set_swa_pattern`` (dense last in each period) or an explicit per-layer array."""
    if isinstance(pattern, (list, tuple)):
        return [bool(v) for v in pattern[:n_layer]]
    n = int(pattern)
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]


def _inv_freq(n_rot: int, base: float, freq_scale: float, ext: float, n_ctx_orig: int,
              beta_fast: float, beta_slow: float, factors: list[float] | None) -> torch.Tensor:
    """Per pair i, the angle per position ggml's rope_yarn computes, in float64."""
    def corr(beta: float) -> float:
        return n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = max(0.0, math.floor(corr(beta_fast))), min(n_rot - 1.0, math.ceil(corr(beta_slow)))
    i = torch.arange(n_rot // 2, dtype=torch.float64)
    extrap = base ** (-2 * i / n_rot)
    if factors is not None:
        extrap = extrap / torch.tensor(factors, dtype=torch.float64)
    if ext == 0:
        return extrap * freq_scale
    mix = (1 - ((i - lo) / max(0.001, hi - lo)).clamp(0, 1)) * ext
    return extrap * (freq_scale * (1 - mix) + mix)


def rope_from_gguf_metadata(metadata: Mapping[str, Any], flags: Mapping[str, Any] | None = None) -> list[EngineRope]:
    """What llama.cpp's runtime computes as RoPE from a .gguf's ``metadata`` (the dict of
    :func:`~posenc.engines.gguf_meta.read_gguf_metadata` or :func:`gguf_rope_metadata`), one
    :class:`EngineRope` per distinct rotating layer group, with ``flags`` (``--rope-scale``,
    ``--yarn-orig-ctx``, ``--ctx-size``... see :data:`FLAGS`) overriding the file as llama.cpp does."""
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict of GGUF keys, got {type(metadata).__name__}")
    arch = metadata.get("general.architecture")
    if arch not in _LAYOUT:
        raise ValueError(f"general.architecture must be one of {', '.join(_LAYOUT)} (the arches modelled here), got {arch!r}")
    fl = _flags(flags)
    notes = list(metadata.get(NOTES, ()))

    def get(key: str, default: Any = None, required: bool = False) -> Any:
        if required and f"{arch}.{key}" not in metadata:
            raise ValueError(f"GGUF metadata lacks {arch}.{key} (llama.cpp refuses the file: key not found)")
        return metadata.get(f"{arch}.{key}", default)

    n_ctx_train, n_layer = int(get("context_length", required=True)), int(get("block_count", required=True))
    n_ctx_orig_yarn = int(get("rope.scaling.original_context_length", n_ctx_train))
    base_train = float(get("rope.freq_base", 10000.0))
    scaling_train = get("rope.scaling.type", "linear")
    if scaling_train not in _SCALING_TYPES:
        raise ValueError(f"{arch}.rope.scaling.type must be one of {', '.join(_SCALING_TYPES)}, got {scaling_train!r} "
                         "(llama.cpp aborts: GGML_ASSERT)")
    ropescale = float(get("rope.scaling.factor", metadata.get(f"{arch}.rope.scale_linear", 0.0)))
    scale_train = 1.0 if ropescale == 0 else 1.0 / ropescale
    rope_attn_factor = float(get("rope.scaling.attn_factor", 1.0))
    n_head, n_embd = get("attention.head_count"), get("embedding_length")
    head_k = get("attention.key_length", n_embd // n_head if n_head and n_embd else None)
    n_rot = int(get("rope.dimension_count", head_k or 0))
    if not n_rot:
        raise ValueError(f"GGUF metadata needs {arch}.rope.dimension_count or the head size "
                         "(attention.key_length, or embedding_length and attention.head_count)")
    if arch == "llama" and head_k and n_rot != head_k:
        raise Unsupported(f"llama.cpp refuses the file: invalid n_rot {n_rot}, expected {head_k}")
    for key in ("yarn_attn_factor", "yarn_ext_factor", "yarn_beta_fast", "yarn_beta_slow"):
        if f"{arch}.rope.scaling.{key}" in metadata:
            notes.append(f"rope.scaling.{key} is in the file but llama.cpp's {arch} loader does not read it")
    log_mul = float(get("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1 if arch == "deepseek2" else 0.0
    factor_tensors = [t for t in ("rope_freqs", "rope_factors_long", "rope_factors_short") if t in metadata]
    if factor_tensors and arch not in ("llama", "phi3"):
        raise Unsupported(f"llama.cpp refuses the file: its {arch} loader does not load {factor_tensors[0]} "
                          "(wrong number of tensors)")

    # llama_context: cparams from the flags, else the file
    scaling = fl.get("rope-scaling", scaling_train)
    base = fl.get("rope-freq-base") or base_train
    freq_scale = 1.0 / fl["rope-scale"] if "rope-scale" in fl else fl.get("rope-freq-scale") or scale_train
    if scaling == "none":
        freq_scale = 1.0
    n_ctx_orig = fl.get("yarn-orig-ctx") or n_ctx_orig_yarn or n_ctx_train
    ext = fl["yarn-ext-factor"] if fl.get("yarn-ext-factor", -1.0) >= 0 else (1.0 if scaling == "yarn" else 0.0)
    attn = fl["yarn-attn-factor"] if fl.get("yarn-attn-factor", -1.0) >= 0 else 1.0
    beta_fast = fl["yarn-beta-fast"] if fl.get("yarn-beta-fast", -1.0) >= 0 else 32.0
    beta_slow = fl["yarn-beta-slow"] if fl.get("yarn-beta-slow", -1.0) >= 0 else 1.0
    if ext != 0:
        s = 1.0 / freq_scale
        if "yarn-attn-factor" in fl:
            notes.append("--yarn-attn-factor is overwritten when ext_factor != 0 (llama_context recomputes it)")
        if log_mul != 0:
            m = log_mul if arch == "deepseek2" and log_mul != 1.0 else 1.0
            attn = _mscale(s, m) / _mscale(s, log_mul)
        else:
            attn = _mscale(s, 1.0)
        attn /= 1.0 + 0.1 * math.log(s)
    attn *= rope_attn_factor
    n_ctx = fl.get("ctx-size") or n_ctx_train
    n_ctx_seq = -(-n_ctx // 256) * 256  # GGML_PAD(n_ctx, 256), one sequence

    # per layer: (rotates, base, freq_scale)
    swa = [False] * n_layer
    base_swa, scale_swa = 10000.0, 1.0
    if arch == "gemma3" and get("attention.sliding_window", 0):
        swa = _swa_layers(n_layer, get("attention.sliding_window_pattern", 6))
        base_swa = float(get("rope.freq_base_swa", 10000.0))
    elif arch == "gpt-oss":
        swa = _swa_layers(n_layer, get("attention.sliding_window_pattern", 2))
        base_swa, scale_swa = float(get("rope.freq_base_swa", base_train)), scale_train
        if {"rope-freq-base", "rope-scale", "rope-freq-scale"} & set(fl):
            notes.append("gpt-oss's sliding layers keep the file's base and scale: the flags reach the full layers only")
    rotates = [arch != "smollm3" or (il + 1) % 4 != 0 for il in range(n_layer)]
    groups: dict[tuple[float, float], list[int]] = {}
    for il in range(n_layer):
        if rotates[il]:
            groups.setdefault((base_swa, scale_swa) if swa[il] else (base, freq_scale), []).append(il)

    softmax_scale = 1.0
    if arch == "deepseek2":
        s = 1.0 / freq_scale
        org = attn * (1.0 + 0.1 * math.log(s))
        softmax_scale = (org * (1.0 + 0.1 * log_mul * math.log(s))) ** 2
        if log_mul == 0 and ext != 0:
            notes.append("no mscale_all_dim: deepseek2's kq_scale repeats the rope's mscale (logits carry mscale^4)")
    if arch in ("llama", "smollm3"):
        notes.append("rope type NORM on q/k weights the converter permuted: HF's rotate_half on HF's weights")
    if arch == "smollm3":
        notes.append("NoPE on layers 3, 7, 11, ... (every 4th): hard-coded, the file says nothing")
    long, short = metadata.get("rope_factors_long"), metadata.get("rope_factors_short")

    def rope_of(key: tuple[float, float], layers: list[int], factors: list[float] | None, **kw: Any) -> EngineRope:
        b, fs = key
        a = attn * (1.0 + 0.1 * math.log(1.0 / fs)) if ext != 0 else attn
        inv = _inv_freq(n_rot, b, fs, ext, n_ctx_orig, beta_fast, beta_slow, factors)
        layer_type = ("sliding_attention" if swa[layers[0]] else "full_attention") if len(groups) > 1 else None
        return EngineRope(engine="llama.cpp", inv_freq=inv, attention_factor=a, softmax_scale=softmax_scale,
                          rotary_dim=n_rot, layout=_LAYOUT[arch], layer_type=layer_type,
                          layers=None if len(layers) == n_layer else tuple(layers), notes=tuple(notes),
                          source=SOURCE, **kw)

    out = []
    for key, layers in groups.items():
        if "rope_freqs" in metadata:
            out.append(rope_of(key, layers, list(metadata["rope_freqs"])))
        elif arch == "phi3" and long is not None and short is not None:
            if "ctx-size" in fl:
                out.append(rope_of(key, layers, list(long if n_ctx_seq > n_ctx_orig_yarn else short)))
            else:
                notes.append(f"long factors when the context (-c, padded to 256) exceeds {n_ctx_orig_yarn}, "
                             "for every token: chosen once per context, not by the tokens so far")

                def at(n: int, key: tuple[float, float] = key) -> tuple[torch.Tensor, float]:
                    pad = -(-n // 256) * 256
                    picked = long if pad > n_ctx_orig_yarn else short
                    return _inv_freq(n_rot, key[0], key[1], ext, n_ctx_orig, beta_fast, beta_slow, picked), attn

                out.append(rope_of(key, layers, list(short), beyond="switch", switch_at=n_ctx_orig_yarn, at_length=at))
        else:
            out.append(rope_of(key, layers, None))
    return out


@register_engine("llama.cpp", version=VERSION,
                 summary="convert_hf_to_gguf.py then the runtime: YaRN mscale via ggml, longrope by context size")
def llamacpp_rope(config: Mapping[str, Any]) -> list[EngineRope]:
    """llama.cpp's RoPE for ``config`` (a parsed config.json): the metadata the converter writes,
    read as the runtime reads it (no flags; ``-c`` the model's own length when it matters)."""
    return rope_from_gguf_metadata(gguf_rope_metadata(config))
