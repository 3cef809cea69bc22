"""The winner of ``posenc extend`` as llama.cpp runs it: the command-line flags
(``llama.cpp.sh``) and, with ``--gguf``, the rope metadata of a new GGUF (:mod:`.gguf_rope`).

Flags and their meaning, read from llama.cpp as vendored by llama-cpp-python 0.3.36
(``common/arg.cpp``; ``src/llama-context.cpp``, ``llama_context::llama_context``;
``ggml/src/ggml-cpu/ops.cpp``, ``rope_yarn``):

* ``--rope-scaling {none,linear,yarn}``; ``--rope-scale s`` (freq_scale = 1 / s);
  ``--rope-freq-base B``; ``-c N`` (the context).
* YaRN: ``--yarn-orig-ctx L`` (the length the ramp is relative to), ``--yarn-ext-factor 1``
  (the ramp on), ``--yarn-beta-fast`` / ``--yarn-beta-slow`` (the ramp's ends: the llama
  architecture reads no GGUF key for them, only these flags). The attention factor is
  (1 + 0.1 ln s) times the GGUF's ``rope.scaling.attn_factor``: llama_context overwrites the
  ``--yarn-attn-factor`` flag whenever the ext factor is not 0, so the flag is not written, and
  a YaRN whose attention factor is not 0.1 ln s + 1 needs ``--gguf``.
* NTK-aware (static): no llama.cpp type, but it is a base change, theta_i = (base s^(d/(d-2)))^(-2i/d):
  ``--rope-scaling none --rope-freq-base base * s^(d/(d-2))`` is exact (float32). Dynamic NTK
  is written as the base it reaches at N (:func:`~.winner.static_ntk_at`).
* Llama 3's per-pair factors: no flag; llama.cpp reads them from a ``rope_freqs.weight`` tensor
  (``src/models/llama.cpp``; ``conversion/llama.py`` writes theta_i / theta'_i), which the
  ``--gguf`` export adds. Without ``--gguf``, the nearest flags.
* Self-Extend: ``--grp-attn-n G --grp-attn-w W``, registered for ``llama-completion`` alone
  (``LLAMA_EXAMPLE_COMPLETION``: ``llama-server`` and ``llama-cli`` refuse them), which asserts
  W % G == 0 (``tools/completion/completion.cpp``): W is rounded down to a multiple of G, said in a
  note. llama.cpp groups the KV cache in blocks of W as tokens arrive, an approximation of the
  paper's neighbour window (``posenc.methods.self_extend`` follows LongLM's code).
* ReRoPE and Dual Chunk Attention: no llama.cpp equivalent; the nearest row.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any, Mapping

from .winner import Winner, static_ntk_at

__all__ = ["LLAMACPP_VERSION", "llamacpp_export", "llamacpp_flags", "rope_plan"]

#: the llama.cpp these flags were read from
LLAMACPP_VERSION = "llama.cpp as vendored by llama-cpp-python 0.3.36"
#: scalings llama.cpp runs from flags alone
_BY_FLAGS = ("linear", "ntk", "yarn")


def _num(x: float) -> str:
    """A float as a flag value: the shortest repr (stof then rounds it to float32)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def rope_plan(winner: Winner, row: Mapping[str, Any]) -> dict[str, Any]:
    """What llama.cpp needs for ``row`` (a scaling row or the model as it is): ``type`` (none,
    linear or yarn), ``factor``, ``freq_base``, and for yarn ``orig_ctx``, ``beta_fast``,
    ``beta_slow`` and ``attn_factor`` (the GGUF key: the row's attention factor over
    1 + 0.1 ln s); for llama3, ``freq_factors`` (rope_freqs.weight: theta_i / theta'_i, float64)."""
    rope = winner.rope(row)
    own = winner.rope(dict(row, scaling=None, hf=None))
    cfg = rope.config
    plan: dict[str, Any] = dict(type="none", factor=1.0, freq_base=float(cfg.base), rotary_dim=rope.rotary_dim)
    scaling = row.get("scaling")
    if scaling in (None, "default") or cfg.scaling == "default":  # ntk is written as a raised base
        return plan
    scfg = cfg.scaling_config
    if scaling == "linear":
        return plan | dict(type="linear", factor=float(scfg.factor))
    if scaling == "yarn":
        s = float(scfg.factor)
        return plan | dict(type="yarn", factor=s, orig_ctx=int(scfg.original_max_position_embeddings or winner.L),
                           beta_fast=float(scfg.fast), beta_slow=float(scfg.slow), truncate=bool(scfg.truncate),
                           attn_factor=float(rope.attention_factor) / (1.0 + 0.1 * math.log(s)) if s > 1 else 1.0)
    if scaling == "llama3":
        return plan | dict(freq_factors=(own.inv_freq / rope.inv_freq).tolist())
    raise ValueError(f"llama.cpp has no rope type for {row['label']}")


