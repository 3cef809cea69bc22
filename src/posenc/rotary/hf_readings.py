"""How each ``model_type``'s config.json describes its RoPE (transformers 5.23 semantics):
:data:`HF_READINGS`, one :class:`HFReading` per family, read by :func:`~posenc.rotary.from_hf`
and written by :func:`~posenc.rotary.to_hf`.

Which rope types exist and how transformers spells each (its ``rope_type``, keys, required
keys, top-level keys) is not listed here: it is each scaling's :class:`~posenc.rotary.HFSpec`
in :data:`~posenc.rotary.SCALINGS` (:func:`hf_entries`), so a newly registered scaling is read
and written too. Each family names its rotary settings differently:

==================  ===========================================  ==================  ===========
model_type          rotated channels r                           base                layout
==================  ===========================================  ==================  ===========
(none: generic)     head_dim * ``partial_rotary_factor`` (1.0)   ``rope_theta``      half
llama, mistral,     head_dim (``partial_rotary_factor`` must     ``rope_theta``      half
qwen2, qwen3,       be absent or 1: transformers rotates the
gemma, gemma2       whole head for these)
gemma3_text         head_dim, per layer type (``per_layer``)     ``rope_theta`` /    half
                                                                 ``rope_local_base_freq``
modernbert          head_dim, per layer type (``per_layer``)     ``global_rope_``    half
                                                                 ``theta`` / local
phi                 head_dim * ``partial_rotary_factor`` (0.5)   ``rope_theta``      half
stablelm            head_dim * ``partial_rotary_factor`` (0.25)  ``rope_theta``      half
phi3                head_dim * ``partial_rotary_factor`` (1.0)   ``rope_theta``      half
gpt_neox            head_dim * ``rotary_pct`` (0.25)             ``rotary_emb_base`` half
gptj                ``rotary_dim`` (no scalings)                 10000 (fixed)       interleaved
deepseek_v3         ``qk_rope_head_dim`` (the q_pe/k_pe part)    ``rope_theta``      ``rope_interleave``
smollm3             head_dim; NoPE layers: ``no_rope_layers``    ``rope_theta``      half
llama4_text         head_dim; NoPE layers: ``no_rope_layers``    ``rope_theta``      interleaved
cohere2             head_dim; NoPE layers: the full-attention    ``rope_theta``      interleaved
                    ones (RoPE on the sliding-window layers)
gemma4_text         head_dim, per layer type (nested              ``rope_theta``      half
                    ``rope_parameters``); the full layers'       per layer type
                    own ``global_head_dim`` (512) or
                    ``per_layer_config``
==================  ===========================================  ==================  ===========

(defaults in parentheses: transformers' values when the key is absent.) In every family
``rope_theta`` and the rotary fraction may also sit inside the rope dict (transformers 5
writes them there); given in both places with different values they are an error.

"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..config import check_int
from .scaling import SCALINGS
from .scaling.schema import Scaling

__all__ = ["HF_READINGS", "HFReading", "ORIGINAL", "hf_entries", "hf_rope_keys", "is_rope_key", "pick",
           "rotating_layers"]

_COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
#: The trained length's key, read from the top level or the rope dict.
ORIGINAL = "original_max_position_embeddings"


def hf_entries() -> dict[str, Scaling]:
    """transformers' rope_type -> the posenc scaling that reads it (every entry with an HFSpec)."""
    return {e.hf.rope_type: e for e in SCALINGS.values() if e.hf is not None}


def hf_rope_keys(rope_type: str) -> set[str]:
    """The keys a rope dict of transformers' ``rope_type`` may hold, from the scaling's entry:
    the common ones and the HF key of each parameter not read from the config's top level."""
    entry = hf_entries()[rope_type]
    return set(_COMMON) | {entry.hf.key(p) for p in entry.params if p not in entry.hf.top_level}


