"""The planner: the one place that decides how an attention call runs: :func:`plan` -> :class:`Plan`.

A plan is a leaf (:class:`Leaf`) and the reason it was taken. Every leaf is a function of
the backend signature, (q, k, v, *, scale, mask, terms) -> (B, H, Tq, Dv), without branches of
its own; :func:`run` is ``plan`` then the leaf. Tests ask ``plan(...)`` which leaf a call
takes (or record the plans of a model's forward by wrapping this function).

Each leaf is kept by a measurement (2-core CPU shared with other jobs, one thread, best of 5-7
interleaved rounds; B=1, H=8, D=64, float32; the same leaf functions called directly):

=================  ====================================================================
leaf               kept because
=================  ====================================================================
EMPTY              no query rows: flex's kernels fail on T = 0 (SIGFPE compiled, an
                   IndexError uncompiled); every other leaf's result is the same empty
                   tensor
EAGER              the reference (``impl="eager"``); with terms, a decoding step without
                   autograd (Tq <= 16 < Tk): Shaw, Tq=1, Tk=512: 0.71 ms against the fused
                   function's 1.72 ms; and under torch.compile (the fused Function does not
                   trace with fullgraph=True)
SDPA_CAUSAL        no terms, plain causal: T=1024 forward 43 ms against 66 ms with the bool
                   mask (SDPA_MASK) and 268 ms eager
SDPA_MASK          no terms, any other mask: SDPA's bool ``attn_mask`` (None when full)
SDPA_LOCAL_ROWS    no terms, a causal sliding window or chunks alone (``mask.local_rows``),
                   Tq > 128: row blocks over the keys each reaches; T=2048, window 256
                   forward 90 ms against 369 ms with the bool mask (SDPA_MASK), forward +
                   backward 327 against 1359 ms; chunks of 256 forward 43 ms against 331 ms
                   (plain causal attention: 188 ms), forward + backward 237 against 1352 ms
CPU_FLASH_BIAS     a bias alone on CPU, plain causal or full, v as wide as q (the kernel
                   needs one head size): a learned bias (T5), T=512 forward + backward
                   112 ms against 125 ms fused and 162 ms with SDPA's
                   float mask (which keeps every layer's probabilities); a fixed bias (ALiBi)
                   forward T=1024 79 ms, level with the row blocks' 72 ms, without their
                   masked (T, T) copy of the bias
SDPA_BIAS_ROWS     a fixed bias (or compiling), plain causal, T > 256, off the CPU flash
                   leaf: ALiBi T=1024 forward 72 ms against 98 ms for one masked call
SDPA_BIAS          a fixed bias (or compiling) otherwise: ALiBi with padding, T=512 forward +
                   backward 83 ms against the fused function's 136 ms
FUSED              table / dense / prefix-sum / count / stick (stick-breaking, per_row_alibi) /
                   value terms, or a learned bias in training off the CPU flash leaf: no (B, H, T, T)
                   probabilities kept for the backward (T5's peak memory about 1.15x NoPE's
                   against 1.85x with SDPA's float mask); unnormalised weights
                   (``terms.normalized`` False: stick-breaking) as exp(logits), since no SDPA
                   leaf can leave a row unnormalised
HOUSEHOLDER        a :class:`~posenc.terms.HouseholderTerm` alone (PaTH) under a plain causal
                   mask, ``impl`` sdpa or auto, not compiling: the chunked Householder attention
                   (:mod:`.householder_flash`), no (T, T) tensor; PaTH's whole-model training
                   step (B=2, 6 layers, width 512, T=1024, two threads, quiet) 1.45x NoPE's
                   time (paired) against 3.76x with its dense term in the fused function (the
                   model_cpu table), peak memory 1.24x against 6.24x; one call, B=2, H=8,
                   D=64, forward + backward 182 ms against SDPA's causal 67 ms without PaTH
OWN_LOGITS         a :class:`~posenc.terms.LogitsTerm` alone (PaTH's decoding step), ``impl``
                   sdpa or auto: softmax of its logits, no q·kᵀ (:mod:`.own_logits`); the eager
                   leaf would compute q·kᵀ and the term's dense form subtract it again;
                   PaTH decoding (6 layers, width 512, B=1, two threads) 1.31x NoPE's step at
                   1024 cached tokens and 1.23x at 4096, paired, against 1.94x and 2.73x with
                   its dense term through the eager leaf (which also carried every key per step)
FLEX               ``impl="flex"`` (and ``auto`` on CUDA with logit terms): score_mod and
                   BlockMask, no (Tq, Tk) tensor; unnormalised weights as its output times
                   exp(logsumexp)
=================  ====================================================================
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch
from torch import Tensor

from ..masks import AttentionMask
from ..torch_facts import FLEX_HAS_CPU_BACKWARD
from . import IMPLS, Backend, LayerTerms, needs_grad
from ..terms import HouseholderTerm, LogitsTerm
from . import eager, flex, fused, householder_flash, own_logits, sdpa

__all__ = ["Leaf", "Plan", "plan", "run", "LEAVES", "DECODE_ROWS", "BIAS_ROWS"]

#: A step of at most this many queries against more keys, without autograd, is a decoding step.
DECODE_ROWS = 16
#: Plain causal attention with a fixed bias runs in blocks of this many query rows past it.
BIAS_ROWS = sdpa.ROWS


class Leaf(enum.Enum):
    EMPTY = "empty"
    EAGER = "eager"
    SDPA_CAUSAL = "sdpa_causal"
    SDPA_MASK = "sdpa_mask"
    SDPA_LOCAL_ROWS = "sdpa_local_rows"
    CPU_FLASH_BIAS = "cpu_flash_bias"
    SDPA_BIAS_ROWS = "sdpa_bias_rows"
    SDPA_BIAS = "sdpa_bias"
    FUSED = "fused"
    HOUSEHOLDER = "householder"
    OWN_LOGITS = "own_logits"
    FLEX = "flex"


class Plan(NamedTuple):
    """Which leaf runs an attention call, and why (a sentence for a person)."""

    leaf: Leaf
    reason: str


def _learned_bias(terms: LayerTerms) -> bool:
    return torch.is_grad_enabled() and terms.bias is not None and terms.bias.dense().requires_grad


def _alone(terms: LayerTerms, kind: type) -> bool:
    """The layer's one term is a ``kind``: no bias, no other logit term, no value term."""
    return terms.bias is None and len(terms.values) == 0 and len(terms.logits) == 1 and isinstance(terms.logits[0], kind)


