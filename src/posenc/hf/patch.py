"""Run a loaded transformers causal LM with posenc's RoPE: :func:`patch_model` / :func:`unpatch_model`.

What changes. A transformers model makes RoPE in two steps (transformers 5.23): one module
turns the model's own ``position_ids`` (B, T) into cos/sin, and each attention layer applies
them to its q and k. ``patch_model`` replaces the first step with posenc: the frequencies,
their scaling, the angles (float64) and the cos/sin tables (float32, cast to the model dtype
last, as transformers casts its own) come from a :class:`~posenc.rotary.RotaryEmbedding`.
The second step stays transformers' own code, so every attention backend (eager, SDPA,
flash), the KV cache and ``generate`` run unchanged, and the positions are the ones the model
computes itself: packed documents (``position_ids`` restarting at 0), left padding
(``generate`` derives ``position_ids`` from ``attention_mask``) and cached decoding steps.

Where each family makes cos/sin:

==================================================  =============================================
model_type                                          what is replaced
==================================================  =============================================
llama, mistral, qwen2, qwen3, gemma, gemma2, phi,  the base model's ``rotary_emb`` module (one,
phi3, stablelm, gpt_neox                            shared by every layer): swapped for
                                                    :class:`PosencRotary`; the original is kept
                                                    inside it, so unpatching puts the very same
                                                    object back
gptj                                                no shared module: each ``GPTJAttention``
                                                    gathers sin/cos rows from its own
                                                    ``embed_positions`` table (fixed length,
                                                    base 10000); patched, each layer's table
                                                    lookup reads a posenc table instead (an
                                                    instance attribute shadowing the method)
==================================================  =============================================

Dynamic NTK: posenc's is a pure function of the current length (largest position id + 1);
transformers' module remembers the longest length it has seen and keeps that scaling for
later, shorter calls (until one is shorter than the trained length). The two agree on any
sequence of calls whose length does not shrink, e.g. one ``generate``.

The model's weights, buffers and ``state_dict`` are untouched: ``save_pretrained`` on a
patched model writes the same checkpoint.

>>> model = AutoModelForCausalLM.from_pretrained("path/to/checkpoint")
>>> patch_model(model)                                  # the model's own RoPE, from posenc
>>> patch_model(model, scaling="yarn", factor=4.0)      # evaluate at 4x the trained length
>>> patch_model(model, base=500000.0)                   # or another base, no reload
>>> unpatch_model(model)                                # back to transformers' own
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..rotary import RotaryConfig, RotaryEmbedding, from_hf
from ..rotary.scaling import SCALINGS
from .checkpoint import trained_length

__all__ = ["PosencRotary", "SUPPORTED_MODEL_TYPES", "patch_model", "patched_rope", "unpatch_model"]

#: model types whose base model holds one shared ``rotary_emb`` module.
_SHARED_MODULE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "phi3", "stablelm", "gpt_neox")
#: every model type :func:`patch_model` accepts.
SUPPORTED_MODEL_TYPES = (*_SHARED_MODULE, "gptj")
_GPTJ_HOLDER = "posenc_rotary"  # GPT-J: the attribute of the base model holding the PosencRotary


class PosencRotary(nn.Module):
    """Stands in for a transformers ``*RotaryEmbedding`` module: ``forward(x, position_ids)``
    returns ``(cos, sin)``, each (B or 1, T, r) in ``x``'s dtype, in transformers' half
    layout (the r/2 angles repeated, as ``torch.cat((freqs, freqs), -1)``), the scaling's
    attention factor included, computed by posenc's :meth:`RotaryEmbedding.cos_sin`.

    Attributes:
        rope: the posenc RoPE (no parameters or buffers: its frequencies are float64
            Python-side tensors, so ``model.half()`` cannot round them).
        original: the module it replaced (None for GPT-J, which has none); a registered
            child, so ``model.to(...)`` moves it as it would have.
    """

    def __init__(self, rope: RotaryEmbedding, original: nn.Module | None) -> None:
        super().__init__()
        self.rope = rope
        self.original = original

    def half_layout(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin (B|1, T, r) float32 in transformers' half layout."""
        cos, sin = self.rope.cos_sin(position_ids)  # (B|1, T, r/2) float32, max position + 1 as the length
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.half_layout(position_ids)
        return cos.to(x.dtype), sin.to(x.dtype)  # as transformers' own module returns them

    def gptj_table(self, position_ids: Tensor) -> Tensor:
        """What ``GPTJAttention._get_embed_positions`` returns, from posenc: (B, P, r) float32,
        row p = [sin(p theta) | cos(p theta)] (r/2 each, GPT-J's interleaved pairs), for
        P = max position + 1 (so a position past GPT-J's ``n_positions`` works, and
        length-dependent scalings see the current length, as in the shared-module families)."""
        P = int(position_ids.max()) + 1 if position_ids.numel() else 1
        pos = torch.arange(P, device=position_ids.device)[None]  # (1, P)
        cos, sin = self.rope.cos_sin(pos, seq_len=P)  # (1, P, r/2)
        return torch.cat((sin, cos), dim=-1).expand(position_ids.shape[0], -1, -1)  # (B, P, r)


