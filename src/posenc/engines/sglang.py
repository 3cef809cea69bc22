"""SGLang 0.5.23's reading of a config.json as RoPE, re-derived from its source.

The path (SGLang 0.5.23, files under ``sglang/srt/``): transformers loads the config (the same
normalisation as vLLM's, :mod:`._vllm_family`, without vLLM's refusal of a ``type`` that
contradicts ``rope_type``: transformers keeps ``rope_type``); each model file passes
``rope_theta`` and the rope dict to ``layers/rotary_embedding/factory.py`` ``get_rope``
(l. 140-410), which picks one class per ``rope_type``. The classes are vLLM's in their formulas
(plain, linear, llama3 equal vLLM's and are computed by the same functions here), except:

* YaRN (``yarn.py``): attention factor m(f, mscale) / m(f, mscale_all_dim) when both keys are
  present (not None, where vLLM asks for non-zero), else m(f); times ``attn_factor`` (default 1).
  transformers' ``attention_factor`` key is not read. ``extrapolation_factor`` scales the ramp.
* "dynamic" (``rope_variant.py`` ``DynamicNTKScalingRotaryEmbedding``): one table of
  max_position * f rows at base * (f^2 - f + 1)^(d/(d-2)) (transformers' stretch at n = f * L):
  static; vLLM's is the plain frequencies.
* LongRoPE (``rope_variant.py`` ``Phi3LongRoPEScaledRotaryEmbedding.forward``): the long
  factors for a whole forward batch as soon as any of its positions exceeds
  ``original_max_position_embeddings`` (vLLM: once per server).
* DeepSeek (``models/deepseek_v2.py`` l. 2060-2180): any non-default type becomes
  "deepseek_yarn"; the softmax-scale correction applies unless ``apply_yarn_scaling`` is false;
  ``attn_factor`` multiplies the cos/sin scale.
* Gemma 3 (``models/gemma3_causal.py`` l. 186-224): every layer gets ``{"rope_type":
  "default"}``: the global layers' linear factor is not applied.
* Llama 4 (``models/llama4.py`` l. 218): NoPE on every 4th layer, whatever ``no_rope_layers``
  says.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from . import _vllm_family as fam
from .base import EngineRope, Unsupported, register_engine

__all__ = ["sglang_rope"]

VERSION = "0.5.23"
ROPE = "sglang/srt/layers/rotary_embedding"
SOURCE = f"SGLang {VERSION}: {ROPE}/factory.py get_rope"
_NOT_MODELLED = {"proportional"}


def _rope(g: fam.Group, inv, source: str, notes: list[str], **kw: Any) -> EngineRope:
    return EngineRope(engine="sglang", inv_freq=inv, rotary_dim=g.rotary_dim, layout=g.layout,
                      layer_type=g.layer_type, layers=g.layers, notes=tuple(notes), source=f"{SOURCE}; {source}", **kw)


def _yarn(p: Mapping[str, Any], g: fam.Group, where: str, deepseek: bool) -> tuple[torch.Tensor, float]:
    """(inv_freq, cos/sin scale) of ``YaRNScalingRotaryEmbedding`` (yarn.py) or, for
    ``deepseek``, ``DeepseekScalingRotaryEmbedding`` (rope_variant.py: truncation always on,
    mscale = m(f, mscale=1) / m(f, mscale_all_dim=0) * attn_factor)."""
    base, d = float(p["rope_theta"]), g.rotary_dim
    f = fam.number(p, "factor", where, 1.0)
    original = int(p.get(fam.ORIGINAL) or g.max_position)
    truncate = True if deepseek else p.get("truncate", True)
    if not isinstance(truncate, bool):
        raise TypeError(f"{where}['truncate'] must be a bool, got {truncate!r}")
    inv = fam.yarn(base, d, f, original, fam.number(p, "beta_fast", where, 32), fam.number(p, "beta_slow", where, 1),
                   truncate=truncate, extrapolation=fam.number(p, "extrapolation_factor", where, 1))
    attn = fam.number(p, "attn_factor", where, 1)
    mscale, mad = fam.number(p, "mscale", where), fam.number(p, "mscale_all_dim", where)
    if deepseek:
        scale = fam.yarn_mscale(f, 1 if mscale is None else mscale) / fam.yarn_mscale(f, mad or 0)
    elif mscale is not None and mad is not None:
        scale = fam.yarn_mscale(f, mscale) / fam.yarn_mscale(f, mad)
    else:
        scale = fam.yarn_mscale(f)
    return inv, scale * attn


def _deepseek(g: fam.Group, where: str, notes: list[str]) -> EngineRope:
    p = g.params
    if p["rope_type"] == "default":  # deepseek_v2.py l. 2609: rope_scaling = None
        return _rope(g, fam.plain(float(p["rope_theta"]), g.rotary_dim), "models/deepseek_v2.py", notes)
    if p["rope_type"] != "yarn":
        notes.append(f"rope_type {p['rope_type']!r} is read as DeepSeek's YaRN: deepseek_v2.py renames every "
                     "non-default type to deepseek_yarn")
    if p.get("truncate") is False:
        notes.append("truncate=false is ignored: DeepSeek's YaRN always floors/ceils the ramp's ends")
    if p.get("attention_factor") is not None:
        notes.append(f"attention_factor={p['attention_factor']} is not read (SGLang reads attn_factor)")
    inv, scale = _yarn(p, g, where, deepseek=True)
    softmax = 1.0
    if p.get("apply_yarn_scaling", True) and p.get("apply_scale", True):  # configs/model_config.py l. 2623
        softmax = fam.yarn_mscale(fam.number(p, "factor", where, 1.0),
                                  fam.number(p, "mscale_all_dim", where) or 0.0) ** 2
    return _rope(g, inv, "rope_variant.py DeepseekScalingRotaryEmbedding, models/deepseek_v2.py", notes,
                 attention_factor=scale, softmax_scale=softmax)


def _longrope(g: fam.Group, where: str, notes: list[str]) -> EngineRope:
    """Short factors over ``original`` rows, long ones over max_position rows; a batch whose
    positions include one > original (a sequence of more than original + 1 tokens) reads the
    long table for every token; mscale as vLLM's."""
    p, d, base = g.params, g.rotary_dim, float(g.params["rope_theta"])
    if g.layout != "half":
        raise Unsupported("SGLang refuses LongRoPE without is_neox_style (Phi3LongRoPEScaledRotaryEmbedding)")
    original = int(p[fam.ORIGINAL])
    s = g.max_position / original
    default = math.sqrt(1 + math.log(s) / math.log(original)) if s > 1 else 1.0
    short = (fam.longrope(base, d, p["short_factor"], f"{where}['short_factor']"),
             fam.number(p, "short_mscale", where, default))
    long = (fam.longrope(base, d, p["long_factor"], f"{where}['long_factor']"), fam.number(p, "long_mscale", where, default))

    def at_length(n: int) -> tuple[torch.Tensor, float]:
        return long if n - 1 > original else short  # the last position n - 1 against torch.any(positions > k)

    notes.append(f"the long factors apply to a whole forward batch once any position in it exceeds {original} "
                 "(torch.any over the batch): a short request batched with a long one rotates long, and keys "
                 "cached earlier keep the factors they were rotated with")
    return _rope(g, short[0], "rope_variant.py Phi3LongRoPEScaledRotaryEmbedding", notes, attention_factor=short[1],
                 beyond="switch", switch_at=original + 1, at_length=at_length)


