"""Hugging Face relative-position weights loaded into posenc encodings: BERT's relative_key /
relative_key_query and DeBERTa-v2's disentangled attention.

Each loader takes a source (a checkpoint folder with ``config.json`` and ``*.safetensors`` or
``pytorch_model.bin``, read by :func:`posenc.hf.checkpoint.read_checkpoint`, which refuses a bad
file with one line naming it; a loaded transformers model or any module whose ``state_dict`` holds the
weights, with its ``.config``; or a state dict with ``config=``) and returns one posenc
encoding module per attention layer, in layer order, holding that layer's weights:

* :func:`relative_from_bert`: BERT with ``position_embedding_type`` ``"relative_key"`` or
  ``"relative_key_query"`` (Huang et al. 2020). Each layer's ``distance_embedding.weight``
  ((2P - 1, D), P = ``max_position_embeddings``, row d + P - 1 for the query-minus-key
  distance d) becomes the ``weight`` of a posenc :class:`~posenc.relative.RelativeKey` /
  ``RelativeKeyQuery`` with ``clip = P - 1``: the same rows in the same order.
  transformers 5 dropped these types from ``BertModel`` (a v5 model ignores the weights), so
  the checkpoints are read as files or state dicts; a transformers-4 model works too.
* :func:`relative_from_deberta`: DeBERTa-v2/v3 (``model_type`` ``"deberta-v2"``) with
  ``relative_attention``. The encoder's ``rel_embeddings`` and its ``LayerNorm``
  (``norm_rel_ebd="layer_norm"``) are one table shared by every layer: the returned modules
  share those Parameter objects, as the checkpoint does. Each layer's ``pos_key_proj`` /
  ``pos_query_proj`` go to its own module; with ``share_att_key`` the table is projected by each
  layer's own ``key_proj`` / ``query_proj``, so one module serves every layer (the list holds
  the same object ``num_hidden_layers`` times).

Only the position weights are loaded: the q/k/v projections stay the caller's (the tests
compare the logits posenc gives with the checkpoint's own projections against transformers').
The modules are float32 (a bf16 checkpoint's weights are widened on load); ``.to()`` them as
needed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from ..encoding import PositionalEncoding
from ..registry import build
from .checkpoint import read_checkpoint

__all__ = ["relative_from_bert", "relative_from_deberta"]

_BERT_TYPES = {"relative_key": "relative_key", "relative_key_query": "relative_key_query"}
_BERT_KEY = re.compile(r"(?:^|\.)layer\.(\d+)\.attention\.self\.distance_embedding\.weight$")
_DEBERTA_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.attention\.self\.(pos_key_proj|pos_query_proj)\.(weight|bias)$")


def _config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        # transformers drops attributes its config class does not declare from to_dict() in some
        # versions; read position_embedding_type from the object itself as well
        out = dict(to_dict())
        for key in ("position_embedding_type",):
            if hasattr(config, key):
                out.setdefault(key, getattr(config, key))
        return out
    raise TypeError(f"config must be a dict (config.json) or a transformers PretrainedConfig, "
                    f"got {type(config).__name__}")


def _source(source: Any, config: Any, wanted: re.Pattern[str]) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(config dict, matching tensors) from a folder, a module or a state dict."""
    if isinstance(source, (str, Path)):
        if config is not None:
            raise TypeError("config must be None when source is a checkpoint folder (its config.json is read)")
        return read_checkpoint(source, wanted)
    if isinstance(source, nn.Module):
        config = getattr(source, "config", None) if config is None else config
        state = source.state_dict()
    elif isinstance(source, Mapping):
        state = dict(source)
    else:
        raise TypeError(f"source must be a checkpoint folder path, a torch module or a state dict, "
                        f"got {type(source).__name__}")
    if config is None:
        raise ValueError("config is needed with a state dict or a module without .config "
                         "(the model's config.json as a dict, or its PretrainedConfig)")
    return _config_dict(config), {k: v for k, v in state.items() if wanted.search(k)}


