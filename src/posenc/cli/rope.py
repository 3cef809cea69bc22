"""``posenc rope FILE``: the RoPE each inference engine computes from a model file, and where
the engines disagree.

FILE is a config.json, a checkpoint folder holding one, or a .gguf. Each engine's reading is
re-derived from its source (:mod:`posenc.engines`; none needs to be installed): transformers
(the reference), vLLM, SGLang, llama.cpp (a config.json is first read as llama.cpp's converter
would write it into a GGUF; a .gguf is read as llama.cpp's runtime reads it) and mlx-lm.

Examples::

    posenc rope config.json                 # one table row per engine and layer type, then the disagreements
    posenc rope ./Qwen2.5-7B-Instruct --length 131072
    posenc rope SmolLM2.gguf --json out.json   # every inverse frequency, per engine, as JSON
    posenc rope SmolLM2.gguf --length 16384 --model   # and what each disagreement does to its own logits

With ``--model`` (FILE a checkpoint folder or a .gguf: the weights are loaded, float32 on the
CPU), each engine's reading is also measured on the model's own attention: the probe's real
pre-rotation q and k of its first, middle and last layers on 256 tokens of text, every pair of
a sample of (query, key) tokens at distances up to N, the largest and mean change of the logits
against transformers' reading (:mod:`posenc.hf.rope_effect`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from ..engines import ENGINES, EngineRope, Unsupported, engine_names
from ..engines.compare import Reading, disagreements, read_all
from .args import add_json_option, emit_json, int_at_least

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("rope", help="the RoPE each engine (transformers, vLLM, SGLang, llama.cpp, mlx-lm) "
                                           "computes from a config.json, checkpoint folder or .gguf",
                              description=__doc__)
    p.add_argument("file", type=Path, metavar="FILE", help="a config.json, a folder holding one, or a .gguf")
    p.add_argument("--length", type=int_at_least(2), default=None, metavar="N",
                   help="compare the engines at N tokens (default: the file's max_position_embeddings)")
    p.add_argument("--engines", nargs="+", default=None, metavar="NAME",
                   help=f"only these engines (transformers is always read: the reference); any of "
                        f"{', '.join(engine_names())}")
    p.add_argument("--model", action="store_true",
                   help="FILE's weights too (a checkpoint folder or .gguf): measure what each engine's reading "
                        "does to the model's own attention logits, on its real q and k")
    add_json_option(p, "every engine's reading (full inverse-frequency vectors) and the disagreements")
    p.set_defaults(func=run)


def read_file(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(config, gguf_metadata)`` of FILE: the parsed config.json (for a .gguf, the config
    transformers reads from its metadata) and, for a .gguf, its metadata (llama.cpp's input)."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path}: a folder without config.json; give a config.json, a checkpoint folder or a .gguf")
        path = path / "config.json"
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if path.suffix == ".gguf":
        from ..engines.gguf_meta import read_gguf_metadata

        metadata = read_gguf_metadata(path)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
        return config, metadata
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a JSON config ({e}); give a config.json, a checkpoint folder or a .gguf") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a config.json must hold a JSON object, got {type(config).__name__}")
    return config, None


def _readings(config: dict[str, Any], metadata: dict[str, Any] | None, engines: list[str] | None) -> dict[str, Reading]:
    names = None if engines is None else ["transformers"] + [e for e in engines if e != "transformers"]
    unknown = [e for e in names or [] if e not in ENGINES]
    if unknown:
        raise ValueError(f"--engines: unknown {', '.join(unknown)}; known: {', '.join(engine_names())}")
    readings = read_all(config, names)
    if metadata is not None and "llama.cpp" in readings:  # llama.cpp reads the file itself, not a config
        from ..engines.llamacpp import rope_from_gguf_metadata

        try:
            readings["llama.cpp"] = rope_from_gguf_metadata(metadata)
        except Unsupported as e:
            readings["llama.cpp"] = e
    return readings


def _effects(file: Path, readings: dict[str, Reading], length: int) -> list:
    """:func:`posenc.hf.rope_effect.logit_effects` on FILE's own weights (refused for a bare config.json)."""
    if file.suffix == ".json" or (file.is_dir() and not any(file.glob("*.safetensors"))):
        raise ValueError(f"--model: {file} holds no weights; give the checkpoint folder or the .gguf")
    from ..hf.rope_effect import capture_model_qk, logit_effects

    qk, scales = capture_model_qk(str(file), None, 256)
    return logit_effects(qk, scales, readings, length)


def _original(config: dict[str, Any]) -> int | None:
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    value = config.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
    return value or config.get("max_position_embeddings")