def _dynamic(g: fam.Group, where: str, notes: list[str]) -> EngineRope:
    p, d, base = g.params, g.rotary_dim, float(g.params["rope_theta"])
    if "alpha" in p:
        notes.append("dynamic with alpha: one fixed base * alpha^(d/(d-2)) (DynamicNTKAlphaRotaryEmbedding)")
        return _rope(g, fam.plain(fam.dynamic_base(base, d, fam.number(p, "alpha", where)), d),
                     "rope_variant.py DynamicNTKAlphaRotaryEmbedding", notes)
    f = fam.number(p, "factor", where, 1.0)
    stretch = f * f - (f - 1)
    notes.append(f"'dynamic' is static here: one table of max_position_embeddings * factor = {int(g.max_position * f)} "
                 f"rows at base * {stretch:g}^(d/(d-2)), transformers' stretch at that length, used at every length")
    return _rope(g, fam.plain(fam.dynamic_base(base, d, stretch), d), "rope_variant.py DynamicNTKScalingRotaryEmbedding",
                 notes)


def _group(model_type: str, g: fam.Group, cfg: Mapping[str, Any]) -> EngineRope:
    p, d = g.params, g.rotary_dim
    kind, base, where = p["rope_type"], float(p["rope_theta"]), g.where
    notes: list[str] = []
    if model_type == "llama4_text":
        notes.append("NoPE on every 4th layer (llama4.py use_rope), no_rope_layers not read; rotate_half on q/k "
                     "weights permuted at load (mllama4.py): the checkpoint's pairs (2i, 2i+1) rotate")
    if model_type in ("deepseek_v2", "deepseek_v3"):
        return _deepseek(g, where, notes)
    if model_type == "gemma3_text":
        if kind != "default":
            notes.append(f"rope_type {kind!r} (factor {p.get('factor')}) is not applied: gemma3_causal.py passes "
                         "rope_scaling={'rope_type': 'default'} to every layer")
        return _rope(g, fam.plain(base, d), "models/gemma3_causal.py", notes)
    dca_notes = fam.dual_chunk_notes(cfg, kind, model_type)
    if dca_notes is not None:
        return _rope(g, fam.plain(base, d), "rope_variant.py DualChunkRotaryEmbedding, models/qwen2.py", notes + dca_notes)
    if "mrope_section" in p:
        if kind not in ("default", "yarn"):
            raise ValueError(f"posenc's SGLang rule does not model M-RoPE with rope_type {kind!r}")
        notes.append(f"M-RoPE: mrope_section {p['mrope_section']} splits the pairs among (t, h, w) positions; "
                     "text tokens (equal positions) rotate as below")
    if kind == "default":
        if p.get("use_fope"):
            raise ValueError("posenc's SGLang rule does not model use_fope (FourierRotaryEmbedding)")
        return _rope(g, fam.plain(base, d), "base.py", notes)
    if kind in _NOT_MODELLED:
        raise ValueError(f"posenc's SGLang rule does not model rope_type {kind!r} (SGLang runs it: get_rope)")
    if kind == "linear":
        notes.append("as vLLM (the same formula)")
        return _rope(g, fam.linear(base, d, fam.number(p, "factor", where, 1.0)), "base.py", notes)
    if kind == "llama3":
        notes.append("as vLLM (the same formula)")
        inv = fam.llama3(base, d, fam.number(p, "factor", where, 1.0), fam.number(p, "low_freq_factor", where, 1.0),
                         fam.number(p, "high_freq_factor", where, 4.0), int(p.get(fam.ORIGINAL) or g.max_position))
        return _rope(g, inv, "rope_variant.py Llama3RotaryEmbedding", notes)
    if kind == "dynamic":
        return _dynamic(g, where, notes)
    if kind in ("yarn", "deepseek_yarn"):
        if kind == "yarn" and p.get("attention_factor") is not None:
            notes.append(f"attention_factor={p['attention_factor']} is not read: SGLang's YaRN scales cos/sin by "
                         "mscale * attn_factor")
        inv, scale = _yarn(p, g, where, deepseek=kind == "deepseek_yarn")
        return _rope(g, inv, "yarn.py" if kind == "yarn" else "rope_variant.py", notes, attention_factor=scale)
    if kind == "longrope":
        return _longrope(g, where, notes)
    raise Unsupported(f"SGLang refuses rope_type {kind!r}: get_rope raises 'Unknown RoPE scaling type {kind}'")


@register_engine("sglang", version=VERSION, summary="SGLang: factory.get_rope's classes (vLLM's, with its own "
                                                    "YaRN, dynamic, LongRoPE and Gemma 3 readings)")
def sglang_rope(config: Mapping[str, Any]) -> list[EngineRope]:
    """SGLang's RoPE for each rotating layer type of ``config`` (a parsed config.json)."""
    cfg = fam.text_config(config)
    if cfg.get("model_type") == "smollm3":  # no SmolLM3 model file: the Transformers backend (models/transformers.py)
        return fam.through_transformers(
            cfg, "sglang", f"SGLang {VERSION}: srt/models/transformers.py (Transformers backend)",
            "SGLang has no SmolLM3 model file and runs it through its Transformers backend: the RoPE is "
            "transformers' own")
    model_type, groups = fam.read_groups(cfg, "SGLang", strict_type=False)
    return [_group(model_type, g, cfg) for g in groups]