def _flags_of(plan: dict[str, Any], N: int) -> list[str]:
    flags = ["--rope-scaling", plan["type"]]
    if plan["type"] == "none":
        flags += ["--rope-freq-base", _num(plan["freq_base"])]
    else:
        flags += ["--rope-scale", _num(plan["factor"])]
    if plan["type"] == "yarn":
        flags += ["--yarn-orig-ctx", str(plan["orig_ctx"]), "--yarn-ext-factor", "1",
                  "--yarn-beta-fast", _num(plan["beta_fast"]), "--yarn-beta-slow", _num(plan["beta_slow"])]
    return flags + ["-c", str(N)]


def _by_flags(row: Mapping[str, Any]) -> bool:
    return row.get("method") is None and row.get("scaling") in (None, *_BY_FLAGS)


def llamacpp_flags(winner: Winner, *, gguf: bool = False) -> tuple[str, list[str], list[str], Mapping[str, Any]]:
    """(the binary, its flags, the notes, the row they run) for ``winner`` (module docstring).
    ``gguf``: a GGUF with the row's rope metadata is written beside them, so Llama 3's factors
    (a tensor) and a YaRN attention factor (a key) need no nearest."""
    row, notes, binary = winner.row, [], "llama-server"
    group = None
    if row.get("scaling") == "dynamic":
        row = static_ntk_at(winner, row)
        notes.append(f"llama.cpp has no dynamic NTK: {winner.row['label']} is written as the base it reaches at "
                     f"N = {winner.N}, {row['label']}")
    elif row.get("method") == "self_extend":
        G, W = int(row["params"]["group_size"]), int(row["params"]["neighbor_window"])
        group = (G, W - W % G)
        if W % G:
            notes.append(f"llama-completion requires --grp-attn-w to be a multiple of --grp-attn-n: W = {W} is "
                         f"written as {group[1]}")
        notes.append("--grp-attn-n/-w are llama-completion's alone (llama-server and llama-cli refuse them)")
        binary, row = "llama-completion", dict(row, method=None, scaling=None, hf=None)
    elif row.get("scaling") == "llama3" and not gguf:
        nearest = winner.nearest(_by_flags)
        notes.append(f"llama.cpp reads Llama 3's per-pair factors from a rope_freqs.weight tensor, not from flags "
                     f"(pass --gguf to write it); nearest: {nearest['label']}")
        row = nearest
    elif not (_by_flags(row) or row.get("scaling") == "llama3"):
        nearest = winner.nearest(_by_flags)
        notes.append(f"llama.cpp cannot run {row['label']}; nearest: {nearest['label']} (the best measured candidate "
                     "it can)")
        row = nearest
    plan = rope_plan(winner, row)
    if plan["type"] == "yarn" and not gguf and abs(plan["attn_factor"] - 1.0) > 1e-6:
        notes.append(f"llama.cpp ignores --yarn-attn-factor with YaRN on: the attention factor "
                     f"{plan['attn_factor']:.6g} x (1 + 0.1 ln s) is the GGUF's rope.scaling.attn_factor (pass --gguf)")
    if plan["type"] == "yarn" and not plan["truncate"]:
        notes.append("llama.cpp rounds YaRN's ramp ends to whole pairs (truncate = true); this row has truncate = false")
    flags = _flags_of(plan, winner.N)
    if group is not None:
        flags += ["--grp-attn-n", str(group[0]), "--grp-attn-w", str(group[1])]
    return binary, flags, notes, row


def llamacpp_export(winner: Winner, out: str | Path, gguf: str | Path | None = None) -> dict[str, Any]:
    """Write ``llama.cpp.sh`` (and, with ``gguf``, the GGUF with the row's rope metadata and its
    tensor hashes: :func:`.gguf_rope.write_gguf`) into ``out``; returns ``{target, files,
    command, notes, written}``."""
    from .gguf_rope import write_gguf

    out = Path(out)
    binary, flags, notes, row = llamacpp_flags(winner, gguf=gguf is not None)
    files, model = [], "MODEL.gguf"
    if gguf is not None:
        files = write_gguf(Path(gguf), out, rope_plan(winner, row), winner)
        model = files[0]
    command = shlex.join([binary, "-m", model, *flags])
    lines = ["#!/bin/sh", f"# posenc extend: {row['label']} at N = {winner.N}, as {LLAMACPP_VERSION} runs it"]
    if gguf is None:
        lines.append("# MODEL.gguf: a GGUF of the checkpoint (llama.cpp's convert_hf_to_gguf.py)")
    lines += [f"# {n}" for n in notes] + [command]
    (out / "llama.cpp.sh").write_text("\n".join(lines) + "\n")
    (out / "llama.cpp.sh").chmod(0o755)
    return dict(target="llama.cpp", files=[*files, str(out / "llama.cpp.sh")], command=command, notes=notes,
                written=row["label"])
