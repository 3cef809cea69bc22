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
phi3, stablelm, gpt_neox, smollm3, cohere2,         shared by every layer): swapped for
llama4_text                                         :class:`PosencRotary`; the original is kept
                                                    inside it, so unpatching puts the very same
                                                    object back
gemma3_text, gemma4_text                            the same module, which makes one cos/sin per
                                                    layer type (``forward(x, position_ids,
                                                    layer_type)``): Gemma 3's sliding layers base
                                                    10000, full layers base 1e6 and their
                                                    scaling; Gemma 4's full layers p-RoPE
                                                    (p = 0.25) on their own head size
gptj                                                transformers >= 5.24: its shared
                                                    ``rotary_emb`` (a fixed-length table,
                                                    base 10000, returning (sin, cos)); before,
                                                    no shared module: each ``GPTJAttention``
                                                    gathers sin/cos rows from its own
                                                    ``embed_positions`` table, and patched,
                                                    each layer's table lookup reads a posenc
                                                    table instead (an instance attribute
                                                    shadowing the method)
deepseek_v3 (DeepSeek-V3, Kimi K2: multi-head     the same module, for the decoupled RoPE of
latent attention)                                   MLA: the ``qk_rope_head_dim`` channels of q
                                                    (q_pe) and the one key slice all heads share
                                                    (k_pe), which the attention reorders
                                                    (``rope_interleave``) before rotating; YaRN's
                                                    ``mscale_all_dim`` correction of the softmax
                                                    scale stays the attention's (a RoPE override
                                                    that would change it is refused)
qwen2_vl_text, qwen2_5_vl_text, qwen3_vl_text       the language model's ``rotary_emb`` (patch
                                                    ``model.model.language_model``): posenc's
                                                    ``mrope``, at the (3, B, T) position ids the
                                                    model computes (``get_rope_index``)
==================================================  =============================================

The form handed to the attention layers is the family's own: Llama's half layout (the r/2
angles repeated, ``cat``), Cohere2's interleaved one (``repeat_interleave``), Llama 4's complex
``freqs_cis`` (complex64, multiplied into pairs (2i, 2i+1)).

NoPE/RoPE hybrids (SmolLM3's and Llama 4's ``no_rope_layers``, Cohere2's global layers):
their attention layers decide whether to rotate, so the NoPE layers stay NoPE, and what else
those layers do (sliding or chunked masks, Llama 4's query temperature
``log1p(floor((t + 1) / floor_scale)) * attn_scale + 1`` on its NoPE layers, at the stream
index t) stays transformers' own code. :func:`posenc.rotary.hf_config.layer_ropes` says which
layer rotates with what.

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
>>> patch_model(gemma3, scaling="linear", factor=2.0)  # Gemma 3: the full layers (as its rope_scaling)
>>> patch_model(gemma3, layer_type="sliding_attention", base=20000.0)    # or one layer type, named
>>> unpatch_model(model)                                # back to transformers' own
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..rotary import RotaryEmbedding, from_hf
from ..rotary.hf_readings import HF_READINGS
from ..rotary.scaling import SCALINGS
from .checkpoint import trained_length

__all__ = ["FORMS", "PosencRotary", "SUPPORTED_MODEL_TYPES", "patch_model", "patched_rope", "patched_ropes",
           "unpatch_model"]

#: model type of a base model holding one shared ``rotary_emb`` module -> the form its
#: attention layers take cos/sin in (``PosencRotary.form``).
_SHARED_MODULE = {
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "phi3", "stablelm", "gpt_neox",
                     "gemma3_text", "gemma4_text", "smollm3", "deepseek_v3"), "half"),
    "cohere2": "interleaved",
    # M-RoPE text models (posenc's mrope; position_ids (3, B, T)): the language model of a
    # Qwen2-VL / Qwen2.5-VL / Qwen3-VL (model.model.language_model)
    **dict.fromkeys(("qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text"), "half"),
    "llama4_text": "complex",
    "gptj": "sin_cos",  # transformers >= 5.24; before, no shared module (see patch_model)
}
#: model types whose attention scales the softmax by YaRN's ``mscale(factor, mscale_all_dim)^2``
#: (DeepSeek-V2/V3's multi-head latent attention, set at construction from the config): a RoPE
#: override must keep that factor (:func:`patch_model`)
_SOFTMAX_SCALED = ("deepseek_v3",)
#: every model type :func:`patch_model` accepts.
SUPPORTED_MODEL_TYPES = tuple(_SHARED_MODULE)
#: the forms of cos/sin a transformers rotary module returns (see :class:`PosencRotary`).
FORMS = ("half", "interleaved", "complex", "sin_cos")
_GPTJ_HOLDER = "posenc_rotary"  # GPT-J: the attribute of the base model holding the PosencRotary
_EVERY_LAYER = "every_layer"  # PosencRotary.ropes' key of a model with one RoPE for all layers


