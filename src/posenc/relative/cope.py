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

The term depends on q·k of every pair, so it is a :class:`~posenc.terms.DenseTerm`
(B, H, Tq, Tk): every backend takes it, none avoids the (Tq, Tk) tensor.

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
from ..terms import DenseTerm

__all__ = ["CopeConfig", "ContextualPosition", "contextual_positions"]

MAX_POSITIONS = 2**16


def contextual_positions(gates: Tensor) -> Tensor:
    """p_ij from gates g_it (B, H, Tq, Tk): the sum of g_it over the keys t from j to the
    query's stream index Tk - Tq + i (from that index to j for a key after it). Same shape."""
    Tq, Tk = gates.shape[-2:]
    s = torch.arange(Tk - Tq, Tk, device=gates.device)[:, None]  # (Tq, 1): each query's stream index
    t = torch.arange(Tk, device=gates.device)  # (Tk,)
    before = torch.where(t <= s, gates, 0.0)  # keys up to the query
    after = torch.where(t >= s, gates, 0.0)  # keys from the query on
    back = before.flip(-1).cumsum(-1).flip(-1)  # sum over t in [j, Tk): the paper's reversed cumsum
    fwd = after.cumsum(-1)  # sum over t in [0, j]
    return torch.where(t <= s, back, fwd)


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
    """CoPE as a content-dependent ``terms`` hook returning one :class:`~posenc.terms.DenseTerm`.

    ``pos_emb`` (max_pos, D): the integer positions' embeddings e[p], shared by the heads.
    """

    Config = CopeConfig

    def __init__(self, config: CopeConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        check_table_size("max_pos", config.max_pos, dims.head_dim, "head_dim")
        self.pos_emb = nn.Parameter(torch.randn(config.max_pos, dims.head_dim) * config.init_std)

    def positions(self, q: Tensor, k: Tensor) -> Tensor:
        """Contextual positions p_ij (B, H, Tq, Tk), clamped to max_pos - 1, float32 or wider."""
        dt = torch.promote_types(q.dtype, torch.float32)
        gates = torch.sigmoid((q.to(dt) @ k.to(dt).transpose(-1, -2)) * self.attention_scale(q.shape[-1]))
        return contextual_positions(gates).clamp(max=self.config.max_pos - 1)

    def terms(self, q: Tensor, k: Tensor, state: None, proj: QKProjection | None = None) -> list[DenseTerm]:
        """z_ij = q_i·e[p_ij], interpolated between the integer positions around p_ij."""
        dt = torch.promote_types(q.dtype, torch.float32)
        pos = self.positions(q, k)  # (B, H, Tq, Tk)
        per_position = q.to(dt) @ self.pos_emb.to(dt).t()  # (B, H, Tq, max_pos): q_i·e[p]
        lo, hi = pos.floor(), pos.ceil()
        w = pos - lo  # the gradient reaches the gates through w
        # A NaN q (a diverged model) makes NaN positions: read row 0 for them, and w, NaN too,
        # carries the NaN into the logits, as in every other encoding (NaN.long() is int64's minimum).
        z_lo = per_position.gather(-1, lo.nan_to_num(0.0).long())  # (B, H, Tq, Tk)
        z_hi = per_position.gather(-1, hi.nan_to_num(0.0).long())
        return [DenseTerm(z_hi * w + z_lo * (1 - w))]