def _transformers_model(model: Any) -> nn.Module:
    try:
        from transformers import PreTrainedModel
    except ImportError as e:  # posenc[hf] is an optional extra
        raise ImportError("posenc.hf needs transformers: pip install 'posenc[hf]'") from e
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel (e.g. from AutoModelForCausalLM"
                        f".from_pretrained), got {type(model).__name__}")
    return model


def _check_model_type(model: nn.Module) -> str:
    model_type = getattr(model.config, "model_type", None)
    if model_type in SUPPORTED_MODEL_TYPES:
        return model_type
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    has_rope = any(type(m).__name__.endswith("RotaryEmbedding") for m in model.modules()) or any(
        "rope" in k or "rotary" in k for k, v in model.config.to_dict().items() if v not in (None, False, {})
    )
    if not has_rope:
        raise ValueError(f"model_type {model_type!r} has no rotary embeddings (no RoPE module or rope setting "
                         f"in its config), so there is nothing to patch; patch_model supports: {supported}")
    raise ValueError(f"model_type must be one of {supported} for patch_model; got {model_type!r}")


def _gptj_attentions(model: nn.Module) -> list[nn.Module]:
    from transformers.models.gptj.modeling_gptj import GPTJAttention

    found = [m for m in model.modules() if isinstance(m, GPTJAttention)]
    if not found:
        raise ValueError("model_type 'gptj' but the model has no GPTJAttention module to patch")
    return found


def _resolve(model: nn.Module, rope: Any, overrides: dict[str, Any]) -> RotaryEmbedding:
    """The RotaryEmbedding to patch in, checked against the checkpoint's geometry."""
    native = from_hf(model.config)
    if rope is None:
        rope = native
    elif type(rope) is not RotaryEmbedding:  # a subclass (xPos) scales q and k apart: not a cos/sin pair
        raise TypeError(f"rope must be a posenc RotaryEmbedding (from posenc.rotary.from_hf or "
                        f"posenc.build('rope', ...)) or None, got {type(rope).__name__}")
    if overrides:
        cfg = rope.config
        fields = {"base": cfg.base, "rotary_dim": cfg.rotary_dim, "layout": cfg.layout, "scaling": cfg.scaling,
                  "kernel": cfg.kernel}
        # a new rope type starts from its own defaults (as set_scaling does); else keep the parameters
        params = {} if "scaling" in overrides else dict(cfg.scaling_params())
        params |= overrides
        name = params.get("scaling", cfg.scaling)
        takes_length = name in SCALINGS and "original_max_position_embeddings" in SCALINGS[name].params
        if takes_length and params.get("original_max_position_embeddings") is None:
            # the one parameter every length-based type needs: the checkpoint knows it
            params["original_max_position_embeddings"] = trained_length(model.config)
        # RotaryConfig checks every value and refuses unknown keywords, listing the valid ones
        rope = RotaryEmbedding(RotaryConfig(**(fields | params)), rope.dims)
    # The head size first: a rope built for another head size has another rotary_dim too, and
    # the head size is the cause.
    want = {"head_dim": native.dims.head_dim, "rotary_dim": native.rotary_dim, "layout": native.config.layout}
    got = {"head_dim": rope.dims.head_dim, "rotary_dim": rope.rotary_dim, "layout": rope.config.layout}
    for key in want:
        if got[key] != want[key]:
            hint = " (build it for the checkpoint's heads, e.g. posenc.rotary.from_hf(model.config))" \
                if key == "head_dim" else ""
            raise ValueError(f"rope.{key} must be {want[key]!r}, the checkpoint's (model_type "
                             f"{model.config.model_type!r}); got {got[key]!r}{hint}")
    return rope


