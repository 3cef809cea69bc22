"""transformers' SDPA attention with the key/value heads expanded first, for float32 on a GPU.

transformers 5.24 (``integrations/sdpa_attention.py``) hands grouped-query attention to
``scaled_dot_product_attention`` with ``enable_gqa=True`` whenever there is no mask
(``use_gqa_in_sdpa``), expecting the flash kernel. Flash takes 16-bit inputs only and the
memory-efficient kernel refuses ``enable_gqa`` (torch 2.11), so a float32 forward on CUDA lands on
the math kernel, which materialises the (B, H, T, T) scores: SmolLM2-135M at 32768 tokens asked
for 36 GiB on an H100 and ran out of memory (benchmarks/extension_gpu.sh, the first run). With
the key/value heads repeated up front (O(T) memory: SmolLM2's three key heads become nine) the
memory-efficient kernel takes float32 and the forward needs O(T) memory again; the same forward
then ran in 5 s.

:data:`ATTENTION_NAME` is registered with transformers' attention-function registry (its own
extension point) and is what :func:`posenc.hf.checkpoint.load_model` picks for a float32 model
on CUDA where transformers chose SDPA (:func:`attention_for`). It calls transformers' own
``sdpa_attention_forward`` (masks, causality, the static-cache slice, position bias: all
unchanged) on a view of the module that reports one query head per key head, so
``enable_gqa`` is never set.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["ATTENTION_NAME", "attention_for", "expanded_sdpa_forward", "register"]

ATTENTION_NAME = "posenc_sdpa_expanded"


def attention_for(device: str | torch.device, dtype: torch.dtype, chosen: str | None) -> str | None:
    """The attention implementation to switch a loaded model to, or None to keep ``chosen``
    (transformers' own choice): :data:`ATTENTION_NAME` for SDPA in float32 (or float64) on CUDA,
    where no fused kernel takes ``enable_gqa``."""
    if chosen != "sdpa" or torch.device(device).type != "cuda":
        return None
    return ATTENTION_NAME if dtype in (torch.float32, torch.float64) else None


def expanded_sdpa_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                          attention_mask: Tensor | None, **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' ``sdpa_attention_forward`` with key and value repeated to the query heads
    (query head h reads key head h // groups, transformers' ``repeat_kv``)."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    view = SimpleNamespace(num_key_value_groups=1, is_causal=getattr(module, "is_causal", True))
    return sdpa_attention_forward(view, query, key, value, attention_mask, **kwargs)


def register() -> None:
    """Register :data:`ATTENTION_NAME` with transformers (its attention and mask registries; the
    mask is SDPA's own). Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, expanded_sdpa_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
