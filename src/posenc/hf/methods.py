"""A training-free attention method (Self-Extend, ReRoPE, Dual Chunk Attention) on a transformers
model: ``patch_model(model, method=NAME, **params)``, through transformers' own extension point, its
attention-function registry.

How it is wired (transformers 5.24). A Llama-style attention layer rotates q and k with the
cos/sin its model's rotary module makes, appends k and v to the KV cache, then calls the
attention function registered under ``config._attn_implementation`` with q, k, v, the mask and
its keyword arguments, among them the forward's ``position_ids``. Patched with a method:

* the rotary module is a :class:`MethodRotary`, which returns the identity rotation (cos = 1,
  sin = 0, exact in every dtype), so q and k reach attention unrotated and the KV cache holds
  unrotated keys;
* the attention function :func:`attention_forward` (registered as ``"posenc_method"``, with
  transformers' SDPA boolean mask builder) rotates q and k itself, the method's R ways, from
  the positions of this forward, and runs :func:`posenc.methods.method_attention` (row blocks,
  no (T, T) tensor).

Why unrotated keys in the cache, rather than re-rotating transformers' rotated q and k by a
position difference (RoPE rotations compose, R(a) R(m) = R(m + a)): every method needs the
key at a position other than its own (Self-Extend floor(n / G), ReRoPE 0 or s n), so either
way the key positions are needed; rotating from the unrotated key costs the same, rounds once
(re-rotating a bfloat16 key rounds twice), and takes the angles in float64 from the current
frequencies, so a length-dependent scaling (dynamic NTK) and the attention factor (YaRN) apply
as they would to the plain model.

Positions, carried per forward, never on module state: the queries' positions are the
``position_ids`` transformers passes to the attention function (packed documents restarting
at 0, left padding as ``generate`` derives it, decoding steps). The keys are the queries when
there is no cache (their positions are then exactly ``position_ids``); with a cache, the cached
keys' positions are derived from the mask: a key the first query sees sits at that query's
position minus the number of keys it sees after it. This is exact whenever positions step by
one among the keys a query sees, which is what transformers itself assumes to detect packed
documents (``find_packed_sequence_indices``) and what ``generate`` makes; keys a query does not
see take no part. It needs a cache that appends in stream order (``DynamicCache``, the default
of ``generate``; its sliding-window layers too), not a ``StaticCache``.

Supported model types: :data:`METHOD_MODEL_TYPES` (a shared rotary module in the half layout,
every layer rotating, plain softmax attention: no logit soft-capping, sinks or NoPE layers).
Composes with ``scaling=`` (the frequencies and attention factor of the patched RoPE are the
ones the method rotates with, YaRN's temperature included: Dual Chunk Attention with YaRN, as
Qwen2.5-1M's ``dual_chunk_attention_config`` pairs them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from ..methods import METHODS, AttentionMethod, build_method, method_attention, method_params
from .patch import PosencRotary

__all__ = ["ATTENTION_NAME", "METHOD_MODEL_TYPES", "MethodRotary", "attention_forward", "installed_method",
           "key_positions"]

#: the name under which :func:`attention_forward` is registered with transformers
ATTENTION_NAME = "posenc_method"
#: model types whose attention a method can replace (see the module docstring)
METHOD_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_ATTR = "posenc_method"  # attribute of each attention layer holding its _Binding
_EXECUTION = ("block_rows",)  # keywords of patch_model(method=...) that are not the method's parameters


@dataclasses.dataclass(frozen=True)
class _Binding:
    """What an attention layer needs from its patch: a plain object (not a Module), so the
    layer's submodules, parameters and state_dict stay the checkpoint's."""

    method: AttentionMethod
    holder: "MethodRotary"
    block_rows: int | None


class MethodRotary(PosencRotary):
    """The rotary module of a model patched with a method: the identity rotation (the attention
    function rotates), and what unpatching needs: ``method``, ``block_rows`` and the attention
    implementation the model had (``previous_impl``)."""

    def __init__(self, holder: PosencRotary, method: AttentionMethod, block_rows: int | None,
                 previous_impl: str) -> None:
        super().__init__(dict(holder.ropes.items()), holder.original, holder.form)
        self.method = method
        self.block_rows = block_rows
        self.previous_impl = previous_impl

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> Any:
        r = self._rope_of(layer_type).rotary_dim
        cos = torch.ones(*position_ids.shape[-2:], r, dtype=x.dtype, device=x.device)  # (B|1, T, r)
        return cos, torch.zeros_like(cos)  # q * 1 + rotate_half(q) * 0 == q exactly


def split_method_params(method: str | None, params: dict[str, Any]) -> tuple[AttentionMethod | None, int | None,
                                                                            dict[str, Any]]:
    """(the method, its block_rows, the remaining keywords: RoPE changes) from ``patch_model``'s
    keywords; a ``ValueError`` for an unknown method, a parameter of another method, or a
    method parameter without ``method=``."""
    params = dict(params)
    owners = {p: name for name in METHODS for p in method_params(name)}
    if method is None:
        stray = sorted(p for p in params if p in owners or p in _EXECUTION)
        if stray:
            raise ValueError(f"{stray[0]} is a parameter of an attention method: pass method=... "
                             f"(one of {', '.join(map(repr, METHODS))})")
        return None, None, params
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}; got {method!r}")
    own = method_params(method)
    foreign = sorted(p for p in params if p in owners and p not in own)
    if foreign:
        raise ValueError(f"{foreign[0]} is a parameter of method {owners[foreign[0]]!r}, not {method!r} "
                         f"(which takes {', '.join(own)})")
    chosen = {p: params.pop(p) for p in own if p in params}
    block_rows = params.pop("block_rows", None)
    if block_rows is not None and (isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1):
        raise ValueError(f"block_rows must be an int >= 1 (or None for automatic), got {block_rows!r}")
    return build_method(method, **chosen), block_rows, params


def check_method_model(model_type: str) -> None:
    """Refuse, in one line, a model type whose attention the methods' function cannot stand in for."""
    if model_type not in METHOD_MODEL_TYPES:
        raise ValueError(f"model_type must be one of {', '.join(METHOD_MODEL_TYPES)} for method=...; got "
                         f"{model_type!r}")


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # bool (B, 1, Tq, Tk), None when plain causal