class PosencRotary(nn.Module):
    """Stands in for a transformers ``*RotaryEmbedding`` module: ``forward(x, position_ids)``
    (``forward(x, position_ids, layer_type)`` for per-layer-type RoPE, Gemma 3) returns the
    cos/sin of posenc's :meth:`RotaryEmbedding.cos_sin` (the scaling's attention factor
    included) in the family's ``form``:

    * ``"half"``: ``(cos, sin)``, each (B or 1, T, r) in ``x``'s dtype, the r/2 angles
      repeated as ``torch.cat((freqs, freqs), -1)`` (Llama and most families);
    * ``"interleaved"``: the same, each angle repeated in place (``repeat_interleave``, Cohere2);
    * ``"complex"``: one complex64 tensor (B or 1, T, r/2), ``cos + i sin`` (Llama 4's
      ``freqs_cis``, left in complex64 whatever ``x``'s dtype, as its own module does);
    * ``"sin_cos"``: ``(sin, cos)``, each (B or 1, T, r/2) in ``x``'s dtype, not repeated
      (GPT-J's ``GPTJRotaryEmbedding``, transformers >= 5.24).

    Attributes:
        ropes: layer type -> its posenc RoPE; one entry under ``"every_layer"`` for a model
            with one RoPE (no parameters or buffers: the frequencies are float64 Python-side
            tensors, so ``model.half()`` cannot round them).
        original: the module it replaced (None for GPT-J, which has none); a registered
            child, so ``model.to(...)`` moves it as it would have.
        form: one of :data:`FORMS`.
    """

    def __init__(self, rope: RotaryEmbedding | Mapping[str, RotaryEmbedding], original: nn.Module | None,
                 form: str = "half") -> None:
        super().__init__()
        if form not in FORMS:
            raise ValueError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
        self.ropes = nn.ModuleDict(rope if isinstance(rope, Mapping) else {_EVERY_LAYER: rope})
        self.original = original
        self.form = form

    @property
    def rope(self) -> RotaryEmbedding:
        """The one RoPE of a model without per-layer-type RoPE."""
        if _EVERY_LAYER not in self.ropes:
            raise ValueError(f"this model has a RoPE per layer type ({', '.join(self.ropes)}): read ropes[layer_type]")
        return self.ropes[_EVERY_LAYER]

    def _rope_of(self, layer_type: str | None) -> RotaryEmbedding:
        key = _EVERY_LAYER if layer_type is None and _EVERY_LAYER in self.ropes else layer_type
        if key not in self.ropes:
            raise ValueError(f"layer_type must be one of {', '.join(map(repr, self.ropes))}; got {layer_type!r}")
        return self.ropes[key]

    def half_layout(self, position_ids: Tensor, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
        """cos, sin (B|1, T, r) float32 in transformers' half layout."""
        cos, sin = self._rope_of(layer_type).cos_sin(position_ids)  # (B|1, T, r/2) float32, max position + 1 as the length
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> Any:
        if self.form == "half":
            cos, sin = self.half_layout(position_ids, layer_type)
        else:
            cos, sin = self._rope_of(layer_type).cos_sin(position_ids)  # (B|1, T, r/2) float32
            if self.form == "complex":
                return torch.complex(cos, sin)  # (B|1, T, r/2) complex64: Llama 4's freqs_cis
            if self.form == "sin_cos":
                return sin.to(x.dtype), cos.to(x.dtype)  # GPT-J: repeated in place by its attention
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)  # (B|1, T, r)
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


