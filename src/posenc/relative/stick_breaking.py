"""Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-depth Study", ICLR 2025, arXiv:2410.17980): attention weights that carry
order by themselves, with no position encoding.

Query i breaks its stick at the keys before it, nearest first. With z_ij = s q_i·k_j (s =
1/sqrt(D), the attention's own scaled logit) and beta_ij = sigmoid(z_ij), key j takes the share
beta_ij of what the keys between it and the query have left:

    A_ij = beta_ij prod_{t=j+1}^{i-1} (1 - beta_it),   j < i,        o_i = sum_j A_ij v_j.

In log space (the reference's numerically stable form) log A_ij = z_ij + sum_{t=j}^{i-1}
log(1 - beta_it), since log beta = z + log(1 - beta): a logit term (the sum) on the ordinary
logits, whose exponentials are the weights themselves. So stick-breaking runs as posenc's
attention with a :class:`~posenc.terms.StickBreakingTerm`: the logits are log A_ij and the
weights exp(logits), rows summing to 1 - prod_t (1 - beta_it) <= 1 (the softmax of the same
logits times exp(logsumexp)).

What the reference code does, and posenc with it (``shawntan/stickbreaking-attention`` at
3147a38; flash-linear-attention's ``fla/ops/stickbreaking_attn/naive.py``, the same formula):

* The query's own key: ``stickbreaking_attention/sb_ref.py`` ``stickbreaking`` hides the pairs
  of its ``mask`` (``triu(0)``: the diagonal too unless ``attend_current``) by a log weight of
  -1e5 and breaks the stick over ``cum_weight = tril(-1)``, the keys strictly after j; the
  kernels ``sb_attn`` / ``sb_attn_varlen`` default to ``attend_current=False``, as the paper's
  "for each token before the current". ``attend_current=True`` lets the query's own key break
  the stick first: A_ij = beta_ij prod_{t=j+1}^{i} (1 - beta_it), j <= i.
* The rest of the stick, 1 - sum_j A_ij: the kernels return it apart from the output, ``(o,
  rem)``. The repository's tests (``tests/test_attn.py``) add ``rem * v_i``, the query's own
  value, to build their reference; the dolomite-engine model code its demo loads the 3B
  checkpoint with (``StickBreakingAttention``) adds ``rem`` times a learned per-head vector
  (``head_bias``) before a norm; flash-linear-attention's layer (``fla/layers/stickbreaking_attn.py``)
  drops it. posenc returns o = sum_j A_ij v_j, the kernels' output, and drops the rest, as
  FLA's layer: the other two uses are model choices above attention, not implemented here.

Which keys break the stick. Keys are ordered by their place in the stream (the queries being
the last Tq of the Tk keys), so a KV-cache step sees the cached keys as the full forward does;
between two tokens that see each other there is no padding and no other document, so packing
and padding need no mask here (as CoPE's counts). Stick-breaking is defined for causal
attention; for a key after its query (bidirectional use) posenc breaks a second stick from the
query forwards, the mirror image (a row's weights then sum to at most 2).

Backends: eager takes exp of the dense logits; the fused function (``impl="sdpa"``/``"auto"``
in training and prefill) computes the sums block by block of query rows from the block's own
logits, forward and backward, with no (Tq, Tk) tensor kept (:mod:`posenc.backends.stick_breaking`);
flex reads the dense term and scales its output by exp(logsumexp).

Shapes: q (B, H, Tq, D), k (B, H, Tk, D); breaks and weights (B, H, Tq, Tk).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..config import EncodingConfig
from ..encoding import PositionalEncoding, QKProjection
from ..literature import NOT_A_FEATURE_MAP
from ..registry import register
from ..terms import StickBreakingTerm

__all__ = ["StickBreaking", "StickBreakingConfig"]

TAN = "Tan et al. 2024 (stick-breaking attention)"


@dataclass
class StickBreakingConfig(EncodingConfig):
    """Config of :class:`StickBreaking`.

    Attributes:
        attend_current: the query's own key takes a share of the stick, first (the reference
            kernels' ``attend_current``); False, the default there and in the paper: only the
            keys before the query.
    """

    attend_current: bool = False


@register(
    "stick_breaking",
    family="relative",
    summary="stick-breaking attention: key j takes sigmoid(q·k) of the stick the keys after it leave; no positions",
    paper="Tan et al. 2024, Scaling Stick-Breaking Attention: An Efficient Implementation and In-depth Study",
    claims={
        "absolute": (False, f"{TAN}: the weights depend on the keys between j and i, no position ids"),
        "relative": (True, f"{TAN}: for identical tokens log A_ij = z - (i - j) softplus(z), a function of i - j"),
        "bounded": (False, f"{TAN}: every key between j and i lowers log A_ij by softplus(z) (ALiBi-like for "
                           "identical tokens)"),
        "decay": (True, f"{TAN}: the stick shrinks with every key between j and the query (a recency bias)"),
        "extrapolation": (True, f"{TAN}: no position ids, defined at every length"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
)
class StickBreaking(PositionalEncoding):
    """Stick-breaking attention as a content-dependent ``terms`` hook returning one
    :class:`~posenc.terms.StickBreakingTerm` (no parameters)."""

    Config = StickBreakingConfig

    def weights(self, q: Tensor, k: Tensor) -> Tensor:
        """The stick-breaking weights A_ij (B, H, Tq, Tk), float32 or wider, unmasked."""
        return self.terms(q, k, None)[0].weights()

    def terms(self, q: Tensor, k: Tensor, state: None, proj: QKProjection | None = None) -> list[StickBreakingTerm]:
        """log A_ij - z_ij = sum_{t=j}^{e_i} log(1 - sigmoid(z_it)) on the logits z_ij."""
        return [StickBreakingTerm(q, k, self.attention_scale(q.shape[-1]), self.config.attend_current)]
