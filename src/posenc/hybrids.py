"""The published layer patterns for ``ModelConfig(layer_pattern=...)``: the NoPE/RoPE hybrids,
and Gemma 3's local/global layers with a RoPE base per layer type.

Each function returns a cycle of :class:`~posenc.model_config.LayerSpec` (an encoding and a
mask kind) that the model repeats over its layers; :data:`HYBRIDS` names them. The cycle puts
the global layer last: layer i is global when ``(i + 1) % every == 0``, the rule of
transformers' Llama 4 (``no_rope_layers`` from ``no_rope_layer_interval``), SmolLM3
(``no_rope_layer_interval``), Cohere2 (``sliding_window_pattern``) and Gemma 3 (``layer_types``).

>>> from posenc import ModelConfig
>>> cfg = ModelConfig(n_layer=8, layer_pattern=llama4(chunk=8192))
>>> [k.attention for k in cfg.layer_kinds()][:4]
['chunked', 'chunked', 'chunked', 'global']
"""

from __future__ import annotations

from typing import Callable

from .config import check_int, check_positive
from .model_config import EncodingSpec, LayerSpec, naming

__all__ = ["HYBRIDS", "interleave", "llama4", "smollm3", "cohere2", "gemma3"]

Spec = EncodingSpec | str | dict | None


def _rope(param: str, spec: Spec, **config: float) -> EncodingSpec | None:
    """The spec given as ``param`` (a name, dict, spec or None), or ``EncodingSpec.of("rope",
    **config)``; a bad one is refused naming ``param``, not the ``encoding`` it becomes."""
    if config:
        try:
            return EncodingSpec.of("rope", **config)
        except (TypeError, ValueError) as e:
            raise naming(param, e) from None
    return EncodingSpec.coerce(spec, param)


def interleave(local: LayerSpec, global_: LayerSpec, every: int) -> tuple[LayerSpec, ...]:
    """``every - 1`` layers of ``local``, then one of ``global_``."""
    check_int("every", every, minimum=1)
    return (local,) * (every - 1) + (global_,)


def llama4(every: int = 4, chunk: int = 8192, rope: Spec = "rope", temperature: bool = True,
           floor_scale: int = 8192, attn_scale: float = 0.1) -> tuple[LayerSpec, ...]:
    """Llama 4's iRoPE (Meta 2025): RoPE layers with chunked attention (``attention_chunk_size``
    8192), every ``every``-th layer global NoPE with attention temperature tuning
    (``nope_temperature``; ``temperature=False``: plain NoPE, transformers'
    ``attn_temperature_tuning=False``)."""
    check_int("chunk", chunk, minimum=1)
    if not isinstance(temperature, bool):  # "no" would be truthy
        raise TypeError(f"temperature must be a bool, got {type(temperature).__name__} {temperature!r}")
    nope = EncodingSpec.of("nope_temperature", floor_scale=floor_scale, attn_scale=attn_scale) if temperature else None
    return interleave(LayerSpec(_rope("rope", rope), "chunked", chunk), LayerSpec(nope), every)


def smollm3(every: int = 4, rope: Spec = "rope") -> tuple[LayerSpec, ...]:
    """SmolLM3 (Hugging Face 2025): global attention everywhere, RoPE on three layers of four,
    NoPE on every ``every``-th (``no_rope_layer_interval``)."""
    return interleave(LayerSpec(_rope("rope", rope)), LayerSpec(None), every)


def cohere2(every: int = 4, window: int = 4096, rope: Spec = "rope") -> tuple[LayerSpec, ...]:
    """Cohere Command R7B / Command A (Cohere2): sliding-window RoPE layers (``sliding_window``
    4096), every ``every``-th layer global NoPE (``sliding_window_pattern``)."""
    check_int("window", window, minimum=1)
    return interleave(LayerSpec(_rope("rope", rope), "sliding", window), LayerSpec(None), every)


def gemma3(every: int = 6, window: int = 512, local_base: float = 1e4, global_base: float = 1e6) -> tuple[LayerSpec, ...]:
    """Gemma 3 (Gemma Team 2025): sliding-window layers with RoPE base 1e4 (``sliding_window``:
    512 in Gemma-3-270M, 1024 in the larger ones), every ``every``-th layer global with base 1e6
    (transformers' ``rope_parameters`` keyed by layer type). Not a NoPE hybrid: every layer
    rotates, and the two layer types differ in window and base."""
    check_int("window", window, minimum=1)
    check_positive("local_base", local_base)
    check_positive("global_base", global_base)
    return interleave(LayerSpec(_rope("local_base", None, base=local_base), "sliding", window),
                      LayerSpec(_rope("global_base", None, base=global_base)), every)


#: name -> pattern function; the NoPE/RoPE hybrids' global layers are NoPE, Gemma 3's rotate.
HYBRIDS: dict[str, Callable[..., tuple[LayerSpec, ...]]] = {"llama4": llama4, "smollm3": smollm3, "cohere2": cohere2,
                                                            "gemma3": gemma3}