def _decoder(model: nn.Module) -> nn.Module:
    """The module holding the shared ``rotary_emb``: the base model, or the causal LM's
    ``model`` where ``base_model`` is the LM itself (Llama4ForCausalLM: its
    ``base_model_prefix`` names no attribute)."""
    base = model.base_model
    inner = getattr(model, "model", None)
    return inner if base is model and isinstance(inner, nn.Module) else base


def _check_model_type(model: nn.Module) -> str:
    model_type = getattr(model.config, "model_type", None)
    if model_type in SUPPORTED_MODEL_TYPES:
        return model_type
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    has_rope = any(type(m).__name__.endswith("RotaryEmbedding") for m in model.modules()) or any(
        "rope" in k or "rotary" in k for k, v in model.config.to_dict().items() if v not in (None, False, {})
    )
    if getattr(model.config, "text_config", None) is not None:
        raise ValueError(f"model_type {model_type!r} is a multimodal wrapper: patch its language model "
                         f"(e.g. model.model.language_model), whose model_type is one of {supported}")
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


def _resolve(model: nn.Module, native: RotaryEmbedding, rope: Any, overrides: dict[str, Any]) -> RotaryEmbedding:
    """The RotaryEmbedding to patch in, checked against the checkpoint's own (``native``)."""
    if rope is None:
        rope = native
    elif type(rope) is not type(native):  # a subclass (xPos) scales q and k apart: not a cos/sin pair
        raise TypeError(f"rope must be a posenc {type(native).__name__} (from posenc.rotary.from_hf or "
                        f"posenc.build({native.name!r}, ...)) or None, got {type(rope).__name__}")
    if overrides:
        cfg = rope.config
        # every field of the config's class (M-RoPE's sections too), not its scaling parameters
        fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
        # a new rope type starts from its own defaults (as set_scaling does); else keep the parameters
        params = {} if "scaling" in overrides else dict(cfg.scaling_params())
        params |= overrides
        name = params.get("scaling", cfg.scaling)
        takes_length = name in SCALINGS and "original_max_position_embeddings" in SCALINGS[name].params
        if takes_length and params.get("original_max_position_embeddings") is None:
            # the one parameter every length-based type needs: the checkpoint knows it
            params["original_max_position_embeddings"] = trained_length(model.config)
        # RotaryConfig checks every value and refuses unknown keywords, listing the valid ones
        rope = type(rope)(type(cfg)(**(fields | params)), rope.dims)
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


def _layer_types(model: nn.Module, model_type: str) -> tuple[str, ...]:
    """The layer types with a RoPE of their own (Gemma 3 and 4: sliding and full), as
    transformers' module builds them (the distinct ``layer_types`` whose rope parameters are
    not None); () for a model with one RoPE."""
    rope = getattr(model.config, "rope_parameters", None) or {}
    nested = isinstance(rope, Mapping) and bool(rope) and all(v is None or isinstance(v, Mapping) for v in rope.values())
    reading = HF_READINGS.get(model_type)  # None: an M-RoPE text model (read by posenc.rotary.mrope)
    if not ((reading is not None and reading.per_layer) or nested):
        return ()
    return tuple(sorted(t for t in set(model.config.layer_types) if not nested or rope.get(t) is not None))