def _heads(config: dict[str, Any]) -> tuple[int, int]:
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    for key, value in (("hidden_size", hidden), ("num_attention_heads", heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"config[{key!r}] must be an int >= 1, got {value!r}")
    if hidden % heads:
        raise ValueError(f"config['hidden_size'] ({hidden}) must be divisible by num_attention_heads ({heads})")
    return hidden, heads


def _load(module: nn.Module, name: str, value: Tensor, where: str) -> None:
    target = getattr(module, name)
    if tuple(target.shape) != tuple(value.shape):
        raise ValueError(f"{where} must have shape {tuple(target.shape)} for this config, got {tuple(value.shape)}")
    with torch.no_grad():
        target.copy_(value)


def relative_from_bert(source: Any, *, config: Any = None) -> list[PositionalEncoding]:
    """One posenc ``relative_key`` / ``relative_key_query`` module per BERT layer, loaded with
    that layer's ``distance_embedding`` weights (see the module docstring).

    Args:
        source: a checkpoint folder, a module (its ``state_dict()`` and ``.config``) or a state
            dict; a single self-attention module (key ``distance_embedding.weight``) gives one.
        config: the config (dict or PretrainedConfig) when ``source`` has none.
    """
    wanted = re.compile(r"(?:^|\.)distance_embedding\.weight$")
    cfg, state = _source(source, config, wanted)
    kind = cfg.get("position_embedding_type", "absolute")
    if kind not in _BERT_TYPES:
        raise ValueError(f"position_embedding_type must be one of {', '.join(map(repr, _BERT_TYPES))} for "
                         f"relative_from_bert; got {kind!r} (nothing relative to load)")
    P = cfg.get("max_position_embeddings")
    if not isinstance(P, int) or isinstance(P, bool) or P < 2:
        raise ValueError(f"config['max_position_embeddings'] must be an int >= 2 (the table has 2P - 1 rows), "
                         f"got {P!r}")
    hidden, heads = _heads(cfg)
    layers: dict[int, tuple[str, Tensor]] = {}
    for key, value in state.items():
        match = _BERT_KEY.search(key)
        index = int(match.group(1)) if match else (0 if key == "distance_embedding.weight" else None)
        if index is None:
            continue
        if index in layers:
            raise ValueError(f"two distance_embedding weights for layer {index}: {layers[index][0]!r} and {key!r}")
        layers[index] = (key, value)
    if not layers:
        raise ValueError(f"no distance_embedding.weight in the source (position_embedding_type is {kind!r}); "
                         "is it a relative_key checkpoint?")
    if sorted(layers) != list(range(len(layers))):
        raise ValueError(f"distance_embedding weights found for layers {sorted(layers)}: expected 0..{len(layers) - 1}")
    out = []
    for index in sorted(layers):
        key, weight = layers[index]
        enc = build(_BERT_TYPES[kind], d_model=hidden, num_heads=heads, clip=P - 1)
        _load(enc, "weight", weight, key)
        out.append(enc)
    return out


def _int(cfg: dict[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    value = default if value is None else value
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"config[{key!r}] must be an int, got {type(value).__name__} {value!r}")
    return value


def _deberta_options(cfg: dict[str, Any]) -> dict[str, Any]:
    """posenc ``deberta`` config keywords from a DeBERTa-v2 config (transformers' defaults)."""
    if cfg.get("model_type") not in (None, "deberta-v2"):
        raise ValueError(f"model_type must be 'deberta-v2' for relative_from_deberta; got {cfg.get('model_type')!r}")
    if not cfg.get("relative_attention", False):
        raise ValueError("config['relative_attention'] must be true: without it DeBERTa-v2 has no relative "
                         "position weights to load")
    types = cfg.get("pos_att_type") or []
    if isinstance(types, str):  # "p2c|c2p", as DebertaV2Config normalizes it
        types = [t.strip() for t in types.lower().split("|")]
    unknown = sorted(set(types) - {"c2p", "p2c"})
    if unknown:
        raise ValueError(f"config['pos_att_type'] entries must be 'c2p' or 'p2c'; got {unknown}")
    max_rel = _int(cfg, "max_relative_positions", -1)
    if max_rel < 1:  # transformers: < 1 means max_position_embeddings
        max_rel = _int(cfg, "max_position_embeddings", 512)
    buckets = _int(cfg, "position_buckets", -1)
    norms = [t.strip() for t in str(cfg.get("norm_rel_ebd", "none")).lower().split("|")]
    return dict(
        c2p="c2p" in types, p2c="p2c" in types, max_relative_positions=max_rel,
        position_buckets=max(buckets, 0),  # transformers: <= 0 means no buckets
        share_att_key=bool(cfg.get("share_att_key", False)), layer_norm="layer_norm" in norms,
        layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-7)),
    )


