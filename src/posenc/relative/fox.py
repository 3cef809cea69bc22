"""FoX: the Forgetting Transformer (Lin et al. 2025, "Forgetting Transformer: Softmax Attention
with a Forget Gate", ICLR 2025, arXiv:2503.02130), i.e. data-dependent ALiBi.

Every token t opens, per head h, a scalar forget gate computed from the attention layer's input
x_t (the normed hidden state, the tokens whose q and k the layer makes):

    f_t = sigmoid(w_h · x_t + b_h)

and the logit between query i and a key j <= i gains the log of the gates between them:

    d_ij = sum_{l=j+1}^{i} log f_l = c_i - c_j,    c_t = sum_{l<=t} log f_l.

d_ij <= 0 and d_ii = 0: a key is forgotten by the gates of the tokens after it. With one
constant gate f it is ALiBi with slope -log f; learned gates make the decay data dependent.
The bias is rank structured, so it is a :class:`~posenc.terms.PrefixSumTerm`: FlexAttention's
``score_mod`` and the fused blockwise function read the (B, H, T) sums c (the fused backward
returns their gradients as row and column sums, O(T) memory); only the eager reference builds
the (Tq, Tk) difference.

The convention is x-transformers' ``DataDependentAlibi`` (``attn_data_dependent_alibi=True``,
tested on the same weights): c is the inclusive cumulative sum over the stream, the gate's
bias starts at ``bias_init`` = 5 (f ≈ 0.993: little forgetting at init) and its weight at
``nn.Linear``'s default. Bidirectional attention: with ``backward_gates`` a second gate set g
serves keys after the query, d_ij = sum_{l=i+1}^{j} log g_l (x-transformers' non-causal form);
without it the same gates do (the mirror image, d_ij = c_j - c_i).

Which tokens count. i and j are stream indices (the queries are the last Tq of the Tk keys,
as in the mask), never position ids. Between two tokens that see each other there is no
other document and no padding when documents are contiguous in the stream (packing with
``SequenceInfo.from_cu_seqlens``) and padding sits at the ends of a row, so the cumulative
sum need not restart per document: c_i - c_j only ever sums gates of the query's own
document (tests/test_fox.py: packed == separate).

Layers and the KV cache. The gates are this module's parameters: the paper gives every layer
its own, which is ``ModelConfig(..., share_encoding=False)`` (a shared spec ties the gate
weights across layers; the gates still differ per layer, as their inputs do). A decoding step
needs c at the cached keys: each layer keeps its own sums in its KV-cache slot
(``QKProjection.memory``, ``KVCache.layer_state``), continuing from the last one.

Precision: log-gates and sums are float32 (float64 in a float64 model). c_i - c_j then loses
about eps·|c_i| (about 1e-3 at |c| = 1e4, strongly forgetting gates over thousands of tokens),
as in x-transformers and the paper's kernels.

Shapes: x (B, Tq, C); q (B, H, Tq, D), k (B, H, Tk, D); gates and sums (B, H, T).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import EncodingConfig, check_range
from ..encoding import Dims, PositionalEncoding, QKProjection, cached_entry, layer_input
from ..registry import register
from ..terms import PrefixSumTerm

__all__ = ["FoxConfig", "ForgettingGate", "prefix_sums"]

#: The key of a layer's KV-cache dict holding c at its cached keys, (B, G·H, T).
MEMORY_KEY = "fox_prefix_sums"
#: |bias_init| bound: sigmoid(±50) is 1 - 2e-22 and 2e-22, past float32's resolution of 1 - f.
MAX_BIAS_INIT = 50.0


def prefix_sums(log_gates: Tensor, past: Tensor | None = None) -> Tensor:
    """c_t = sum_{l<=t} log f_l over the last axis, continuing from ``past``'s last sum
    (the cached keys' sums, (..., Tc)) when given: (..., Tc + T), ``past`` first."""
    if past is None or past.shape[-1] == 0:
        return log_gates.cumsum(-1)
    return torch.cat([past, past[..., -1:] + log_gates.cumsum(-1)], dim=-1)


@dataclass
class FoxConfig(EncodingConfig):
    """Config of :class:`ForgettingGate`.

    Attributes:
        bias_init: initial bias b_h of every gate, in [-50, 50]; 5 (x-transformers): f ≈ 0.993.
        backward_gates: a second gate set for keys after the query in bidirectional attention
            (x-transformers' non-causal form); False: the same gates serve both directions.
    """

    bias_init: float = 5.0
    backward_gates: bool = False

    def validate(self) -> None:
        check_range("bias_init", self.bias_init, -MAX_BIAS_INIT, MAX_BIAS_INIT)


@register(
    "fox",
    family="relative",
    summary="forgetting transformer: data-dependent ALiBi, sums of log sigmoid forget gates of the layer input",
    paper="Lin et al. 2025, Forgetting Transformer: Softmax Attention with a Forget Gate",
    claims={
        "absolute": (False, "Lin et al. 2025: no position ids; the logit gains the log forget gates between j and i"),
        "relative": (True, "Lin et al. 2025: sum_{l=j+1}^{i} log f_l; for identical tokens a function of i - j"),
        "bounded": (False, "Lin et al. 2025: the bias is non-positive and data dependent, and every gate below 1 "
                           "between j and i adds to it (ALiBi's linear penalty for a constant gate)"),
        "decay": (True, "Lin et al. 2025: log f_l < 0, so keys further back are forgotten more"),
        "extrapolation": (True, "Lin et al. 2025: no position ids, defined at every length"),
        "linear_attention": (False, "Lin et al. 2025: a forget gate on softmax logits; its linear-attention "
                                    "counterpart is a gated recurrence (GLA, Mamba-2), not a feature map"),
    },
)
class ForgettingGate(PositionalEncoding):
    """FoX as a content-dependent ``terms`` hook returning one :class:`~posenc.terms.PrefixSumTerm`.

    ``gate``: ``nn.Linear(C, H)`` (``C, 2H`` with ``backward_gates``: forward heads first), the
    forget gates' logits from the layer input.
    """

    Config = FoxConfig

    def __init__(self, config: FoxConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        sets = 2 if config.backward_gates else 1
        self.gate = nn.Linear(dims.d_model, sets * dims.num_heads)
        nn.init.constant_(self.gate.bias, config.bias_init)

    def log_gates(self, x: Tensor) -> Tensor:
        """log f (B, G·H, T) from the layer input x (B, T, C), float32 or wider (G = 2 with
        ``backward_gates``, forward heads first)."""
        dt = torch.promote_types(x.dtype, torch.float32)
        logits = F.linear(x.to(dt), self.gate.weight.to(dt), self.gate.bias.to(dt))  # (B, T, G·H)
        return F.logsigmoid(logits).transpose(1, 2)  # (B, G·H, T)

    @property
    def reads_layer_input(self) -> bool:
        return True

    def terms(self, q: Tensor, k: Tensor, state: Any, proj: QKProjection | None = None) -> list[PrefixSumTerm]:
        """c at the queries and the keys: the new keys' gates from ``proj.x``, the cached keys'
        sums from ``proj.memory`` (which receives the sums of all Tk keys). The queries are the
        last Tq of the keys (self-attention; cross-attention as decoding sees it)."""
        Tq, Tk = q.shape[2], k.shape[2]
        x = layer_input(proj, "fox", "forget gates", q, k, self.dims.d_model)
        memory, past, cached, held = cached_entry(proj, MEMORY_KEY, x.shape[1], Tk, -1, "fox", "forget gates", "sums")
        c = prefix_sums(self.log_gates(x), None if past is None else past[..., held - cached:])  # (B, G·H, Tk)
        if memory is not None:
            memory[MEMORY_KEY] = c
        H = self.dims.num_heads
        fwd = c[:, :H]  # (B, H, Tk)
        after = (c[:, H:, -Tq:], c[:, H:]) if self.config.backward_gates else None
        return [PrefixSumTerm(fwd[..., -Tq:], fwd, after)]
