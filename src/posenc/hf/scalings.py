"""The rows a checkpoint is evaluated with beyond its trained length L: the model as loaded
(``base``), each training-free RoPE scaling of the registry (``list_scalings(extends=True)``)
with the parameters of its own ``extension`` rule for ``factor = length / L``, and the model's
own RoPE with its base multiplied by a factor (:data:`RAISED_BASE`: the same at every length,
the way a practitioner raises ``rope_theta`` without a rule), and each training-free attention
method of :data:`posenc.methods.METHODS` (Self-Extend, ReRoPE, Dual Chunk Attention) at the
settings its paper recommends for L and the length (``recommended``), on the model types whose
attention it can stand in for (:data:`posenc.hf.methods.METHOD_MODEL_TYPES`).

:func:`variant_patched` switches a row in place (:func:`posenc.hf.patch.patch_model`) and back
(``unpatch_model``): one loaded model serves every row, no reload.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from torch import nn

from ..methods import METHODS
from ..rotary.scaling import SCALINGS, list_scalings
from .patch import patch_model, unpatch_model

__all__ = ["MODEL_METHODS", "MODEL_SCALINGS", "RAISED_BASE", "method_params_at", "scaling_params", "variant_label",
           "variant_patched"]

#: training-free scalings evaluated beyond L: the registry's types with an ``extension`` rule
#: (Llama 3's included; LongRoPE has none: its factors are searched per model).
MODEL_SCALINGS = tuple(list_scalings(extends=True))
#: training-free attention methods evaluated beyond L (rows named by the method)
MODEL_METHODS = tuple(METHODS)
#: the variant that multiplies the checkpoint's own RoPE base by ``raised_base`` (no rule, no factor)
RAISED_BASE = "raised_base"


def scaling_params(variant: str, factor: float, L: int) -> dict[str, Any]:
    """The parameters that evaluate a model trained at ``L`` at ``factor * L`` with ``variant``
    (the scaling's own rule in the registry, :meth:`~posenc.rotary.scaling.schema.Scaling.at_factor`)."""
    return SCALINGS[variant].at_factor(float(factor), int(L))


def method_params_at(method: str, factor: float, L: int) -> dict[str, Any]:
    """The parameters of attention method ``method`` for a model trained at ``L`` read at
    ``factor * L`` tokens: the method's ``recommended`` rule."""
    return dict(METHODS[method].recommended(int(L), round(float(factor) * int(L))))


@contextlib.contextmanager
def variant_patched(model: nn.Module, variant: str, factor: float, L: int, raised_base: float = 0.0) -> Iterator[None]:
    """The model with RoPE scaling ``variant`` patched in for the duration (base: as loaded;
    :data:`RAISED_BASE`: the model's own RoPE with its base times ``raised_base``).

    GPT-J's own sin/cos table ends at ``n_positions`` (transformers indexes past it at 2L), so
    its base is posenc's RoPE with the model's own frequencies and no scaling (``default``),
    which equals the loaded model's logits up to float32 rounding (tests/test_hf_patch.py)."""
    if variant == "base" and getattr(model.config, "model_type", None) != "gptj":
        yield
        return
    if variant == "base":
        patch_model(model, scaling="default")
    elif variant in METHODS:
        patch_model(model, method=variant, **method_params_at(variant, factor, L))
    elif variant == RAISED_BASE:
        from ..rotary import from_hf

        patch_model(model, base=from_hf(model.config).config.base * raised_base)
    else:
        patch_model(model, scaling=variant, **scaling_params(variant, factor, L))
    try:
        yield
    finally:
        unpatch_model(model)


def variant_label(settings: dict[str, Any], variant: str) -> str:
    """A scaled row's name (``YaRN``, ``base x16``) from results.json's settings."""
    if variant == RAISED_BASE:
        return f"base x{settings['raised_base']:g}"
    if variant in METHODS:
        return METHODS[variant].label
    return SCALINGS[variant].label