def _row(engine: str, r: EngineRope, length: int) -> list[str]:
    inv, _ = r.frequencies()
    long_inv, _ = r.frequencies(length)
    past = {"static": "static", "dynamic": f"dynamic (at {length}: slowest x{float(long_inv[-1] / inv[-1]):.3g})",
            "switch": f"switch past {r.switch_at}"}[r.beyond]
    layers = "all" if r.layers is None else f"{len(r.layers)} ({r.layer_type or 'rope'})"
    return [engine, layers, str(r.rotary_dim), r.layout, f"{float(inv[0]):.4g} .. {float(inv[-1]):.4g}",
            f"{r.logit_scale():.6g}", past]


def _table(rows: list[list[str]]) -> str:
    head = ["engine", "layers", "rotary", "layout", "inv_freq (fastest .. slowest)", "logit scale", "past the original length"]
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(f"{c:<{w}}" for c, w in zip(line, widths)).rstrip() for line in [head, *rows])


def _to_json(readings: dict[str, Reading], found: list, length: int) -> dict[str, Any]:
    def rope_json(r: EngineRope) -> dict[str, Any]:
        inv, factor = r.frequencies(length)
        return {"layer_type": r.layer_type, "layers": list(r.layers) if r.layers else None, "rotary_dim": r.rotary_dim,
                "layout": r.layout, "inv_freq": r.inv_freq.tolist(), "attention_factor": r.attention_factor,
                "softmax_scale": r.softmax_scale, "beyond": r.beyond, "switch_at": r.switch_at,
                f"inv_freq_at_{length}": inv.tolist(), f"attention_factor_at_{length}": factor,
                "notes": list(r.notes), "source": r.source}

    engines = {e: ({"refuses": str(v)} if isinstance(v, Unsupported) else [rope_json(r) for r in v])
               for e, v in readings.items()}
    return {"length": length, "engines": engines,
            "disagreements": [{"engine": d.engine, "layer_type": d.layer_type, "kind": d.kind, "line": d.line,
                               "phase": d.phase, "scale": d.scale} for d in found]}


def run(args: argparse.Namespace) -> int:
    config, metadata = read_file(args.file)
    readings = _readings(config, metadata, args.engines)
    length = args.length or config.get("max_position_embeddings")
    if not isinstance(length, int) or length < 2:
        raise ValueError(f"{args.file}: no max_position_embeddings to compare at; give --length N")
    found = disagreements(readings, length)
    effects = _effects(args.file, readings, length) if args.model else None
    data = _to_json(readings, found, length)
    if effects is not None:
        data["model_effect"] = [e.to_json() for e in effects]
    if emit_json(args.json, data):
        return 0
    kind = config.get("model_type", "?")
    print(f"{args.file}: model_type {kind}, original length {_original(config)}; engines compared at {length} tokens")
    rows = []
    refusals = []
    for engine, reading in readings.items():
        if isinstance(reading, Unsupported):
            refusals.append(f"  {engine}: {reading}")
            continue
        rows.extend(_row(engine, r, length) for r in reading)
    print(_table(rows))
    if refusals:
        print("cannot run this file as written:")
        print("\n".join(refusals))
    notes = [(e, n) for e, v in readings.items() if not isinstance(v, Unsupported) for r in v for n in r.notes]
    if notes:
        print("notes:")
        for e, n in dict.fromkeys(notes):
            print(f"  {e}: {n}")
    where = [d for d in found if d.kind != "refuses"]
    print(f"where the engines disagree with transformers ({len(where)}):" if where else
          "every engine that runs this file computes transformers' RoPE (frequencies within "
          "1e-6 relative, the same logit scale, the same behaviour past the original length)")
    for d in where:
        layer = f" [{d.layer_type}]" if d.layer_type else ""
        print(f"  {d.engine}{layer}: {d.line}")
    if effects is not None:
        print(f"on the model's own q and k (first, middle and last layer; real text; distances up to {length - 1}), "
              "the logits of each engine against transformers':")
        for e in effects:
            if e.max_abs == 0.0:
                print(f"  {e.engine}: the same logits")
                continue
            print(f"  {e.engine}: largest change {e.max_abs:.3g} (at distance {e.worst_distance}), mean "
                  f"{e.mean_abs:.3g}; transformers' logits average {e.reference_mean_abs:.3g} in size")
    sources = {e: ENGINES[e].version for e in readings}
    print("rules derived from: " + ", ".join(f"{e} {v}" for e, v in sources.items()))
    return 0 if all(math.isfinite(r.logit_scale()) for v in readings.values() if isinstance(v, list) for r in v) else 1
