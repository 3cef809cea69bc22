"""transformers' reading of a config.json: the reference the other engines are compared with.

It is posenc's own :func:`~posenc.rotary.layer_ropes`, which equals transformers 5.23's
``ROPE_INIT_FUNCTIONS`` and ``dynamic_rope_update`` per family (tested against transformers
itself in tests/test_rotary_hf_config.py), plus the one RoPE effect transformers keeps in the
attention rather than the rotary module: DeepSeek-V2/V3's softmax-scale correction
``yarn_get_mscale(factor, mscale_all_dim) ** 2`` (``DeepseekV3Attention.__init__``,
transformers 5.23 ``models/deepseek_v3/modeling_deepseek_v3.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..rotary.hf_config import layer_ropes
from ..rotary.rope import RotaryEmbedding
from ..rotary.scaling.yarn import yarn_mscale
from .base import EngineRope, register_engine

__all__ = ["deepseek_softmax_scale", "transformers_rope"]

SOURCE = "transformers 5.23: modeling_rope_utils.py (ROPE_INIT_FUNCTIONS, dynamic_rope_update)"


def deepseek_softmax_scale(config: Mapping[str, Any]) -> float:
    """The factor DeepSeek-V2/V3 multiply the softmax scale by: ``mscale(factor, mscale_all_dim)^2``
    when the rope dict is YaRN with a non-zero ``mscale_all_dim``, else 1."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type"))
    if kind != "yarn" or not rope.get("mscale_all_dim"):
        return 1.0
    m = yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"]))
    return m * m


def _groups(config: Mapping[str, Any]) -> tuple[list[tuple[RotaryEmbedding, tuple[int, ...]]], int]:
    """The distinct RoPEs of a config and the layers using each, in first-use order, and the
    number of decoder layers (NoPE ones included)."""
    groups: dict[int, tuple[RotaryEmbedding, list[int]]] = {}
    ropes = layer_ropes(dict(config))
    for i, rope in enumerate(ropes):
        if rope is not None:
            groups.setdefault(id(rope), (rope, []))[1].append(i)
    return [(rope, tuple(layers)) for rope, layers in groups.values()], len(ropes)


def ropes_of(config: Mapping[str, Any], engine: str, source: str, softmax_scale: float = 1.0,
             notes: tuple[str, ...] = ()) -> list[EngineRope]:
    """One :class:`EngineRope` per distinct posenc RoPE of ``config`` (what transformers
    builds), labelled as ``engine``'s: for the engines whose reading equals transformers' for
    a given file, with their own notes."""
    groups, n_layers = _groups(config)
    types = config.get("layer_types")
    out = []
    for rope, layers in groups:
        dynamic = getattr(rope._scaling_cfg, "length_dependent", False)
        kind = rope.config.scaling
        beyond = ("switch" if kind == "longrope" else "dynamic") if dynamic else "static"
        original = getattr(rope.config, "original_max_position_embeddings", None)
        layer_type = types[layers[0]] if isinstance(types, (list, tuple)) and len(groups) > 1 else None
        out.append(EngineRope(
            engine=engine, inv_freq=rope.inv_freq, attention_factor=rope.attention_factor,
            softmax_scale=softmax_scale, rotary_dim=rope.rotary_dim, layout=rope.config.layout, beyond=beyond,
            switch_at=original if beyond == "switch" else None, at_length=rope.frequencies if dynamic else None,
            layer_type=layer_type, layers=None if len(layers) == n_layers and len(groups) == 1 else layers,
            notes=notes, source=source))
    return out


@register_engine("transformers", version="5.23", summary="the reference: what from_pretrained builds")
def transformers_rope(config: Mapping[str, Any]) -> list[EngineRope]:
    """transformers' RoPE for each rotating layer type of ``config`` (a parsed config.json)."""
    return ropes_of(config, "transformers", SOURCE, deepseek_softmax_scale(config))