def _targets(model_type: str, types: tuple[str, ...], layer_type: Any) -> tuple[str, ...]:
    """The keys of :attr:`PosencRotary.ropes` that ``rope`` / ``**scaling`` apply to; () when
    the model has several layer types and none is the default target."""
    if not types:
        if layer_type is not None:
            raise ValueError(f"layer_type must be None for model_type {model_type!r}: one RoPE serves all its "
                             f"layers (a RoPE per layer type: gemma3_text); got {layer_type!r}")
        return (_EVERY_LAYER,)
    if layer_type is not None:
        if layer_type not in types:
            raise ValueError(f"layer_type must be one of this model's layer types {', '.join(map(repr, types))}; "
                             f"got {layer_type!r}")
        return (layer_type,)
    scaled = tuple(t for t in HF_READINGS[model_type].scaled_layers if t in types)
    return scaled or (types if len(types) == 1 else ())


def _softmax_scale(rope: RotaryEmbedding) -> float:
    """DeepSeek's softmax-scale factor for ``rope`` (1 unless YaRN with ``mscale_all_dim``)."""
    from ..engines.transformers import deepseek_softmax_scale

    c = rope.config
    if c.scaling != "yarn":
        return 1.0
    return deepseek_softmax_scale({"rope_parameters": {"rope_type": "yarn", "factor": c.factor,
                                                       "mscale_all_dim": c.mscale_all_dim}})


def patch_model(model: Any, rope: RotaryEmbedding | None = None, *, layer_type: str | None = None,
                method: str | None = None, **scaling: Any) -> RotaryEmbedding:
    """Make a transformers model rotate with posenc's RoPE; returns the RotaryEmbedding in use
    (for per-layer-type RoPE, the target layer type's).

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
        layer_type: for a model with a RoPE per layer type (Gemma 3), the layer type ``rope``
            and ``**scaling`` apply to; by default the one a flat ``rope_scaling`` scales in
            that family (Gemma 3: ``"full_attention"``), as its config would. The other layer
            types keep the checkpoint's own RoPE. Must be None for other models.
        method: a training-free attention method of :data:`posenc.methods.METHODS` and its
            parameters among ``**scaling`` (``method="self_extend", group_size=8,
            neighbor_window=1024``; ``method="rerope", window=512, slope=0.0``;
            ``method="dual_chunk", chunk_size=6144, local_size=1024``; ``block_rows``:
            query rows per block), composed with any RoPE change: see :mod:`posenc.hf.methods`.
            None (the default) removes a method set before.

    Calling it again on a patched model replaces the RoPE (the original module stays kept for
    :func:`unpatch_model`). On any error the model is left as it was.
    """
    model = _transformers_model(model)
    model_type = _check_model_type(model)
    from .methods import check_method_model, set_method, split_method_params  # hf.methods imports this module

    attention_method, block_rows, scaling = split_method_params(method, scaling)
    if attention_method is not None:
        check_method_model(model_type)
    types = _layer_types(model, model_type)
    targets = _targets(model_type, types, layer_type)
    if not targets and (rope is not None or scaling):
        raise ValueError(f"layer_type must be given: this model has a RoPE per layer type "
                         f"({', '.join(map(repr, types))}) and none is the one its family's rope_scaling scales")
    native = {t: from_hf(model.config, layer_type=t) for t in types} or {_EVERY_LAYER: from_hf(model.config)}
    ropes = native | {t: _resolve(model, native[t], rope, scaling) for t in targets}
    new = ropes[(targets or types)[0]]
    if model_type in _SOFTMAX_SCALED and _softmax_scale(new) != _softmax_scale(native[_EVERY_LAYER]):
        raise ValueError(
            f"model_type {model_type!r}: its attention multiplies the softmax scale by YaRN's "
            f"mscale(factor, mscale_all_dim)^2, fixed when the model was built ({_softmax_scale(native[_EVERY_LAYER]):g} "
            f"here); this RoPE needs {_softmax_scale(new):g}, which patching the rotary cannot give: build the model "
            "with these rope_parameters in its config instead, or keep mscale_all_dim as the config has it")
    base = _decoder(model)
    if model_type == "gptj" and not isinstance(getattr(base, "rotary_emb", None), nn.Module):  # transformers < 5.24
        holder = getattr(base, _GPTJ_HOLDER, None)
        attentions = _gptj_attentions(model)
        if holder is None:
            holder = PosencRotary(new, None)
            setattr(base, _GPTJ_HOLDER, holder)
            for attn in attentions:
                # an instance attribute shadows the class method; unpatch deletes it
                attn._get_embed_positions = holder.gptj_table
        holder.ropes = nn.ModuleDict(ropes)
        return new
    current = getattr(base, "rotary_emb", None)
    if not isinstance(current, nn.Module):
        raise ValueError(f"model_type {model_type!r} but {type(base).__name__} has no rotary_emb module "
                         "(a transformers version this patch does not know?)")
    if isinstance(current, PosencRotary):
        current.ropes = nn.ModuleDict(ropes)
    else:
        base.rotary_emb = PosencRotary(ropes, current, _SHARED_MODULE[model_type])
    set_method(model, base, attention_method, block_rows)
    return new


