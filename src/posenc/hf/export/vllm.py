"""The winner of ``posenc extend`` as vLLM serves it: ``vllm serve MODEL --max-model-len N
--hf-overrides JSON`` on the original checkpoint (``vllm.json``: the overrides; ``vllm.sh``: the
line).

How vLLM 0.33.0 reads the overrides (``vllm/config/model.py``, ``ModelConfig.__post_init__`` and
``_apply_dict_overrides``; ``vllm/transformers_utils/config.py``, ``get_config``): flat values
(``max_position_embeddings``) update the transformers config before
``patch_rope_parameters`` standardizes it; a dict value (``rope_parameters``) is then set on the
config as it is, unstandardized. So ``rope_parameters`` is written whole, as transformers 5
writes it (``rope_type``, ``rope_theta``, the scaling's keys: :func:`posenc.rotary.to_hf`), which
is what ``get_rope`` (``vllm/model_executor/layers/rotary_embedding/__init__.py``) reads:
``linear`` (``factor``), ``yarn`` (``factor``, ``original_max_position_embeddings``,
``beta_fast`` / ``beta_slow``, ``attention_factor``, ``truncate``), ``llama3`` (``factor``,
``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``), ``default``
(``rope_theta``: NTK-aware is written as the raised base, which vLLM reads exactly; vLLM's own
``ntk`` type is another formula, (base s)^(-2i/d) / s^(2/d)).

``max_model_len`` (``_get_and_verify_max_len``): vLLM refuses ``--max-model-len`` above
``max_position_embeddings`` (times ``factor`` for the types other than yarn / llama3 / longrope),
so the overrides raise ``max_position_embeddings`` to N as extend's config.json does.

What vLLM 0.33.0 cannot express, each said in one line with the nearest it can (the best
measured row by extend's rule among those it can):

* Self-Extend and ReRoPE: no such attention in vLLM;
* Dual Chunk Attention: vLLM's Qwen2 / Qwen3 models read ``dual_chunk_attention_config``
  (``chunk_size``, ``local_size``, ``original_max_position_embeddings``;
  ``rotary_embedding/dual_chunk_rope.py`` rotates with chunk_len = chunk_size - local_size, as
  posenc) and pass it to the attention layer, but no attention backend of 0.33.0 takes it
  (``FlashAttentionImpl.__init__`` has no such argument; the V0 backend that ran it,
  ``VLLM_ATTENTION_BACKEND=DUAL_CHUNK_FLASH_ATTN``, is gone from ``v1/attention/backends/registry.py``),
  and Llama's model does not read it;
* dynamic NTK: vLLM's ``dynamic`` type is static at ``max_position_embeddings * factor``
  (``dynamic_ntk_scaling_rope.py``), so it is written as the static base it reaches at N
  (:func:`~.winner.static_ntk_at`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Mapping

from .winner import Winner, static_ntk_at

__all__ = ["DCA_MODEL_TYPES", "VLLM_VERSION", "apply_overrides", "dual_chunk_config", "vllm_export", "vllm_overrides"]

#: the vLLM whose sources these spellings were read from
VLLM_VERSION = "0.33.0"
#: rope types vLLM 0.33.0's get_rope builds the way transformers does (besides ``default``)
_SAME_AS_HF = ("linear", "yarn", "llama3")
#: vLLM 0.33.0 models that read dual_chunk_attention_config (vllm/model_executor/models/)
DCA_MODEL_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next")


def dual_chunk_config(params: Mapping[str, Any], L: int) -> dict[str, int]:
    """``dual_chunk_attention_config`` as vLLM's Qwen2 and ``DualChunkRotaryEmbedding`` read it
    (Qwen2.5-1M's config.json spells the same three keys), for posenc's Dual Chunk parameters."""
    return dict(chunk_size=int(params["chunk_size"]), local_size=int(params["local_size"]),
                original_max_position_embeddings=int(L))


def _expressible(row: Mapping[str, Any]) -> bool:
    if row.get("method") is not None:
        return False
    if row.get("scaling") is None:
        return True
    rope_type = ((row.get("hf") or {}).get("rope_parameters") or {}).get("rope_type")
    return rope_type == "default" or rope_type in _SAME_AS_HF


def _unexpressible(winner: Winner, row: Mapping[str, Any]) -> str:
    method = row.get("method")
    if method == "dual_chunk":
        where = ("its model reads dual_chunk_attention_config "
                 f"{json.dumps(dual_chunk_config(row['params'], winner.L))} but no attention backend of "
                 f"{VLLM_VERSION} accepts it (DUAL_CHUNK_FLASH_ATTN is gone)"
                 if winner.config.get("model_type") in DCA_MODEL_TYPES
                 else f"its {winner.config.get('model_type')!r} model does not read dual_chunk_attention_config")
        return f"vLLM {VLLM_VERSION} cannot run {row['label']}: {where}"
    if method is not None:
        return f"vLLM {VLLM_VERSION} cannot run {row['label']}: it has no such attention"
    return f"vLLM {VLLM_VERSION} has no rope type for {row['label']}"


def vllm_overrides(winner: Winner) -> tuple[dict[str, Any], list[str], Mapping[str, Any]]:
    """(the ``--hf-overrides`` dict, the notes, the row it writes) for ``winner``: its own row
    where vLLM can express it, else the nearest (module docstring), with one note saying so."""
    row, notes = winner.row, []
    if row.get("scaling") == "dynamic":
        row = static_ntk_at(winner, row)
        notes.append(f"vLLM {VLLM_VERSION}'s dynamic type is static at max_position_embeddings * factor: "
                     f"{winner.row['label']} is written as the base it reaches at N = {winner.N}, {row['label']}")
    elif not _expressible(row):
        nearest = winner.nearest(_expressible)
        if nearest is None:
            raise ValueError(f"{_unexpressible(winner, row)}, and no measured candidate is a RoPE vLLM reads")
        notes.append(f"{_unexpressible(winner, row)}; nearest: {nearest['label']} (the best measured RoPE candidate)")
        row = nearest
    config = winner.hf_config(row)
    out: dict[str, Any] = {}
    if row.get("scaling") is not None:
        out["rope_parameters"] = config["rope_parameters"]
    out["max_position_embeddings"] = config["max_position_embeddings"]
    rope = out.get("rope_parameters") or {}
    if rope.get("rope_type") == "yarn":
        cache = int(rope["original_max_position_embeddings"] * rope["factor"])
        if cache < winner.N:  # YaRNScalingRotaryEmbedding's cos/sin cache: original * factor positions
            notes.append(f"vLLM {VLLM_VERSION} builds YaRN's cos/sin table for original_max_position_embeddings "
                         f"* factor = {cache} positions, fewer than N = {winner.N}: serve at most {cache}")
    return out, notes, row


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as vLLM holds it after ``--hf-overrides``: flat values updated, a dict value
    (``rope_parameters``) replacing the config's whole; the top-level keys transformers 5 folds
    into ``rope_parameters`` when it loads (``rope_scaling``, ``rope_theta``) are gone then."""
    out = dict(config)
    if "rope_parameters" in overrides:
        out.pop("rope_scaling", None)
        out.pop("rope_theta", None)
    out.update(overrides)
    return out


def vllm_export(winner: Winner, out: str | Path) -> dict[str, Any]:
    """Write ``vllm.json`` (the overrides) and ``vllm.sh`` (the serve line, shell-quoted with
    :func:`shlex.join`) into ``out``; returns ``{target, files, command, notes, written}``."""
    overrides, notes, row = vllm_overrides(winner)
    out = Path(out)
    argv = ["vllm", "serve", str(winner.checkpoint), "--max-model-len", str(winner.N),
            "--hf-overrides", json.dumps(overrides, sort_keys=True)]
    command = shlex.join(argv)
    (out / "vllm.json").write_text(json.dumps(overrides, indent=2, sort_keys=True) + "\n")
    lines = ["#!/bin/sh", f"# posenc extend: {row['label']} at N = {winner.N}, as vLLM {VLLM_VERSION} reads it"]
    lines += [f"# {n}" for n in notes] + [command]
    (out / "vllm.sh").write_text("\n".join(lines) + "\n")
    (out / "vllm.sh").chmod(0o755)
    return dict(target="vllm", files=[str(out / "vllm.json"), str(out / "vllm.sh")], command=command,
                notes=notes, written=row["label"])