def _auto_flex_on(device: torch.device) -> bool:
    """Whether ``impl="auto"`` picks flex (for logit terms) on this device: on CUDA only. On
    CPU compiling flex costs :data:`~posenc.torch_facts.FLEX_CPU_COMPILE_SECONDS` per new
    shape, more than a short run, and training there needs
    :data:`~posenc.torch_facts.FLEX_HAS_CPU_BACKWARD`."""
    return device.type == "cuda"


def plan(impl: str, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, terms: LayerTerms) -> Plan:
    """The leaf for attention through backend ``impl`` (one of :data:`~posenc.backends.IMPLS`)
    on these inputs. Raises ``ValueError`` naming ``impl`` for a call the backend cannot run
    (flex with value terms, or with autograd on CPU)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}")
    if mask.tq == 0:
        return Plan(Leaf.EMPTY, "no query rows: the result is empty")
    has_logits = terms.bias is not None or len(terms.logits) > 0
    if impl in ("sdpa", "auto") and _alone(terms, HouseholderTerm) and mask.plain_causal and not torch.compiler.is_compiling():
        return Plan(Leaf.HOUSEHOLDER, "a Householder term alone, plain causal: the chunked Householder attention")
    if impl in ("sdpa", "auto") and _alone(terms, LogitsTerm):
        return Plan(Leaf.OWN_LOGITS, "an encoding's own logits alone: their softmax, no q·kᵀ")
    if impl == "auto":
        impl = "flex" if has_logits and len(terms.values) == 0 and _auto_flex_on(q.device) else "sdpa"
    if impl == "eager":
        return Plan(Leaf.EAGER, "impl='eager': the reference")
    if impl == "flex":
        if len(terms.values) > 0:
            raise ValueError(
                "impl='flex' cannot apply value terms (Shaw's use_value): flex_attention does not return "
                "the attention probabilities they read; use impl='sdpa' (fused), 'eager' or 'auto'"
            )
        if q.device.type == "cpu" and not FLEX_HAS_CPU_BACKWARD and needs_grad(q, k, v, terms):
            raise ValueError(
                f"impl='flex' has no backward on CPU (torch {torch.__version__}: flex_attention's CPU "
                "backward raises NotImplementedError); train on CPU with impl='sdpa' or 'auto', or run "
                "flex under torch.no_grad()"
            )
        return Plan(Leaf.FLEX, "impl='flex': score_mod and BlockMask")
    # sdpa. len(): dynamo cannot `not` a tuple.
    if terms.empty:
        if mask.plain_causal:
            return Plan(Leaf.SDPA_CAUSAL, "no terms, plain causal: is_causal")
        if mask.tq > sdpa.LOCAL_ROWS and not torch.compiler.is_compiling() and mask.local_rows:
            return Plan(Leaf.SDPA_LOCAL_ROWS, "no terms, a sliding window or chunks alone: SDPA in row blocks over their keys")
        return Plan(Leaf.SDPA_MASK, "no terms: the bool mask")
    compiling = torch.compiler.is_compiling()
    bias_only = len(terms.logits) == 0 and len(terms.values) == 0
    # the CPU flash kernel needs one head size for q, k and v (the SDPA leaves' sdpa() takes a narrower v)
    same_width = v.shape[-1] == q.shape[-1]
    if bias_only and same_width and not compiling and q.device.type == "cpu" and (mask.plain_causal or mask.is_full):
        return Plan(Leaf.CPU_FLASH_BIAS, "a bias alone on CPU, plain causal or full: the flash kernel with the bias")
    if bias_only and (compiling or not _learned_bias(terms)):
        if mask.plain_causal and mask.tq > BIAS_ROWS:
            return Plan(Leaf.SDPA_BIAS_ROWS, "a fixed bias, plain causal and long: SDPA in row blocks")
        return Plan(Leaf.SDPA_BIAS, "a fixed bias: SDPA with the masked bias as float mask")
    if compiling:
        return Plan(Leaf.EAGER, "terms under torch.compile: the dense composition, fused by the compiler")
    if mask.tq <= DECODE_ROWS < mask.tk and not needs_grad(q, k, v, terms):
        return Plan(Leaf.EAGER, "a decoding step without autograd: the dense composition is small")
    return Plan(Leaf.FUSED, "terms (or a learned bias in training): the blockwise fused function")


def _empty(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """(B, H, 0, Dv), connected to q, k, v (their gradients are zeros)."""
    return q.new_zeros(*q.shape[:3], v.shape[-1]) + 0 * (q.sum() + k.sum() + v.sum())


LEAVES: dict[Leaf, Backend] = {
    Leaf.EMPTY: _empty,
    Leaf.EAGER: eager.attention,
    Leaf.SDPA_CAUSAL: sdpa.causal,
    Leaf.SDPA_MASK: sdpa.masked,
    Leaf.SDPA_LOCAL_ROWS: sdpa.local_rows,
    Leaf.CPU_FLASH_BIAS: sdpa.cpu_flash_bias,
    Leaf.SDPA_BIAS_ROWS: sdpa.bias_rows,
    Leaf.SDPA_BIAS: sdpa.bias,
    Leaf.FUSED: fused.attention,
    Leaf.HOUSEHOLDER: householder_flash.attention,
    Leaf.OWN_LOGITS: own_logits.attention,
    Leaf.FLEX: flex.attention,
}


def run(impl: str, q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """Attention through the backend ``impl``: (B, H, Tq, Dv), the leaf :func:`plan` picks."""
    return LEAVES[plan(impl, q, k, v, mask, terms).leaf](q, k, v, scale=scale, mask=mask, terms=terms)