def _attention_layers(base: nn.Module) -> list[nn.Module]:
    layers = [layer.self_attn for layer in getattr(base, "layers", ())]
    if not layers:
        raise ValueError(f"{type(base).__name__} has no decoder layers with a self_attn module to patch")
    return layers


def set_method(model: nn.Module, base: nn.Module, method: AttentionMethod | None, block_rows: int | None) -> None:
    """Install ``method`` on a model whose ``base.rotary_emb`` is a patched
    :class:`~posenc.hf.patch.PosencRotary` (None: remove the method, keep the patched RoPE)."""
    current = base.rotary_emb
    if method is None:
        if isinstance(current, MethodRotary):
            remove_method(model, base)
            base.rotary_emb = PosencRotary(dict(current.ropes.items()), current.original, current.form)
        return
    previous = current.previous_impl if isinstance(current, MethodRotary) else model.config._attn_implementation
    holder = MethodRotary(current, method, block_rows, previous)
    layers = _attention_layers(base)
    _register()
    base.rotary_emb = holder
    for attn in layers:
        setattr(attn, _ATTR, _Binding(method, holder, block_rows))
    model.set_attn_implementation(ATTENTION_NAME)


def remove_method(model: nn.Module, base: nn.Module) -> None:
    """Undo :func:`set_method`'s attention side (the layers' bindings, the attention
    implementation); the caller puts a rotary module back."""
    current = getattr(base, "rotary_emb", None)
    if not isinstance(current, MethodRotary):
        return
    for attn in _attention_layers(base):
        attn.__dict__.pop(_ATTR, None)
    model.set_attn_implementation(current.previous_impl)


def installed_method(model: nn.Module) -> AttentionMethod | None:
    """The method a patched model attends with, or None."""
    for m in model.modules():
        if isinstance(m, MethodRotary):
            return m.method
    return None


def key_positions(position_ids: Tensor, mask: Tensor | None, num_keys: int) -> Tensor:
    """The keys' positions (B|1, Tk) for queries at ``position_ids`` (B|1, Tq), the last Tq of the
    ``num_keys`` keys, under transformers' boolean ``mask`` (B|1, 1, Tq, Tk) or None (plain
    causal). See the module docstring for when the derivation of cached keys is exact."""
    Tq = position_ids.shape[-1]
    past = num_keys - Tq
    if past == 0:
        return position_ids
    first = position_ids[:, :1]  # (B|1, 1)
    if mask is None:
        after = torch.arange(past, 0, -1, device=position_ids.device)[None]  # (1, past): keys after j, all seen
    else:
        seen = mask[:, 0, 0, : past + 1].to(torch.long)  # (B|1, past + 1): what the first query sees
        after = seen.flip(-1).cumsum(-1).flip(-1)[:, 1:]  # (B|1, past): keys it sees in (j, past]
    cached = (first - after).clamp_min(0)
    B = max(cached.shape[0], position_ids.shape[0])
    return torch.cat((cached.expand(B, past), position_ids.expand(B, Tq)), dim=1)  # (B, Tk)


def attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      scaling: float | None = None, dropout: float = 0.0, position_ids: Tensor | None = None,
                      **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention-function signature: q (B, H, Tq, D), k and v (B, Hkv, Tk, D),
    unrotated (:class:`MethodRotary`); returns ((B, Tq, H, D), None)."""
    binding = getattr(module, _ATTR, None)
    if binding is None:
        raise ValueError(f"attention implementation {ATTENTION_NAME!r} is set on a layer that "
                         f"posenc.hf.patch_model(model, method=...) did not patch")
    if position_ids is None or position_ids.dim() != 2:
        raise ValueError("the attention method needs the forward's position_ids (B, T) in the attention keywords; "
                         f"got {None if position_ids is None else tuple(position_ids.shape)}")
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise TypeError(f"attention_mask must be transformers' boolean SDPA mask under a method, got "
                        f"{attention_mask.dtype}")
    k_pos = key_positions(position_ids, attention_mask, key.shape[2])
    rope = binding.holder.rope
    inv_freq, factor = rope.frequencies(rope.current_length(position_ids, k_pos))
    out = method_attention(query, key, value, binding.method, position_ids, k_pos, inv_freq,
                           attention_factor=factor, scale=scaling, mask=attention_mask,
                           dropout=dropout if module.training else 0.0, block_rows=binding.block_rows)
    return out.transpose(1, 2).contiguous(), None