def _holder(model: Any) -> PosencRotary | None:
    """The PosencRotary a patched model rotates with (its ``rotary_emb``, or GPT-J's holder
    attribute), None when the model is not patched."""
    base = _decoder(_transformers_model(model))
    for holder in (getattr(base, "rotary_emb", None), getattr(base, _GPTJ_HOLDER, None)):
        if isinstance(holder, PosencRotary):
            return holder
    return None


def patched_rope(model: Any, layer_type: str | None = None) -> RotaryEmbedding | None:
    """The posenc RoPE a patched model uses (for per-layer-type RoPE, ``layer_type``'s), or
    None when it is not patched."""
    holder = _holder(model)
    if holder is None:
        return None
    if _EVERY_LAYER in holder.ropes and layer_type is not None:
        raise ValueError(f"layer_type must be None: this model has one RoPE for all its layers; got {layer_type!r}")
    if _EVERY_LAYER not in holder.ropes and layer_type is None:
        raise ValueError(f"layer_type must be given: this model has a RoPE per layer type "
                         f"({', '.join(map(repr, holder.ropes))})")
    return holder._rope_of(layer_type)


def patched_ropes(model: Any) -> RotaryEmbedding | dict[str, RotaryEmbedding] | None:
    """Every RoPE a patched model uses, in the form :func:`posenc.rotary.to_hf` writes: the one
    RotaryEmbedding, or a dict layer type -> RotaryEmbedding for a model with a RoPE per layer
    type (Gemma 3 and 4; ``to_hf`` then writes ``rope_parameters`` keyed by layer type); None
    when it is not patched."""
    holder = _holder(model)
    if holder is None:
        return None
    return holder.rope if _EVERY_LAYER in holder.ropes else dict(holder.ropes.items())


def unpatch_model(model: Any) -> bool:
    """Undo :func:`patch_model`: put back the exact module (or GPT-J's own table lookup) it
    replaced, so the model computes bit for bit what it did before. Returns True when it
    restored something, False when the model was not patched (nothing to do)."""
    base = _decoder(_transformers_model(model))
    current = getattr(base, "rotary_emb", None)
    if isinstance(current, PosencRotary):
        from .methods import remove_method

        remove_method(model, base)  # the attention implementation the model had, if a method was set
        base.rotary_emb = current.original
        return True
    if isinstance(getattr(base, _GPTJ_HOLDER, None), PosencRotary):
        for attn in _gptj_attentions(model):
            attn.__dict__.pop("_get_embed_positions", None)
        delattr(base, _GPTJ_HOLDER)
        return True
    return False
