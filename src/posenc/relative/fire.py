"""FIRE: functional interpolation for relative positions (Li et al. 2023, "Functional
Interpolation for Relative Positions Improves Long Context Transformers", ICLR 2024).

The bias of query position i for key position j is a learned function of a normalised
distance, one output per head:

    b_h(i, j) = f_theta( psi(i - j) / psi(max(L, i)) )_h,    psi(x) = log(c x + 1),

with f_theta a small MLP (1 -> width -> H, ReLU), c > 0 learned (psi amplifies short
distances), and L a learned threshold. Dividing by psi(i) ("progressive interpolation") maps
every distance a query can see into [0, 1], whatever the sequence length; the threshold L keeps
short prefixes from being stretched over the whole range. As in the paper's reference code,
c and L enter through their absolute values (L = |L_multiplier * init_L|, the multiplier
learned) and a small eps keeps the normaliser away from 0.

FIRE is defined for causal attention (j <= i). For a key after its query (j > i, seen only
in bidirectional use) psi takes |i - j|, as the reference code does: the bias is mirrored, and
FIRE alone cannot tell a key's side.

Shapes: positions (B, T); distances (B, Tq, Tk); bias (B or 1, H, Tq, Tk).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..limits import MAX_DISTANCE, Float32Params
from ..config import EncodingConfig, check_int, check_range
from ..encoding import Dims, PositionalEncoding
from ..literature import LEARNED, NOT_A_FEATURE_MAP, UNTRAINED
from ..positions import contiguous_offset, shared_rows
from ..registry import register
from ..terms import BiasTerm, DiagonalSums
from ._bias import bias_dtype

__all__ = ["FireConfig", "Fire", "FireBias", "fire_normalized_distance"]

MAX_MLP_WIDTH = 4096


def fire_normalized_distance(q_pos: Tensor, k_pos: Tensor, c: Tensor, L: Tensor, eps: float = 1e-6) -> Tensor:
    """psi(|i - j|) / (psi(max(L, i)) + eps) with psi(x) = log(c x + 1): (B, Tq, Tk) in c's dtype.

    ``c`` and ``L`` are 0-d tensors, used as given (positive; the module takes absolute values).
    """
    return _normalized(q_pos[:, :, None], k_pos[:, None, :], c, L, eps)


def _normalized(q_pos: Tensor, k_pos: Tensor, c: Tensor, L: Tensor, eps: float) -> Tensor:
    # The pointwise form: q_pos and k_pos broadcast (a score_mod passes 0-d tensors).
    dtype = c.dtype
    dist = (q_pos - k_pos).abs().to(dtype)
    i = torch.maximum(q_pos.to(dtype), L)  # the threshold L stretches short prefixes
    return torch.log1p(c * dist) / (torch.log1p(c * i) + eps)  # in [0, 1] for keys at or before i


#: Pairs up to which :class:`_FirePairs` gathers every head's slope and intercept in one call
#: along dim 1 of the (H, W + 1) tables; past it, one 1-D gather per head. H = 8, W = 32, two
#: threads: 9 against 45 us at 1024 pairs (a decoding step's row), 338 against 414 us at 65536,
#: 42 against 16 ms at 2^20.
_ONE_GATHER = 1 << 16


class _FirePairs(torch.autograd.Function):
    """FIRE's bias on every (query, key) pair, with a backward that keeps nothing per pair.

    Forward: x = psi(|i - j|) / (psi(max(L, i)) + eps) once per pair (it is the same for every
    head), its piece p = bucketize(x, knots), then ``slopes[p, h] * x + intercepts[p, h]`` per
    head. Backward recomputes x (from the positions, c and L) instead of keeping it through
    every layer's forward, and sums the gradient per piece with ``scatter_add_``: autograd's
    backward of the (W + 1, H) table gather is an accumulating ``index_put``, several times
    slower on CPU. The gradients of c and L come from autograd on the recomputed x, so they are
    torch's own (a query at exactly L splits max(L, i)'s gradient as torch does).
    """

    @staticmethod
    def forward(ctx, c: Tensor, L: Tensor, slopes: Tensor, intercepts: Tensor,
                q_pos: Tensor, k_pos: Tensor, knots: Tensor, eps: float) -> Tensor:
        # contiguous: positions may come strided (a transposed or expanded tensor), and so may x
        x = _normalized(q_pos[:, :, None], k_pos[:, None, :], c, L, eps).contiguous()  # (B, Tq, Tk)
        piece = torch.bucketize(x, knots).view(-1)  # knots[piece - 1] < x <= knots[piece]
        slope_rows, intercept_rows = slopes.t().contiguous(), intercepts.t().contiguous()  # (H, W + 1)
        heads, xf = slope_rows.shape[0], x.view(-1)
        if xf.shape[0] <= _ONE_GATHER:  # few pairs (a decoding step's row): one gather along dim 1
            rows = torch.addcmul(intercept_rows.index_select(1, piece), slope_rows.index_select(1, piece), xf)
        else:
            rows = x.new_empty(heads, xf.shape[0])  # (H, B·Tq·Tk)
            for h in range(heads):  # a 1-D gather per head: several times faster than along dim 1 of (H, W + 1)
                torch.addcmul(intercept_rows[h].index_select(0, piece), slope_rows[h].index_select(0, piece), xf,
                              out=rows[h])
        ctx.save_for_backward(c, L, slope_rows, q_pos, k_pos, knots)
        ctx.eps = eps
        return rows.view(heads, *x.shape).movedim(0, 1)  # (B, H, Tq, Tk), contiguous when B = 1

    @staticmethod
    def backward(ctx, grad: Tensor):
        c, L, slope_rows, q_pos, k_pos, knots = ctx.saved_tensors
        heads, pieces = slope_rows.shape
        with torch.enable_grad():
            c_, L_ = c.detach().requires_grad_(), L.detach().requires_grad_()
            x = _normalized(q_pos[:, :, None], k_pos[:, None, :], c_, L_, ctx.eps).contiguous()
        xf = x.detach().view(-1)
        piece = torch.bucketize(xf, knots)
        g = grad.movedim(1, 0).reshape(heads, -1)  # (H, N), pairs in x's order
        dx = torch.zeros_like(xf)  # the slope of each pair's piece, weighted by the heads' gradients
        for h in range(heads):
            dx.addcmul_(g[h], slope_rows[h].index_select(0, piece))
        index = piece.expand(heads, -1)  # per head, sums over the pairs of each piece
        dslopes = g.new_zeros(heads, pieces).scatter_add_(1, index, g * xf).t()
        dintercepts = g.new_zeros(heads, pieces).scatter_add_(1, index, g).t()
        dc, dL = torch.autograd.grad(x, (c_, L_), dx.view(x.shape))
        return dc, dL, dslopes, dintercepts, None, None, None, None


class _FireSums:
    """FIRE's dense-bias gradient taken block by block of query rows (``add(i0, block)``, a
    (1, H, rows, z) block of dL/dbias, the batch summed) straight onto the bias's parts, so no
    (Tq, Tk) gradient exists: rows below the Toeplitz boundary summed per diagonal into the
    per-distance values (:class:`~posenc.terms.DiagonalSums`), rows past it per
    piece into slopes and intercepts, and into dL/dx per pair, summed over the layers, which
    ``grads()`` takes through each block's x (recomputed with autograd, so c's and L's
    gradients are torch's own, as in :class:`_FirePairs`) into c and L.
    ``grads()``: those of (values, c, L, slopes, intercepts), in their dtypes. Besides the
    (H, W + 1) sums it keeps, per pair past the boundary, x and dL/dx: no heads."""

    def __init__(self, bias: "FireBias", q_pos: Tensor, k_pos: Tensor, rows: int, inputs: tuple[Tensor, ...],
                 dtype: torch.dtype) -> None:
        self.bias, self.q_pos, self.k_pos, self.rows, self.inputs, self.dtype = bias, q_pos, k_pos, rows, inputs, dtype
        _, c, L, slopes, _ = inputs
        pieces, heads = slopes.shape
        self.diagonals = DiagonalSums(heads, rows, k_pos.shape[1], dtype, q_pos.device) if rows else None
        self.slope_rows = slopes.detach().t().to(dtype).contiguous()  # (H, W + 1)
        self.knots = bias.pieces[0].detach()
        self.dslopes = torch.zeros(heads, pieces, dtype=dtype, device=q_pos.device)
        self.dintercepts = torch.zeros_like(self.dslopes)
        self.c_, self.L_ = c.detach().requires_grad_(), L.detach().requires_grad_()
        # per block of rows past the boundary, the same for every layer: x flat in the compute
        # dtype, and dL/dx summed over the layers so far
        self.blocks: dict[tuple[int, int, int], list[Tensor]] = {}

    def add(self, i0: int, block: Tensor) -> None:
        heads, n, z = block.shape[1:]
        below = min(max(self.rows - i0, 0), n)  # the block's rows in the Toeplitz part
        if below:
            self.diagonals.add(i0, block[:, :, :below])
        if below == n:
            return
        key = (i0 + below, i0 + n, z)
        if key not in self.blocks:
            xf = self._x(*key).detach().reshape(-1).to(self.dtype)
            self.blocks[key] = [xf, torch.zeros_like(xf)]
        xf, dx = self.blocks[key]
        piece = torch.bucketize(xf, self.knots)  # not kept: int64, twice x's bytes, and cheap
        g = block[0, :, below:].reshape(heads, -1)  # (H, pairs) in x's order
        for h in range(heads):
            dx.addcmul_(g[h], self.slope_rows[h].index_select(0, piece))
        index = piece.expand(heads, -1)
        self.dslopes.scatter_add_(1, index, g * xf)
        self.dintercepts.scatter_add_(1, index, g)

    def _x(self, r0: int, r1: int, z: int) -> Tensor:
        """x of rows r0 .. r1 against keys 0 .. z (1, rows, z), from c and L as autograd leaves."""
        return _normalized(self.q_pos[:, r0:r1, None], self.k_pos[:, None, :z], self.c_, self.L_, self.bias.eps)

    def grads(self) -> tuple[Tensor, ...]:
        values, c, L, slopes, intercepts = self.inputs
        dvalues = self.diagonals.values.to(values.dtype) if self.diagonals is not None else None
        dc, dL = torch.zeros_like(c), torch.zeros_like(L)
        for key, (_, dx) in self.blocks.items():  # c's and L's gradients through each block's x, once
            with torch.enable_grad():
                x = self._x(*key)
            gc, gl = torch.autograd.grad(x, (self.c_, self.L_), dx.view(x.shape).to(x.dtype))
            dc, dL = dc + gc, dL + gl
        return dvalues, dc, dL, self.dslopes.t().to(slopes.dtype), self.dintercepts.t().to(intercepts.dtype)


@dataclass(frozen=True, eq=False)
class FireBias(BiasTerm):
    """FIRE's bias, whose dense form is Toeplitz for the queries at or below the threshold L.

    b(i, j) depends on |i - j| and max(L, i) only, so every query at a position <= L has the
    same normaliser psi(L) (strictly below L): for contiguous positions those rows form a Toeplitz block, from one
    evaluation per distance (as T5's and ALiBi's whole bias does), and only the rows past L
    evaluate every pair. Training at lengths <= L is then all Toeplitz: no (Tq, Tk) pass of the
    piecewise-linear lookup, whose backward scatters into a (W + 1, H) table from every pair.
    """

    threshold: Tensor | None = None  # L, a 0-d float tensor
    c: Tensor | None = None  # 0-d, positive
    eps: float = 0.0
    pieces: tuple[Tensor, Tensor, Tensor] | None = None  # knots (W,), slopes and intercepts (W + 1, H)

    def all_pairs(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``fn`` on every pair (:class:`_FirePairs`): (B|1, H, Tq, Tk). Under torch.compile,
        ``fn`` itself: the compiler fuses it, and does not trace a backward that calls autograd."""
        if self.c is None or self.threshold is None or self.pieces is None or torch.compiler.is_compiling():
            return super().all_pairs(q_pos, k_pos)
        knots, slopes, intercepts = self.pieces
        bias = _FirePairs.apply(self.c, self.threshold, slopes, intercepts, q_pos, k_pos, knots, self.eps)
        return bias.contiguous()

    def block_sums(self, q_pos: Tensor, k_pos: Tensor) -> tuple[tuple[Tensor, ...], Callable] | None:
        """The dense form's parts (the Toeplitz rows' per-distance values, c, L, slopes and
        intercepts) and an accumulator (:class:`_FireSums`) that maps each block of the dense
        gradient onto them: the Toeplitz rows summed per diagonal, the rows past L per piece,
        as :class:`_FirePairs`' backward does for all pairs at once. For one row of contiguous
        positions shared by the batch; else None (the dense gradient)."""
        q_pos, k_pos = shared_rows(q_pos, k_pos)
        s = contiguous_offset(q_pos, k_pos) if q_pos.shape[0] == 1 and k_pos.shape[0] == 1 else None
        if s is None or self.threshold is None or self.c is None or self.pieces is None or torch.compiler.is_compiling():
            return None
        rows = self._toeplitz_rows(q_pos)
        tk = k_pos.shape[1]
        knots, slopes, intercepts = self.pieces
        values = self._per_distance(s, rows, tk, q_pos.device, query=q_pos[0, 0]) if rows else slopes.new_zeros(1, 0, 0)
        inputs = (values, self.c, self.threshold, slopes, intercepts)

        def make(dtype: torch.dtype) -> _FireSums:
            return _FireSums(self, q_pos, k_pos, rows, inputs, dtype)

        return inputs, make

    def _toeplitz_rows(self, q_pos: Tensor) -> int:
        """How many of the queries (one row of contiguous positions) lie strictly below L."""
        threshold = float(self.threshold.detach())
        if not math.isfinite(threshold):
            raise ValueError(f"FIRE's threshold L = |L_multiplier * init_L| must be finite, got {threshold} "
                             "(a non-finite L_multiplier parameter: a diverged update, or one set by hand)")
        return min(max(math.ceil(threshold) - int(q_pos[0, 0]), 0), q_pos.shape[1])

    def dense(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        q_pos, k_pos = shared_rows(q_pos, k_pos)
        s = contiguous_offset(q_pos, k_pos) if q_pos.shape[0] == 1 and k_pos.shape[0] == 1 else None
        if s is None or self.threshold is None:
            return self.all_pairs(q_pos, k_pos)
        tq, tk = q_pos.shape[1], k_pos.shape[1]
        # Positions q0, q0 + 1, ...: the rows strictly below L share psi(L) (a row at L itself
        # is a tie of max(L, i), whose gradient torch splits; it stays with the pairs).
        q0 = q_pos[0, 0]
        rows = self._toeplitz_rows(q_pos)
        if rows == 0:
            return self.all_pairs(q_pos, k_pos)
        # One evaluation per distance d at the pair (q0, q0 - d), whose query has the block's normaliser.
        below = self._toeplitz(s, rows, tk, q_pos.device, query=q0)  # (1, H, rows, Tk)
        if rows == tq:
            return below
        return torch.cat([below, self.all_pairs(q_pos[:, rows:], k_pos)], dim=-2)  # (1, H, Tq, Tk)


@dataclass
class FireConfig(EncodingConfig):
    """Bounds, chosen so the bias is finite in float32 for every position below 2^40:

    * ``mlp_width`` in [1, 4096]: the piecewise-linear form builds (width + 1, width) tables;
    * ``init_c`` in [1e-6, 1e6]: c * distance stays below float32's 3.4e38 (init_c = 1e308 is
      inf in float32: NaN logits), and c * L above float32's underflow, so psi(L) > 0 even
      with eps = 0;
    * ``init_L`` in [1e-3, 2^40] (a length in tokens); ``eps`` in [0, 1].
    """

    mlp_width: int = 32
    init_c: float = 0.1
    init_L: float = 512.0  # threshold L at init (a length in tokens)
    eps: float = 1e-6

    def validate(self) -> None:
        check_int("mlp_width", self.mlp_width, minimum=1, maximum=MAX_MLP_WIDTH)
        check_range("init_c", self.init_c, 1e-6, 1e6)
        check_range("init_L", self.init_L, 1e-3, float(MAX_DISTANCE))
        check_range("eps", self.eps, 0.0, 1.0)


@register(
    "fire",
    family="relative",
    summary="per-head MLP of the log-normalised distance psi(i-j)/psi(max(L,i)) on the logits",
    paper="Li et al. 2023, Functional Interpolation for Relative Positions Improves Long Context Transformers",
    claims={
        "absolute": (False, "Li et al. 2023: f(psi(i - j) / psi(max(i, L))): i enters only beyond L"),
        "relative": (True, "Li et al. 2023: relative within the threshold L"),
        "bounded": (True, "an MLP of a normalised distance in [0, 1] (Li et al. 2023)"),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, "Li et al. 2023: progressive interpolation"),
        "linear_attention": (False, NOT_A_FEATURE_MAP),
    },
)
class Fire(Float32Params, PositionalEncoding):
    """Logit bias ``MLP(psi(|i-j|) / psi(max(L, i)))`` with one output per head."""

    Config = FireConfig
    # c and L set the log scale of every distance: a bfloat16 L (512 -> 2 tokens off) or c
    # would move the bias of every pair. Two scalars, so kept float32 at no cost.
    float32_params = ("c", "L_multiplier")

    def __init__(self, config: FireConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        self.fc1 = nn.Linear(1, config.mlp_width)
        self.fc2 = nn.Linear(config.mlp_width, dims.num_heads)
        self.c = nn.Parameter(torch.tensor(config.init_c))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))

    def mlp(self, x: Tensor) -> Tensor:
        """f_theta: (...,) normalised distances -> (..., H), computed in x's dtype.

        The weights are cast to x's dtype (float32 at least) so a bfloat16 model does not
        round the distances, which differ by less than bfloat16's resolution far from the query.
        """
        w1, b1 = self.fc1.weight.to(x.dtype), self.fc1.bias.to(x.dtype)
        w2, b2 = self.fc2.weight.to(x.dtype), self.fc2.bias.to(x.dtype)
        return F.linear(F.relu(F.linear(x[..., None], w1, b1)), w2, b2)

    def mlp_pieces(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """f_theta as the piecewise-linear function it is: (knots (W,), slopes (W+1, H), intercepts (W+1, H)).

        A ReLU MLP of one scalar input is linear between the points ``x = -b1_k / w1_k`` where
        a hidden unit switches on or off. On piece s (``knots[s-1] < x <= knots[s]``, sorted),
        ``f(x) = slopes[s] * x + intercepts[s]``, with unit k active when its knot lies below the
        piece and ``w1_k > 0``, or above it and ``w1_k < 0``; a unit with ``w1_k = 0`` is the
        constant relu(b1_k). At a knot the unit is 0 either way, so both pieces agree there.
        """
        w1, b1 = self.fc1.weight[:, 0].to(dtype), self.fc1.bias.to(dtype)  # (W,) each
        w2, b2 = self.fc2.weight.to(dtype), self.fc2.bias.to(dtype)  # (H, W), (H,)
        flat = w1 == 0
        knots_unsorted = torch.where(flat, torch.inf, -b1 / torch.where(flat, 1.0, w1))  # (W,)
        knots, order = knots_unsorted.sort()
        rank = order.argsort()  # (W,) position of each unit's knot among the sorted knots
        piece = torch.arange(w1.shape[0] + 1, device=w1.device)[:, None]  # (W+1, 1)
        active = torch.where(flat, b1 > 0, torch.where(w1 > 0, rank < piece, rank >= piece))  # (W+1, W)
        active = active.to(dtype)
        return knots, (active * w1) @ w2.T, (active * b1) @ w2.T + b2

    def logit_bias_cached(self, q_pos: Tensor, k_pos: Tensor, memo: dict) -> BiasTerm:
        """Decoding: :meth:`logit_bias` made once per cache and kept in ``memo`` (its
        piecewise-linear pieces, a sort and two matrix products, depend on the parameters only;
        a step evaluates its query row from them)."""
        term = memo.get("fire_term")
        if term is None:
            term = memo["fire_term"] = self.logit_bias()
        return term

    def logit_bias(self) -> BiasTerm:
        dtype = bias_dtype(*self.parameters())
        c = self.c.to(dtype).abs()
        L = (self.L_multiplier.to(dtype) * self.config.init_L).abs()
        eps = self.config.eps
        # Evaluating the MLP on every pair would build a (B, Tq, Tk, W) hidden tensor (1 GiB at
        # T = 2048), and a score_mod cannot reduce over W; as the piecewise-linear function it
        # is, it is a bucketize, a lookup and a multiply-add per head, pointwise.
        knots, slopes, intercepts = self.mlp_pieces(dtype)

        def fn(h: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
            x = _normalized(q_pos, k_pos, c, L, eps)
            piece = torch.bucketize(x, knots)  # knots[piece - 1] < x <= knots[piece]
            return slopes[piece, h] * x + intercepts[piece, h]

        return FireBias(fn, self.dims.num_heads, toeplitz=False, threshold=L, c=c, eps=eps,
                        pieces=(knots, slopes, intercepts))