@dataclass(frozen=True)
class HFReading:
    """How one ``model_type``'s config.json describes its RoPE (transformers 5.23 semantics).

    Attributes:
        width_key: the top-level key that sets the rotated width: ``"partial_rotary_factor"``
            or ``"rotary_pct"`` (a fraction of head_dim), ``"rotary_dim"`` (channels),
            ``"qk_rope_head_dim"`` (the whole rope head); None: the whole head.
        width_default: the fraction when the key is absent (fraction keys only).
        base_key: the top-level key of the base; None: fixed at 10000 (GPT-J).
        layout: ``"half"``, ``"interleaved"``, or ``"rope_interleave"`` (read that bool key,
            default true: interleaved).
        rope_types: transformers' rope types the family supports; None: every registered
            scaling with an HF spelling; ("default",): no rope dict at all.
        aliases: legacy rope type names -> rope type.
        keys: other top-level rope keys the family reads.
        per_layer: ``(layer type, top-level theta key, default theta)`` for families whose
            Hub config.json gives one theta per layer type at the top level (Gemma 3, ModernBERT);
            transformers 5 nests them as ``rope_parameters[layer_type]``.
        scaled_layers: the layer types a flat ``rope_scaling`` applies to (per_layer families).
        rope_layers: which decoder layers rotate, for NoPE/RoPE hybrids: None, every layer;
            ``"no_rope_layers"``, the layers whose flag in that list is 1 (transformers' name,
            SmolLM3 and Llama 4: 0 marks a NoPE layer; absent, every
            ``no_rope_layer_interval``-th layer is NoPE); ``"sliding_attention"``, the layers
            of that type only (Cohere2: its full-attention layers are NoPE).
        layer_head_dim: layer type -> (top-level key, default) of that type's own head size
            (Gemma 4's full layers: ``global_head_dim``, 512); a ``per_layer_config`` (layer
            index -> overrides, as transformers 5 writes it) takes precedence.
    """

    width_key: str | None = None
    width_default: float = 1.0
    base_key: str | None = "rope_theta"
    layout: str = "half"
    rope_types: tuple[str, ...] | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    keys: frozenset[str] = frozenset()
    per_layer: tuple[tuple[str, str, float], ...] = ()
    scaled_layers: tuple[str, ...] = ()
    rope_layers: str | None = None
    layer_head_dim: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    def types(self) -> tuple[str, ...]:
        """transformers' rope types this family reads."""
        return tuple(hf_entries()) if self.rope_types is None else self.rope_types

    def understood(self) -> set[str]:
        """The top-level rope keys this reading uses."""
        out = {"partial_rotary_factor"} if self.width_key is None else {self.width_key}
        out |= {self.base_key} if self.base_key else set()
        out |= {"rope_interleave"} if self.layout == "rope_interleave" else set()
        if self.rope_types != ("default",):
            out |= {"rope_scaling", "rope_parameters"}
        return out | set(self.keys) | {key for _, key, _ in self.per_layer}


