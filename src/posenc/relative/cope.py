"""CoPE: contextual position encoding (Golovneva et al. 2024, "Contextual Position Encoding:
Learning to Count What's Important", arXiv:2405.18719, eq. 3-5 and appendix B).

Positions are counted in context-dependent units instead of tokens. For a query i and a key
j <= i, each key t between them opens a gate ``g_it = sigmoid(s q_i·k_t)`` (s = 1/sqrt(D), the
attention's own scaled logit), and the position of j seen from i is the sum of those gates:

    p_ij = sum_{t=j}^{i} g_it              (a fraction: counts "units" the gates select),

clamped to ``max_pos - 1``. The position's embedding is interpolated between the integer
embeddings e[0..max_pos) (learned, (max_pos, D), shared by the heads), and the logit gains

    z_ij = q_i · e[p_ij] = (1 - w) q_i·e[floor p_ij] + w q_i·e[ceil p_ij],  w = p_ij - floor p_ij,

computed from the (Tq, max_pos) products q_i·e[p] as the paper's code does. z is not scaled
by s (the paper's code and x-transformers' ``attn_use_cope`` add it to the scaled logits
as it is). e starts at zero, as in the paper.

Which keys count. Keys are counted by their place in the stream (``t`` between ``j`` and the
query's own index, the queries being the last Tq of the Tk keys), so a KV-cache step counts
the cached keys as the full forward does; between two tokens that see each other there is no
padding and no other document, so packing and padding need no mask here. CoPE is defined for
causal attention; for a key after its query (bidirectional use) posenc counts the keys from
the query to that key, the mirror image of the causal count.

The paper's variants "soft one-hot" positions and talking-heads gates (x-transformers
``cope_soft_onehot_pos``, ``cope_talking_heads``) are not implemented.

The term depends on q·k of every pair and on a scan over the keys, so it is a
:class:`~posenc.terms.CountTerm`: the eager and flex paths build its (B, H, Tq, Tk) tensor;
the fused path (:func:`posenc.backends.fused.fused_attention`, what ``impl="sdpa"`` and
``"auto"`` take on CPU in training and prefill) computes it block by block of query rows,
forward and backward, so no (Tq, Tk) tensor is kept across layers, and counts only as far
back as a block's counts stay below ``max_pos - 1``.

Shapes: q (B, H, Tq, D), k (B, H, Tk, D); gates and positions (B, H, Tq, Tk).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_int, check_range
from ..encoding import Dims, PositionalEncoding, QKProjection
from ..limits import MAX_INIT_STD, check_table_size
from ..literature import LEARNED, NOT_A_FEATURE_MAP, UNTRAINED
from ..registry import register
from ..terms import CountTerm, contextual_positions

__all__ = ["CopeConfig", "ContextualPosition", "contextual_positions"]

MAX_POSITIONS = 2**16


@dataclass
class CopeConfig(EncodingConfig):
    """Config of :class:`ContextualPosition`.

    Attributes:
        max_pos: how many integer positions have an embedding, in [1, 65536]; contextual
            positions are clamped to max_pos - 1 (x-transformers' default: 16).
        init_std: std of the embeddings' normal init, in [0, 1e4]; 0 (the paper's zeros).
    """

    max_pos: int = 16
    init_std: float = 0.0

    def validate(self) -> None:
        check_int("max_pos", self.max_pos, minimum=1, maximum=MAX_POSITIONS)
        check_range("init_std", self.init_std, 0.0, MAX_INIT_STD)


@register(
    "cope",
    family="relative",
    summary="contextual positions: sums of sigmoid(q·k) gates, interpolated embeddings on the logits",
    paper="Golovneva et al. 2024, Contextual Position Encoding: Learning to Count What's Important",
    claims={
        "absolute": (False, "Golovneva et al. 2024: a count of gated keys between j and i, no absolute position"),
        "relative": (UNTRAINED, "Golovneva et al. 2024: the count depends on learned gates and embeddings"),
        "bounded": (True, "positions clamped to max_pos - 1 of a finite table (Golovneva et al. 2024)"),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, "the clamp makes every count valid"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
)
class ContextualPosition(PositionalEncoding):
    """CoPE as a content-dependent ``terms`` hook returning one :class:`~posenc.terms.CountTerm`.

    ``pos_emb`` (max_pos, D): the integer positions' embeddings e[p], shared by the heads.
    """

    Config = CopeConfig

    def __init__(self, config: CopeConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        check_table_size("max_pos", config.max_pos, dims.head_dim, "head_dim")
        self.pos_emb = nn.Parameter(torch.randn(config.max_pos, dims.head_dim) * config.init_std)

    def positions(self, q: Tensor, k: Tensor) -> Tensor:
        """Contextual positions p_ij (B, H, Tq, Tk), clamped to max_pos - 1, float32 or wider."""
        return self.terms(q, k, None)[0].positions()

    def terms(self, q: Tensor, k: Tensor, state: None, proj: QKProjection | None = None) -> list[CountTerm]:
        """z_ij = q_i·e[p_ij], interpolated between the integer positions around p_ij."""
        return [CountTerm(q, k, self.pos_emb, self.attention_scale(q.shape[-1]))]
