"""vLLM 0.33.0's reading of a config.json as RoPE, re-derived from its source.

The path (vLLM 0.33.0, files under ``vllm/``): transformers loads the config and
``transformers_utils/config.py`` ``patch_rope_parameters`` (l. 609-688) renames a legacy
``type``/``su``/``mrope``, refusing a ``type`` that contradicts ``rope_type``; each model file
then calls ``model_executor/layers/rotary_embedding/__init__.py`` ``get_rope`` (l. 33-340) with
its head size, ``max_position`` (``config.max_position_embeddings``) and ``is_neox_style``;
``get_rope`` picks one class per ``rope_type`` and the class builds one cos/sin table, scaled by
its ``mscale``, when the model is built. ``config/model.py`` ``_get_and_verify_max_len``
(l. 2545-2680) sets the default ``max_model_len``: ``max_position_embeddings`` times ``factor``
for types other than llama3/yarn/longrope/deepseek (and Gemma 3), ``original_max_position_
embeddings`` for longrope.

What a user would not guess, each a note on the result: "dynamic" is static, and with no
``max_trained_positions`` its stretch is 1 (the plain frequencies); LongRoPE's long factors are
chosen once per server by ``max_model_len``, not per sequence; DeepSeek reads any non-default
type as its own YaRN; Dual Chunk Attention ignores the rope type; SmolLM3 runs through the
Transformers backend.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from . import _vllm_family as fam
from .base import EngineRope, Unsupported, register_engine

__all__ = ["vllm_rope", "vllm_ropes"]

VERSION = "0.33.0"
ROPE = "vllm/model_executor/layers/rotary_embedding"
SOURCE = f"vLLM {VERSION}: {ROPE}/__init__.py get_rope"
_FAMILIES = {"qwen2": fam.Family(head_dim="hidden", theta=1_000_000.0)}  # qwen2.py: head_dim = hidden // heads
_NOT_MODELLED = {"ntk", "mllama4", "bailing_mrope", "openpangu", "proportional", "deepseek_yarn",
                 "deepseek_llama_scaling"}


def _rope(g: fam.Group, inv, source: str, notes: list[str], **kw: Any) -> EngineRope:
    return EngineRope(engine="vllm", inv_freq=inv, rotary_dim=g.rotary_dim, layout=g.layout, layer_type=g.layer_type,
                      layers=g.layers, notes=tuple(notes), source=f"{SOURCE}; {source}", **kw)


def _deepseek(g: fam.Group, where: str, notes: list[str]) -> EngineRope:
    """deepseek_v2.py (l. 542-563, 1115-1136): a non-default type becomes "deepseek_llama_scaling"
    when ``attention_factor == 1.0``, else "deepseek_yarn"; both build
    ``DeepseekScalingRotaryEmbedding`` (deepseek_scaling_rope.py): YaRN with truncation always
    on, mscale = m(f, mscale=1) / m(f, mscale_all_dim=0); deepseek_yarn alone multiplies the
    softmax scale by m(f, mscale_all_dim)^2."""
    p = g.params
    base, d = float(p["rope_theta"]), g.rotary_dim
    if p["rope_type"] == "default":
        return _rope(g, fam.plain(base, d), "deepseek_v2.py", notes)
    kind = "deepseek_llama_scaling" if p.get("attention_factor") == 1.0 else "deepseek_yarn"
    f = fam.number(p, "factor", where)
    if f is None or p.get(fam.ORIGINAL) is None:
        missing = "factor" if f is None else fam.ORIGINAL
        raise Unsupported(f"vLLM does not start: get_rope reads {where}[{missing!r}] for {kind} (KeyError)")
    if p["rope_type"] != "yarn":
        notes.append(f"rope_type {p['rope_type']!r} is read as DeepSeek's YaRN ({kind}): deepseek_v2.py renames "
                     "every non-default type")
    inv = fam.yarn(base, d, f, int(p[fam.ORIGINAL]), fam.number(p, "beta_fast", where, 32),
                   fam.number(p, "beta_slow", where, 1), truncate=True)
    if "truncate" in p and p["truncate"] is False:
        notes.append("truncate=false is ignored: DeepSeek's YaRN always floors/ceils the ramp's ends")
    mscale = fam.yarn_mscale(f, fam.number(p, "mscale", where, 1)) / fam.yarn_mscale(
        f, fam.number(p, "mscale_all_dim", where, 0))
    softmax = 1.0
    if kind == "deepseek_yarn":
        softmax = fam.yarn_mscale(f, fam.number(p, "mscale_all_dim", where, 0)) ** 2
    else:
        notes.append("attention_factor = 1.0 selects deepseek_llama_scaling: YaRN frequencies, no softmax-scale "
                     "correction")
    if p.get("attention_factor") is not None and p["attention_factor"] != 1.0:
        notes.append(f"attention_factor={p['attention_factor']} is not read: cos/sin carry mscale(factor, mscale) / "
                     "mscale(factor, mscale_all_dim)")
    return _rope(g, inv, "deepseek_scaling_rope.py, models/deepseek_v2.py", notes, attention_factor=mscale,
                 softmax_scale=softmax)


def _yarn_attention(p: Mapping[str, Any], f: float, where: str) -> float:
    """``YaRNScalingRotaryEmbedding.__init__``: ``attention_factor`` if given, else
    m(f, mscale) / m(f, mscale_all_dim) when both are non-zero, else m(f)."""
    af = fam.number(p, "attention_factor", where)
    if af is not None:
        return af
    mscale, mad = fam.number(p, "mscale", where), fam.number(p, "mscale_all_dim", where)
    if mscale and mad:
        return fam.yarn_mscale(f, mscale) / fam.yarn_mscale(f, mad)
    return fam.yarn_mscale(f)


def _longrope(g: fam.Group, where: str, original: int, max_model_len: int | None, notes: list[str]) -> EngineRope:
    """phi3_long_rope_scaled_rope.py: two tables (short factors over L rows, long ones over
    max_position rows) and ``use_long_rope = max_model_len > original``, fixed when the model is
    built; mscale = sqrt(1 + ln(s) / ln(original)), s = max_position / original (``short_mscale``
    / ``long_mscale`` override it)."""
    p, d, base = g.params, g.rotary_dim, float(g.params["rope_theta"])
    if g.layout != "half":
        raise Unsupported("vLLM refuses LongRoPE without is_neox_style (Phi3LongRoPEScaledRotaryEmbedding)")
    s = g.max_position / original
    default = math.sqrt(1 + math.log(s) / math.log(original)) if s > 1 else 1.0
    length = original if max_model_len is None else max_model_len
    long = length > original
    which = "long" if long else "short"
    mscale = fam.number(p, f"{which}_mscale", where, default)
    inv = fam.longrope(base, d, p[f"{which}_factor"], f"{where}[{which + '_factor'!r}]")
    fam.longrope(base, d, p["short_factor" if long else "long_factor"], f"{where}[{'short' if long else 'long'}_factor]")
    if max_model_len is None:
        notes.append(f"max_model_len defaults to original_max_position_embeddings = {original}: the short factors "
                     f"only; with --max-model-len > {original} the long factors rotate every position of every "
                     "request (chosen once per server, not per sequence)")
    else:
        notes.append(f"max_model_len = {max_model_len}: the {which} factors for every position of every request "
                     "(chosen once per server, not per sequence)")
    return _rope(g, inv, "phi3_long_rope_scaled_rope.py, config/model.py _get_and_verify_max_len", notes,
                 attention_factor=mscale)


def _dynamic(g: fam.Group, where: str, notes: list[str]) -> EngineRope:
    """dynamic_ntk_scaling_rope.py: ONE table of ``max_position`` rows at the base stretched by
    (f * max_position / max_trained_positions - (f - 1))^(d/(d-2)), max_trained_positions
    defaulting to max_position (stretch 1); dynamic_ntk_alpha_rope.py: base * alpha^(d/(d-2))."""
    p, d, base = g.params, g.rotary_dim, float(g.params["rope_theta"])
    if "alpha" in p:
        alpha = fam.number(p, "alpha", where)
        notes.append("dynamic with alpha: one fixed base * alpha^(d/(d-2)) (DynamicNTKAlphaRotaryEmbedding)")
        return _rope(g, fam.plain(fam.dynamic_base(base, d, alpha), d), "dynamic_ntk_alpha_rope.py", notes)
    f = fam.number(p, "factor", where)
    trained = fam.number(p, "max_trained_positions", where, g.max_position)
    stretch = f * g.max_position / trained - (f - 1)
    if stretch <= 0:
        raise Unsupported(f"vLLM's dynamic base stretch f * max_position / max_trained_positions - (f - 1) = "
                          f"{stretch:g} is not > 0 for {where}")
    inv = fam.plain(fam.dynamic_base(base, d, stretch), d)
    if "max_trained_positions" not in p:
        notes.append("'dynamic' is static here: without max_trained_positions the stretch is f*L/L - (f-1) = 1, "
                     "the plain frequencies at every length (transformers stretches them past L)")
    else:
        notes.append(f"'dynamic' is static here: one base stretched by {stretch:g}^(d/(d-2)) at every length")
    notes.append(f"the cos/sin table has max_position_embeddings = {g.max_position} rows while max_model_len "
                 f"defaults to {g.max_position} * factor = {int(g.max_position * f)} (config/model.py): "
                 "positions past the table read outside it (source reading, not run)")
    return _rope(g, inv, "dynamic_ntk_scaling_rope.py", notes)


def _group(model_type: str, g: fam.Group, cfg: Mapping[str, Any], max_model_len: int | None) -> EngineRope:
    p, d = g.params, g.rotary_dim
    kind, base, where = p["rope_type"], float(p["rope_theta"]), g.where
    notes: list[str] = []
    if model_type == "llama4_text":
        notes.append("rotate_half on q/k weights permuted at load (llama4.py permute_qk_weight_for_rotary): the "
                     "checkpoint's pairs (2i, 2i+1) rotate")
    if model_type in ("deepseek_v2", "deepseek_v3"):
        return _deepseek(g, where, notes)
    dca_notes = fam.dual_chunk_notes(cfg, kind, model_type)
    if dca_notes is not None:
        return _rope(g, fam.plain(base, d), "dual_chunk_rope.py, models/qwen2.py", notes + dca_notes)
    if model_type == "gpt_oss":  # gpt_oss.py l. 111-127 rebuilds the dict: no mscale / attention_factor
        missing = [k for k in ("factor", fam.ORIGINAL, "beta_fast", "beta_slow") if k not in p]
        if kind != "yarn" or missing:
            raise Unsupported(f"vLLM does not start: gpt_oss.py reads {where} as YaRN and needs "
                              f"{', '.join(missing) or 'rope_type yarn'}")
        p = {k: p[k] for k in ("rope_theta", "rope_type", "factor", fam.ORIGINAL, "beta_fast", "beta_slow")} | {
            "truncate": p.get("truncate", True)}
    if kind not in ("default", "yarn") and "mrope_section" in p:
        raise ValueError(f"posenc's vLLM rule does not model M-RoPE with rope_type {kind!r}")
    if "mrope_section" in p:
        notes.append(f"M-RoPE: mrope_section {p['mrope_section']} splits the pairs among (t, h, w) positions; "
                     "text tokens (equal positions) rotate as below")
    if kind == "default":
        if p.get("use_fope"):
            raise ValueError("posenc's vLLM rule does not model use_fope (FourierRotaryEmbedding)")
        return _rope(g, fam.plain(base, d), "base.py", notes)
    if kind in _NOT_MODELLED:
        raise ValueError(f"posenc's vLLM rule does not model rope_type {kind!r} (vLLM runs it: get_rope)")
    if kind == "linear":
        return _rope(g, fam.linear(base, d, fam.number(p, "factor", where)), "linear_scaling_rope.py", notes)
    if kind == "llama3":
        inv = fam.llama3(base, d, fam.number(p, "factor", where), fam.number(p, "low_freq_factor", where),
                         fam.number(p, "high_freq_factor", where), int(p[fam.ORIGINAL]))
        return _rope(g, inv, "llama3_rope.py", notes)
    if kind == "dynamic":
        return _dynamic(g, where, notes)
    if kind == "yarn":
        f, original = fam.number(p, "factor", where), int(p[fam.ORIGINAL])
        truncate = p.get("truncate", True)
        if not isinstance(truncate, bool):
            raise TypeError(f"{where}['truncate'] must be a bool, got {truncate!r}")
        inv = fam.yarn(base, d, f, original, fam.number(p, "beta_fast", where, 32),
                       fam.number(p, "beta_slow", where, 1), truncate=truncate)
        return _rope(g, inv, "yarn_scaling_rope.py, common.py", notes, attention_factor=_yarn_attention(p, f, where))
    if kind == "longrope":
        return _longrope(g, where, int(p[fam.ORIGINAL]), max_model_len, notes)
    raise Unsupported(f"vLLM refuses rope_type {kind!r}: get_rope raises 'Unknown RoPE scaling type {kind}'")


def vllm_ropes(config: Mapping[str, Any], *, max_model_len: int | None = None) -> list[EngineRope]:
    """vLLM's RoPE for each rotating layer type of ``config`` (a parsed config.json).

    ``max_model_len``: the server's ``--max-model-len`` (None: vLLM's default); only LongRoPE's
    choice of factors depends on it."""
    if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                                      or max_model_len < 1):
        raise ValueError(f"max_model_len must be an int >= 1 or None, got {max_model_len!r}")
    cfg = fam.text_config(config)
    if cfg.get("model_type") == "smollm3":
        return fam.through_transformers(
            cfg, "vllm", f"vLLM {VERSION}: model_executor/models/registry.py (Transformers backend)",
            "vLLM runs SmolLM3ForCausalLM through its Transformers backend: the RoPE is transformers' own")
    model_type, groups = fam.read_groups(cfg, "vLLM", strict_type=True, overrides=_FAMILIES)
    return [_group(model_type, g, cfg, max_model_len) for g in groups]


@register_engine("vllm", version=VERSION, summary="vLLM: get_rope's classes, one static cos/sin table per model")
def vllm_rope(config: Mapping[str, Any]) -> list[EngineRope]:
    """vLLM's RoPE for each rotating layer type of ``config``, at the default ``max_model_len``."""
    return vllm_ropes(config)