_FULL = HFReading()  # Llama-like: the whole head, rope_theta, half layout, every scaling
#: model_type -> its reading; None is the generic Llama-like reading of a dict without model_type.
HF_READINGS: dict[str | None, HFReading] = {
    None: HFReading(width_key="partial_rotary_factor"),
    "llama": _FULL,
    "mistral": _FULL,
    "qwen2": _FULL,
    "qwen3": _FULL,
    "gemma": _FULL,
    "gemma2": _FULL,
    "gpt_oss": _FULL,  # GptOssConfig: head_dim 64, rotate-half over the halves (_apply_rotary_emb), YaRN
    # Gemma3TextConfig.default_theta; on the Hub rope_scaling applies to the global layers only.
    "gemma3_text": HFReading(per_layer=(("full_attention", "rope_theta", 1_000_000.0),
                                        ("sliding_attention", "rope_local_base_freq", 10_000.0)),
                             scaled_layers=("full_attention",)),
    # ModernBertConfig.default_theta and convert_rope_params_to_dict: rope_scaling applies to both.
    "modernbert": HFReading(per_layer=(("full_attention", "global_rope_theta", 160_000.0),
                                       ("sliding_attention", "local_rope_theta", 10_000.0)),
                            scaled_layers=("full_attention", "sliding_attention")),
    "phi": HFReading(width_key="partial_rotary_factor", width_default=0.5),
    "stablelm": HFReading(width_key="partial_rotary_factor", width_default=0.25),
    "phi3": HFReading(width_key="partial_rotary_factor", rope_types=("default", "longrope"),
                      aliases={"su": "longrope", "yarn": "longrope"},
                      keys=frozenset({"original_max_position_embeddings"})),
    "gpt_neox": HFReading(width_key="rotary_pct", width_default=0.25, base_key="rotary_emb_base"),
    "gptj": HFReading(width_key="rotary_dim", base_key=None, layout="interleaved", rope_types=("default",)),
    "deepseek_v3": HFReading(width_key="qk_rope_head_dim", layout="rope_interleave"),
    # NoPE/RoPE hybrids. SmolLM3 (Hugging Face 2025): every 4th layer NoPE. Llama 4 (Meta 2025,
    # iRoPE): every 4th layer NoPE, the others in chunked attention; its rotation multiplies
    # complex pairs (2i, 2i+1). Cohere2 (Command R7B): RoPE on the sliding-window layers only,
    # rotate_half over pairs (2i, 2i+1).
    "smollm3": HFReading(keys=frozenset({"no_rope_layers", "no_rope_layer_interval"}), rope_layers="no_rope_layers"),
    "llama4_text": HFReading(layout="interleaved", keys=frozenset({"no_rope_layers", "no_rope_layer_interval"}),
                             rope_layers="no_rope_layers"),
    "cohere2": HFReading(layout="interleaved", rope_layers="sliding_attention"),
    # Gemma 4: rope_parameters keyed by layer type (sliding: default 10000; full: proportional,
    # p = 0.25, base 1e6), and the full layers' own head size (Gemma4TextConfig.global_head_dim).
    "gemma4_text": HFReading(layer_head_dim={"full_attention": ("global_head_dim", 512)}),
}
# Top-level keys some family reads for its RoPE: in a family that does not read them they
# are an error, like any key whose name mentions rope or rotary.
_ROPE_KEYS = {ORIGINAL} | set().union(*(r.understood() for r in HF_READINGS.values()))
_ABSENT = object()  # "not given", as opposed to an explicit null


def is_rope_key(key: str) -> bool:
    """Whether a top-level key is about RoPE (its name says so, or some family reads it)."""
    low = key.lower()
    return "rope" in low or "rotary" in low or key in _ROPE_KEYS


def pick(config: dict, top: str, params: dict, inner: str, where: str, default: Any = _ABSENT) -> tuple[Any, str]:
    """(value, the name it was given under) of a setting given at the top level (``top``)
    and/or in the rope dict (``inner``); both given and different is an error."""
    a, b = config.get(top, _ABSENT), params.get(inner, _ABSENT)
    if a is None and b is not _ABSENT:  # an explicit null beside a value: the value
        a = _ABSENT
    if a is not _ABSENT and b is not _ABSENT and a != b:
        raise ValueError(f"{top}={a!r} and {where}[{inner!r}]={b!r} disagree; give one")
    if b is not _ABSENT:
        return b, f"{where}[{inner!r}]"
    if a is not _ABSENT:
        return a, top
    if default is _ABSENT:
        raise ValueError(f"config needs {top!r} (or {where}[{inner!r}])")
    return default, top


def rotating_layers(config: dict, reading: HFReading, model_type: str | None, n: int) -> list[bool]:
    """Whether each of the n decoder layers applies RoPE, as the family's attention decides."""
    if reading.rope_layers == "no_rope_layers":
        flags = config.get("no_rope_layers")
        if flags is None:  # SmolLM3Config / Llama4TextConfig: every interval-th layer is NoPE
            interval = config.get("no_rope_layer_interval", 4)
            check_int("no_rope_layer_interval", interval, minimum=1)
            return [(i + 1) % interval != 0 for i in range(n)]
        if not isinstance(flags, (list, tuple)) or len(flags) != n or any(f not in (0, 1) for f in flags):
            raise ValueError(f"no_rope_layers must list one flag per layer (1: RoPE, 0: NoPE; num_hidden_layers "
                             f"= {n}), got {flags!r}")
        return [bool(f) for f in flags]
    if reading.rope_layers is not None:  # Cohere2: RoPE iff the layer has a sliding window
        types = config.get("layer_types")
        if not isinstance(types, (list, tuple)) or len(types) != n:
            raise ValueError(f"layer_types must list one layer type per layer for model_type {model_type!r} "
                             f"(num_hidden_layers = {n}), got {types!r}")
        windowed = config.get("sliding_window") is not None
        return [windowed and t == reading.rope_layers for t in types]
    return [True] * n