def relative_from_deberta(source: Any, *, config: Any = None) -> list[PositionalEncoding]:
    """One posenc ``deberta`` module per DeBERTa-v2 layer, loaded with the encoder's
    ``rel_embeddings`` (+ ``LayerNorm``) and the layer's ``pos_key_proj`` / ``pos_query_proj``
    (see the module docstring). ``source`` and ``config`` as in :func:`relative_from_bert`."""
    wanted = re.compile(r"(?:^|\.)encoder\.(rel_embeddings\.weight|LayerNorm\.(weight|bias)|layer\.\d+\.attention"
                        r"\.self\.pos_(key|query)_proj\.(weight|bias))$")
    cfg, state = _source(source, config, wanted)
    options = _deberta_options(cfg)
    hidden, heads = _heads(cfg)
    n_layers = cfg.get("num_hidden_layers")
    if not isinstance(n_layers, int) or isinstance(n_layers, bool) or n_layers < 1:
        raise ValueError(f"config['num_hidden_layers'] must be an int >= 1, got {n_layers!r}")

    def find(suffix: str) -> tuple[str, Tensor]:
        hits = [(k, v) for k, v in state.items() if k.endswith("encoder." + suffix)]
        if len(hits) != 1:
            raise ValueError(f"expected one encoder.{suffix} in the source, found {len(hits)}"
                             + (f": {[k for k, _ in hits]}" if hits else ""))
        return hits[0]

    first = build("deberta", d_model=hidden, num_heads=heads, **options)
    _load(first, "rel_embeddings", *reversed(find("rel_embeddings.weight")))
    if first.norm is not None:
        for name in ("weight", "bias"):
            _load(first.norm, name, *reversed(find(f"LayerNorm.{name}")))
    if options["share_att_key"]:
        return [first] * n_layers  # projected by each layer's own key_proj/query_proj
    per_layer: dict[int, dict[str, Tensor]] = {}
    for key, value in state.items():
        match = _DEBERTA_LAYER.search(key)
        if match:
            per_layer.setdefault(int(match.group(1)), {})[f"{match.group(2)}.{match.group(3)}"] = value
    if sorted(per_layer) != list(range(n_layers)):
        raise ValueError(f"pos_key_proj/pos_query_proj weights found for layers {sorted(per_layer)}; "
                         f"expected 0..{n_layers - 1} (num_hidden_layers = {n_layers})")
    out = []
    for index in range(n_layers):
        enc = first if index == 0 else build("deberta", d_model=hidden, num_heads=heads, **options)
        if index:  # one table (and its LayerNorm) for every layer, as in the checkpoint
            enc.rel_embeddings = first.rel_embeddings
            enc.norm = first.norm
        for proj in ("pos_key_proj", "pos_query_proj"):
            module = getattr(enc, proj)
            if module is None:
                continue
            for name in ("weight", "bias"):
                key = f"{proj}.{name}"
                if key not in per_layer[index]:
                    raise ValueError(f"layer {index} has no attention.self.{key} in the source (pos_att_type "
                                     f"needs it)")
                _load(module, name, per_layer[index][key], f"encoder.layer.{index}.attention.self.{key}")
        out.append(enc)
    return out