def patch_model(model: Any, rope: RotaryEmbedding | None = None, **scaling: Any) -> RotaryEmbedding:
    """Make a transformers model rotate with posenc's RoPE; returns the RotaryEmbedding in use.

    Args:
        model: a loaded transformers model of a type in :data:`SUPPORTED_MODEL_TYPES` (the
            causal LM or its base model). Changed in place.
        rope: the RoPE to use; None reads the model's own config with
            :func:`posenc.rotary.from_hf` (same frequencies, same logits to float32 error).
            Its ``rotary_dim``, ``layout`` and head_dim must be the checkpoint's.
        **scaling: changes to ``rope``'s :class:`~posenc.rotary.RotaryConfig`: ``base=...``,
            or a rope type and its parameters, ``scaling="yarn", factor=4.0``. A new ``scaling``
            starts from that type's defaults, and ``original_max_position_embeddings``
            defaults to the checkpoint's trained length
            (:func:`posenc.hf.checkpoint.trained_length`). Bad values are errors from
            :class:`~posenc.rotary.RotaryConfig` naming the parameter.

    Calling it again on a patched model replaces the RoPE (the original module stays kept for
    :func:`unpatch_model`). On any error the model is left as it was.
    """
    model = _transformers_model(model)
    model_type = _check_model_type(model)
    new = _resolve(model, rope, scaling)
    base = model.base_model
    if model_type == "gptj":
        holder = getattr(base, _GPTJ_HOLDER, None)
        attentions = _gptj_attentions(model)
        if holder is None:
            holder = PosencRotary(new, None)
            setattr(base, _GPTJ_HOLDER, holder)
            for attn in attentions:
                # an instance attribute shadows the class method; unpatch deletes it
                attn._get_embed_positions = holder.gptj_table
        holder.rope = new
        return new
    current = getattr(base, "rotary_emb", None)
    if not isinstance(current, nn.Module):
        raise ValueError(f"model_type {model_type!r} but {type(base).__name__} has no rotary_emb module "
                         "(a transformers version this patch does not know?)")
    if isinstance(current, PosencRotary):
        current.rope = new
    else:
        base.rotary_emb = PosencRotary(new, current)
    return new


def patched_rope(model: Any) -> RotaryEmbedding | None:
    """The posenc RoPE a patched model uses, or None when it is not patched."""
    base = _transformers_model(model).base_model
    holder = getattr(base, "rotary_emb", None)
    if not isinstance(holder, PosencRotary):
        holder = getattr(base, _GPTJ_HOLDER, None)
    return holder.rope if isinstance(holder, PosencRotary) else None


def unpatch_model(model: Any) -> bool:
    """Undo :func:`patch_model`: put back the exact module (or GPT-J's own table lookup) it
    replaced, so the model computes bit for bit what it did before. Returns True when it
    restored something, False when the model was not patched (nothing to do)."""
    base = _transformers_model(model).base_model
    current = getattr(base, "rotary_emb", None)
    if isinstance(current, PosencRotary):
        base.rotary_emb = current.original
        return True
    if isinstance(getattr(base, _GPTJ_HOLDER, None), PosencRotary):
        for attn in _gptj_attentions(model):
            attn.__dict__.pop("_get_embed_positions", None)
        delattr(base, _GPTJ_HOLDER)
        return True
    return False
