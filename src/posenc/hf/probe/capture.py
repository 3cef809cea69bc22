"""Probe step 1, capture: the text a checkpoint reads, and its pre-rotation q and k.

The checkpoint runs once on a text (a file, or the Python standard library's sources);
forward hooks take the *pre-rotation* q and k of the chosen layers (the outputs of
``q_proj``/``k_proj``, passed through the layer's own ``q_norm``/``k_norm`` where the family
normalises per head, Qwen 3 / Gemma 3), so that posenc's RoPE can place them at any distance later. The forward
stops after the last chosen layer. :func:`layer_taps` knows where each family keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

__all__ = ["QKTaps", "capture_qk", "layer_taps", "probe_text_ids"]


def probe_text_ids(tokenizer: Any, text: str | Path | None, tokens: int) -> list[int]:
    """``tokens`` token ids of the text file ``text`` (None: the Python standard library's
    sources, the bench's lm corpus), with the tokenizer's BOS first when it has one."""
    if text is None:
        from ...bench.data import load_corpus

        # validation is 1/9 of max_bytes; 8 bytes per token covers any real tokenizer
        raw = bytes(load_corpus(None, max_bytes=9 * 8 * tokens + 9).val.tolist())
        where = "the standard library sources"
    else:
        p = Path(text)
        if p.is_dir():
            raise ValueError(f"--text must be a text file, got {str(p)!r}, which is a directory")
        if not p.is_file():
            raise FileNotFoundError(f"--text: no such file: {str(p)!r}")
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise ValueError(f"--text {str(p)!r} cannot be read: {e.strerror or e}") from None
        where = f"--text {str(p)!r}"
    ids = tokenizer.encode(raw.decode("utf-8", errors="replace"))
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id] + ids
    if len(ids) < 2:
        raise ValueError(f"{where} gives {len(ids)} tokens; the probe needs at least 2")
    return ids[:tokens]


@dataclass(frozen=True)
class QKTaps:
    """Where one decoder layer's pre-rotation q and k can be read.

    ``taps``: (module, split) pairs; a forward hook on ``module`` passes its output to
    ``split``, which returns ``{"q": (H, T, D)}``, ``{"k": (Hkv, T, D)}`` or both.
    ``scale``: the layer's logit scale (1/sqrt(D), Gemma's query_pre_attn_scalar^-1/2, ...).
    """

    taps: tuple[tuple[Any, Any], ...]
    scale: float


def _heads(x: Tensor, n: int, d: int) -> Tensor:
    """(1, T, n*d) or (1, T, n, d) -> (n, T, d), float32."""
    return x.float().reshape(x.shape[0], x.shape[1], n, d)[0].transpose(0, 1).contiguous()


def _normed_heads(n: int, d: int, norm: Any):
    """A split for a ``q_proj``/``k_proj`` output (1, T, n*d): its (n, T, d) heads, passed
    through the layer's per-head ``norm`` first when it has one (an RMSNorm over the last
    axis, so applied here as the model applies it, whichever of (T, n) the model puts first:
    Qwen 3 norms (1, T, n, d), Gemma 3 (1, n, T, d))."""

    def split(o: Tensor) -> Tensor:
        x = o.reshape(o.shape[0], o.shape[1], n, d)
        if norm is not None:
            x = norm(x)
        return x.float()[0].transpose(0, 1).contiguous()

    return split


def layer_taps(model: Any) -> list[QKTaps]:
    """One :class:`QKTaps` per decoder layer of a transformers causal LM:

    * Llama, Mistral, Qwen 2/3, Gemma 1-3, SmolLM3, Llama 4, Cohere2 (``model.layers[i].self_attn``):
      ``q_proj``/``k_proj``, through ``q_norm``/``k_norm`` where RoPE follows a per-head norm
      (Qwen 3, Gemma 3), and Llama 4's ``qk_norm``;
    * Phi-3: the fused ``qkv_proj`` (q, then k, then v);
    * GPT-NeoX: ``query_key_value``, per head [q | k | v];
    * GPT-J (``transformer.h[i].attn``): ``q_proj``/``k_proj``, logits divided by sqrt(D).
    """
    cfg = model.config
    H = cfg.num_attention_heads
    Hkv = getattr(cfg, "num_key_value_heads", None) or H
    out = []
    body = getattr(model, "model", None)
    if body is not None and hasattr(body, "layers") and all(hasattr(x, "self_attn") for x in body.layers):
        for layer in body.layers:
            a = layer.self_attn
            d = a.head_dim
            scale = float(getattr(a, "scaling", d**-0.5))
            if hasattr(a, "qkv_proj"):  # Phi-3
                split = lambda o, d=d: {"q": _heads(o[..., : H * d], H, d), "k": _heads(o[..., H * d : (H + Hkv) * d], Hkv, d)}
                out.append(QKTaps(((a.qkv_proj, split),), scale))
            elif hasattr(a, "q_proj") and hasattr(a, "k_proj"):
                # Llama 4's qk_norm (a weightless RMS norm of each head) follows RoPE; a rotation keeps
                # the norm, so normalising before it is the same
                qn, kn = (a.qk_norm, a.qk_norm) if hasattr(a, "qk_norm") else (getattr(a, "q_norm", None),
                                                                                getattr(a, "k_norm", None))
                qs, ks = _normed_heads(H, d, qn), _normed_heads(Hkv, d, kn)
                out.append(QKTaps(((a.q_proj, lambda o, f=qs: {"q": f(o)}), (a.k_proj, lambda o, f=ks: {"k": f(o)})), scale))
            else:
                break
        else:
            return out
    neox = getattr(model, "gpt_neox", None)
    if neox is not None:
        for layer in neox.layers:
            a = layer.attention
            d = a.head_size

            def split(o, d=d):
                q, k, _ = o.reshape(o.shape[0], o.shape[1], H, 3 * d).chunk(3, dim=-1)  # per head [q | k | v]
                return {"q": _heads(q, H, d), "k": _heads(k, H, d)}

            out.append(QKTaps(((a.query_key_value, split),), float(getattr(a, "scaling", d**-0.5))))
        return out
    gptj = getattr(model, "transformer", None)
    if gptj is not None and hasattr(gptj, "h") and all(hasattr(b.attn, "q_proj") for b in gptj.h):
        for block in gptj.h:
            a = block.attn
            d = a.head_dim
            out.append(QKTaps(((a.q_proj, lambda o, d=d: {"q": _heads(o, H, d)}),
                               (a.k_proj, lambda o, d=d: {"k": _heads(o, H, d)})),
                              # transformers >= 5.24: scaling; before: logits divided by scale_attn
                              float(a.scaling if hasattr(a, "scaling") else 1.0 / a.scale_attn)))
        return out
    raise ValueError(
        f"{type(model).__name__} ({getattr(cfg, 'model_type', None)!r}) has no q/k projections the probe knows; "
        "it reads Llama, Mistral, Qwen2/3, Gemma, Phi-3, GPT-NeoX and GPT-J-style checkpoints"
    )


class _Stop(Exception):
    """Raised by the last hook to end the forward once every chosen layer is captured."""


@torch.no_grad()
def capture_qk(model: Any, input_ids: Tensor, layers: Sequence[int]) -> dict[int, tuple[Tensor, Tensor]]:
    """Pre-rotation q (H, T, D) and k (Hkv, T, D), float32, of ``layers`` on ``input_ids`` (1, T)
    (see :func:`layer_taps` for where they are read). The forward stops once the last one is in."""
    taps = layer_taps(model)
    for layer in layers:
        if not 0 <= layer < len(taps):
            raise ValueError(f"--layer must be in [0, {len(taps) - 1}] (the model has {len(taps)} layers), got {layer}")
    want = {(layer, w) for layer in layers for w in ("q", "k")}
    found: dict[tuple[int, str], Tensor] = {}
    handles = []

    def hook(layer: int, split):
        def fn(module, args, output):
            for which, x in split(output).items():
                found[(layer, which)] = x
            if want <= found.keys():
                raise _Stop
        return fn

    try:
        for layer in set(layers):
            for module, split in taps[layer].taps:
                handles.append(module.register_forward_hook(hook(layer, split)))
        try:
            model(input_ids=input_ids, use_cache=False)
        except _Stop:
            pass
    finally:
        for h in handles:
            h.remove()
    return {layer: (found[(layer, "q")], found[(layer, "k")]) for layer in layers}
