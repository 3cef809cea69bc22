"""Per-row data-dependent ALiBi: FoX-style forget gates that each query computes for itself.

From x-transformers (lucidrains), ``PerRowDataDependentAlibi`` in x_transformers/x_transformers.py
(the same class in release 2.31.10, which the tests run, and at commit
b8a9add6bb5eb6099e0755869d0caeeda4b1eb31 of github.com/lucidrains/x-transformers), enabled by ``attn_data_dependent_alibi=True, attn_data_dependent_alibi_per_row=True``. There
is no paper; its docstring calls it FoX's data-dependent ALiBi (Lin et al. 2025, "Forgetting
Transformer", :mod:`posenc.relative.fox`) with the gates "derived by queries and keys with a
small head dimension".

From the attention layer's input x_t, a bias-free linear map gives per head h a small gate
query u_t and gate key v_t (width d = ``dim_head``, 8 by default). Query i forgets token l
with the gate

    g_il = s · log sigmoid(u_i · v_l / sqrt(d))          (s = ``post_log_scale``, 1)

and the logit between query i and a key j <= i gains the gates of the tokens from the key up
to the token before the query:

    b_ij = sum_{l=j}^{i-1} g_il        (0 on the diagonal, <= 0 below it).

How it differs from FoX (b_ij = sum_{l=j+1}^{i} log f_l, f_l = sigmoid(w·x_l + b)):

* the gate of token l depends on the query too (u_i · v_l), so the bias is no longer c_i - c_j
  of one prefix sum per head: each query row has its own cumulative sum over the keys, O(Tq·Tk·d)
  work, not FoX's O(T) sums (the fused path computes it block by block, below);
* the summed tokens are shifted by one: from the key itself up to the token before the query
  (x-transformers masks the diagonal and sums in reverse), where FoX sums from the token after
  the key up to the query itself;
* the gate map has no bias (FoX's starts at 5, f ≈ 0.993), so at initialisation the gates sit
  near sigmoid(0) = 1/2 and the bias forgets quickly.

The exact relation: when every token's gate query is the same vector u (a query map that reads
only a constant input feature), g_il = log sigmoid(u · v_l / sqrt(d)) is a per-token gate f_l
and b_ij = sum_{l=j}^{i-1} log f_l, which is FoX with its gates read from the previous token's
input (f'_l = f_{l-1}) for every key at or before the query (tests/test_relative_per_row_alibi.py).

Keys after the query (bidirectional attention): x-transformers refuses them ("bidirectional not
supported yet"). posenc mirrors the causal rule instead of refusing, so every registered
encoding serves encoders: b_ij = sum_{l=i+1}^{j} g_il for j > i (the tokens after the query up
to and including the key, the reflection of j..i-1), with the same gates.

Which tokens count: i, j and l are stream indices (the queries are the last Tq of the Tk keys);
with documents contiguous in the stream and padding at the ends, every l between a query and a
key it sees is in the query's document, as in FoX. The KV cache keeps each layer's gate keys
v_l of its cached tokens (``QKProjection.memory``), so a decoding step sums over them; a
sliding cache keeps those of the keys it keeps, all a query needs (its sums stop at its keys).

The term: a :class:`~posenc.terms.StickTerm`, the log of what is left of a stick once the
tokens between key and query have each kept sigmoid(u_i·v_l/√d) of it, raised to the power s:
stick-breaking's sums (:mod:`posenc.relative.stick_breaking`, keep 1 - sigmoid of the
attention's own logits) with gates of their own, keep sigmoid(+y), and the query's own key
attended with the whole stick (b_ii = 0) instead of hidden (:func:`per_row_term`). The eager,
flex and decoding paths build its dense (B, H, Tq, Tk) form; the fused path
(:mod:`posenc.backends.stick_breaking`) sums it per block of query rows from the gate vectors,
forward and backward, and keeps no (Tq, Tk) tensor: its backward sends the gradient into the
(B, H, T, d) gate vectors.

Precision: gates and sums in float32 (float64 in a float64 model), as the module's output.

Shapes: x (B, t, C); gate queries and keys (B, H, t, d); bias (B, H, Tq, Tk).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import EncodingConfig, check_int, check_range
from ..encoding import Dims, PositionalEncoding, QKProjection, cached_entry, layer_input
from ..registry import register
from ..terms import StickRule, StickTerm

__all__ = ["PerRowAlibiConfig", "PerRowDataDependentAlibi", "per_row_bias", "per_row_term"]

#: The key of a layer's KV-cache dict holding the gate keys of its cached tokens, (B, H, T, d).
MEMORY_KEY = "per_row_alibi_gate_keys"
MAX_DIM_HEAD = 1024
MAX_POST_LOG_SCALE = 100.0
_XT = "x-transformers' PerRowDataDependentAlibi (lucidrains)"


def per_row_term(gate_q: Tensor, gate_k: Tensor, post_log_scale: float = 1.0) -> StickTerm:
    """The term of gate queries (B, H, Tq, d) against gate keys (B, H, Tk, d), the queries being
    the last Tq of the keys: sum_{l=j}^{i-1} g_il at or before the query, the mirror
    sum_{l=i+1}^{j} g_il after it, g = s·log sigmoid(u·v / sqrt(d)): log sigmoid(+y) (not
    stick-breaking's 1 - sigmoid), the query's own token breaking nothing and its own key
    attended (0 on the diagonal)."""
    rule = StickRule(negate=False, power=float(post_log_scale), attend_current=False, hide_current=False)
    return StickTerm(gate_q, gate_k, 1.0 / math.sqrt(gate_q.shape[-1]), rule)


def per_row_bias(gate_q: Tensor, gate_k: Tensor, post_log_scale: float = 1.0) -> Tensor:
    """The dense bias (B, H, Tq, Tk) of :func:`per_row_term`, float32 or wider."""
    return per_row_term(gate_q, gate_k, post_log_scale).dense(None, None)


@dataclass
class PerRowAlibiConfig(EncodingConfig):
    """Config of :class:`PerRowDataDependentAlibi`.

    Attributes:
        dim_head: d, the width of the gates' queries and keys, in [1, 1024]; 8 as x-transformers
            (``attn_data_dependent_alibi_per_row_dim_head``).
        post_log_scale: s, the factor on the log gates, in [0, 100]; 1 as x-transformers.
    """

    dim_head: int = 8
    post_log_scale: float = 1.0

    def validate(self) -> None:
        check_int("dim_head", self.dim_head, minimum=1, maximum=MAX_DIM_HEAD)
        check_range("post_log_scale", self.post_log_scale, 0.0, MAX_POST_LOG_SCALE)


@register(
    "per_row_alibi",
    family="relative",
    summary="data-dependent ALiBi with per-query gates: sum_{l=j}^{i-1} log sigmoid(u_i·v_l/sqrt(d)) of the layer input",
    paper="x-transformers (lucidrains), PerRowDataDependentAlibi: FoX's forget gates per query row",
    claims={
        "absolute": (False, _XT + ": no position ids; the logit gains gates of the tokens between j and i"),
        "relative": (True, _XT + ": for identical tokens every gate is the same, a function of i - j"),
        "bounded": (False, _XT + ": every gate below 1 between j and i adds to the (non-positive) bias"),
        "decay": (True, _XT + ": log sigmoid < 0, so keys further back are forgotten more"),
        "extrapolation": (True, _XT + ": no position ids, defined at every length"),
        "linear_attention": (False, _XT + ": a (Tq, Tk) bias of query-key gate products, not a feature map"),
    },
)
class PerRowDataDependentAlibi(PositionalEncoding):
    """Per-row data-dependent ALiBi as a ``terms`` hook returning one :class:`~posenc.terms.StickTerm`.

    ``gate``: ``nn.Linear(C, 2·H·d, bias=False)``, output features laid out as x-transformers'
    ``(qk h d)`` (gate queries first, then gate keys, heads major), so its weight loads as is.
    """

    Config = PerRowAlibiConfig

    def __init__(self, config: PerRowAlibiConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        self.gate = nn.Linear(dims.d_model, 2 * dims.num_heads * config.dim_head, bias=False)

    def gate_vectors(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Gate queries and keys (B, H, t, d) from the layer input x (B, t, C), float32 or wider."""
        dt = torch.promote_types(x.dtype, torch.float32)
        B, t = x.shape[:2]
        uv = F.linear(x.to(dt), self.gate.weight.to(dt))  # (B, t, 2·H·d)
        uv = uv.view(B, t, 2, self.dims.num_heads, self.config.dim_head).permute(2, 0, 3, 1, 4)  # (2, B, H, t, d)
        return uv[0], uv[1]

    @property
    def reads_layer_input(self) -> bool:
        return True

    def terms(self, q: Tensor, k: Tensor, state: Any, proj: QKProjection | None = None) -> list[StickTerm]:
        """The bias of the Tq queries against the Tk keys: the new tokens' gate vectors from
        ``proj.x``, the cached keys' gate keys from ``proj.memory`` (which receives those of all
        Tk keys). The queries are the last Tq of the keys."""
        Tq, Tk = q.shape[2], k.shape[2]
        x = layer_input(proj, "per_row_alibi", "forget gates", q, k, self.dims.d_model)
        memory, past, cached, held = cached_entry(proj, MEMORY_KEY, x.shape[1], Tk, -2, "per_row_alibi", "gate keys",
                                                  "gate keys")
        gate_q, gate_k = self.gate_vectors(x)  # (B, H, t, d) each
        if cached:
            gate_k = torch.cat([past[..., held - cached:, :], gate_k], dim=-2)  # (B, H, Tk, d)
        if memory is not None:
            memory[MEMORY_KEY] = gate_k
        return [per_row_term(gate_q[..., -Tq:, :], gate_k, self.config.post_log_scale)]
