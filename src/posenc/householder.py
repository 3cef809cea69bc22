"""Products of per-token Householder-like matrices between a key and its query: the logits
of PaTH (Yang et al. 2025, arXiv:2505.16381; :mod:`posenc.relative.path_attention` makes the
matrices from a layer's input and says where each convention comes from).

Token t carries H_t = I - β_t w_t w_tᵀ (|w_t| = 1, β_t in (0, 2)), and a query i sees a key
j <= i through the product of the matrices after the key, up to and including the query:

    logit_ij = q_iᵀ P_ij k_j,    P_ij = H_i H_{i-1} ⋯ H_{j+1}    (P_ii = I);

a key after its query (bidirectional use) through the mirror, P_ij = H_{i+1} ⋯ H_j.

Everything here works on chunks of n tokens, whose product has the compact "UT transform" form
of the paper's training algorithm (FLA's reference, ``fla/ops/path_attn/naive.py``, builds the
same triangular factor): for a chunk [a, b), H_{b-1} ⋯ H_a = I - Wᵀ R, where the rows of R
solve the unit lower triangular system (I + diag(β) tril₋₁(W Wᵀ)) R = diag(β) W. The same
system with right-hand side diag(β) tril₋₁(W Kᵀ) gives S, and with it (:func:`chunk_pieces`):

* the chunk's own logits, q_iᵀ P_ij k_j = q_i·k_j - Σ_{l<=i} (q_i·w_l) S_lj for j <= i in it;
* its keys carried to its end, K - Sᵀ W (row j: H_{b-1} ⋯ H_{j+1} k_j);
* its queries carried back to its start, Q - tril(Q Wᵀ) R (row i: H_a ⋯ H_i q_i).

Two ways through the chunks, both O(Tq·Tk·D) work:

* :func:`path_scan` carries keys forwards: every key so far, carried to the current chunk
  (k̃ <- k̃ - (k̃ Rᵀ) W per chunk), O(T·D) state. A KV cache keeps that state, so a decoding
  step costs one rank-one update per cached key.
* a query carried backwards through the chunks before its own (q̃ <- q̃ (I - Wᵀ R)) meets
  each earlier chunk's keys carried to that chunk's end: the attention of
  :mod:`posenc.backends.householder_flash`, chunk pairs at one distance at a time, with no
  (Tq, Tk) tensor.

Precision is the caller's: these functions compute in the dtype they are given (PaTH's
encoding gives float32 or wider: a bfloat16 product of Householders drifts with every token).
Shapes: q (..., Tq, D), k (..., Tk, D), w (..., Tk, D), beta (..., Tk).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["CHUNK", "FOLD", "CarriedKeys", "ChunkPieces", "carried_keys", "chunk_pieces", "mirror_logits", "path_logits", "path_scan"]

#: Tokens per chunk (FLA's reference uses 64): the UT transform's triangular system is chunk x
#: chunk; a scan takes ceil(T / chunk) steps.
CHUNK = 64


def _ut_transform(W: Tensor, K: Tensor, beta: Tensor, inverse: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """R (..., n, D) and S (..., n, n) of chunks W, K (..., n, D), beta (..., n): the product of
    the chunk's matrices is I - Wᵀ R (:func:`_product`), and its keys carried to its end are
    K - Sᵀ W; and the inverse (..., n, n) of the chunks' unit lower triangular system. Given
    ``inverse`` (an earlier call's on the same inputs: a backward's recompute), no triangular
    solve is done and the gradient reaches the system through :class:`_KnownInverse`."""
    n, D = W.shape[-2:]
    below = torch.ones(n, n, dtype=torch.bool, device=W.device).tril(-1)  # l > l'
    G = (W @ torch.cat([W, K], dim=-2).mT).masked_fill(~below.repeat(1, 2), 0)  # (..., n, 2n): W Wᵀ, W Kᵀ
    eye = torch.eye(n, dtype=W.dtype, device=W.device)
    system = eye + beta[..., None] * G[..., :n]
    if inverse is None:
        inverse = torch.linalg.solve_triangular(system, eye.expand_as(system), upper=False, unitriangular=True)
        known = inverse
    else:
        known = _KnownInverse.apply(system, inverse)
    sol = known @ (beta[..., None] * torch.cat([W, G[..., n:]], dim=-1))  # (..., n, D + n)
    return sol[..., :D], sol[..., D:], inverse.detach()


def _product(W: Tensor, R: Tensor) -> Tensor:
    """A chunk's H_{b-1} ⋯ H_a = I - Wᵀ R (..., D, D) from its W and R (..., n, D)."""
    return torch.eye(W.shape[-1], dtype=W.dtype, device=W.device) - W.mT @ R


def path_scan(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, carried: Tensor | None = None, *,
              chunk: int = CHUNK) -> tuple[Tensor, Tensor]:
    """The causal PaTH logits q_iᵀ H_i ⋯ H_{j+1} k_j, and every key carried to the last token.

    ``k`` (..., t, D) are new keys with their unit ``w`` (..., t, D) and ``beta`` (..., t);
    ``q`` (..., Tq, D) the queries, the last Tq of the new keys' tokens; ``carried``
    (..., c, D) the c earlier keys, each already multiplied by every Householder up to the last
    earlier token (None: no earlier keys). Returns the logits (..., Tq, c + t), 0 for a key
    after its query, and the c + t keys carried to the last new token (the next call's
    ``carried``). All in the dtype of the inputs (float32 or wider).
    """
    *lead, Tq, D = q.shape
    t = k.shape[-2]
    if carried is None:
        carried = k[..., :0, :]  # (..., 0, D)
    o = t - Tq  # the first query's index among the new tokens
    rows = []
    for a in range(0, t, chunk):
        b = min(a + chunk, t)
        n = b - a
        W, K = w[..., a:b, :], k[..., a:b, :]  # (..., n, D)
        R, S, _ = _ut_transform(W, K, beta[..., a:b])  # H_{b-1}⋯H_a = I - WᵀR; (..., n, n): S_lj
        first = max(a, o)
        if first < b:  # queries in this chunk, at local positions first - a .. n - 1
            Qc = q[..., first - o : b - o, :]  # (..., m, D)
            seen = torch.arange(n, device=q.device) <= torch.arange(first - a, n, device=q.device)[:, None]  # (m, n)
            QW = (Qc @ W.mT).masked_fill(~seen, 0)  # q_i·w_l for l <= i
            own = (Qc @ K.mT - QW @ S).masked_fill(~seen, 0)  # (..., m, n): keys of the chunk up to the query
            back = Qc - QW @ R  # (..., m, D): H_a ⋯ H_i q_i
            rows.append(F.pad(torch.cat([back @ carried.mT, own], dim=-1), (0, t - b)))  # (..., m, c + t)
        carried = torch.cat([carried - (carried @ R.mT) @ W, K - S.mT @ W], dim=-2)  # (..., c + b, D)
    if not rows:
        return q.new_zeros(*lead, Tq, carried.shape[-2]), carried
    return torch.cat(rows, dim=-2), carried


def path_logits(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, *, chunk: int = CHUNK) -> Tensor:
    """q_iᵀ P_ij k_j (..., Tq, Tk) of the queries (the last Tq of the Tk keys) against every key:
    P_ij = H_i ⋯ H_{j+1} for j <= i, and the mirror H_{i+1} ⋯ H_j for j > i. ``w`` (..., Tk, D)
    unit vectors and ``beta`` (..., Tk) of every key's token."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    causal, _ = path_scan(q, k, w, beta, chunk=chunk)
    if Tq < 2:
        return causal  # no key after a query
    return causal + F.pad(mirror_logits(q, k[..., Tk - Tq:, :], w[..., Tk - Tq:, :], beta[..., Tk - Tq:], chunk=chunk),
                          (Tk - Tq, 0))


def mirror_logits(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, *, chunk: int = CHUNK) -> Tensor:
    """q_iᵀ H_{i+1} ⋯ H_j k_j for the keys j > i among n tokens (q, k, w (..., n, D), beta
    (..., n): queries and keys of the same tokens), (..., n, n), 0 on and below the diagonal."""
    # Reversed, the tokens between a key j > i and its query are j..i+1 counted back: the causal
    # rule with each token's matrix taken from the token before it in the reversed stream (the
    # first reversed token's is never used: beta 0, the identity).
    wr, br = w.flip(-2), beta.flip(-1)
    wr = torch.cat([torch.zeros_like(wr[..., :1, :]), wr[..., :-1, :]], dim=-2)
    br = torch.cat([torch.zeros_like(br[..., :1]), br[..., :-1]], dim=-1)
    reverse, _ = path_scan(q.flip(-2), k.flip(-2), wr, br, chunk=chunk)
    return reverse.flip(-2).flip(-1).triu(1)


def carried_keys(k: Tensor, w: Tensor, beta: Tensor, *, chunk: int = CHUNK) -> Tensor:
    """Every key carried to the last token, H_{T-1} ⋯ H_{j+1} k_j (..., T, D), without the
    logits :func:`path_scan` computes beside them: each chunk's keys carried to its end, then
    through the products of the chunks after it (suffix products, D x D), O(T·(n + D)·D)."""
    T = k.shape[-2]
    Tp = -(-T // chunk) * chunk
    if Tp != T:  # identity tokens after the last: w = 0, β = 0
        k, w, beta = F.pad(k, (0, 0, 0, Tp - T)), F.pad(w, (0, 0, 0, Tp - T)), F.pad(beta, (0, Tp - T))
    K, W = (x.unflatten(-2, (Tp // chunk, chunk)) for x in (k, w))  # (..., C, n, D)
    R, S, _ = _ut_transform(W, K, beta.unflatten(-1, (Tp // chunk, chunk)))
    ends = K - S.mT @ W  # (..., C, n, D): each chunk's keys carried to its end
    C = ends.shape[-3]
    parts, later = [ends[..., C - 1, :, :]], None  # later: the row map P_{c+1}ᵀ ⋯ P_{C-1}ᵀ
    for c in range(C - 2, -1, -1):
        product_t = _product(W[..., c + 1, :, :], R[..., c + 1, :, :]).mT
        later = product_t if later is None else product_t @ later
        parts.append(ends[..., c, :, :] @ later)
    return torch.stack(parts[::-1], dim=-3).flatten(-3, -2)[..., :T, :]


class ChunkPieces(NamedTuple):
    """What the chunks of a sequence give its causal logits, each chunk on its own (T = C·n):

    own (..., C, n, n): q_iᵀ P_ij k_j of the chunk's keys j <= i (0 above the diagonal);
    q_start (..., C, n, D): queries carried back to their chunk's start, H_a ⋯ H_i q_i;
    k_end (..., C, n, D): keys carried to their chunk's end, H_{b-1} ⋯ H_{j+1} k_j;
    product (..., C, D, D): the chunk's H_{b-1} ⋯ H_a = I - Wᵀ R, so a query row carried back
    to the chunk's end goes on to its start as ``q @ product``.
    """

    own: Tensor
    q_start: Tensor
    k_end: Tensor
    product: Tensor


class _KnownInverse(torch.autograd.Function):
    """A⁻¹ of a unit lower triangular A (..., n, n), computed before (by the forward pass whose
    backward this is): returned as is, its gradient taken back to A's strictly lower part,
    dA = -A⁻ᵀ g A⁻ᵀ."""

    @staticmethod
    def forward(ctx, A: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(inverse)
        return inverse.clone()

    @staticmethod
    def backward(ctx, g: Tensor):
        (inverse,) = ctx.saved_tensors
        return -(inverse.mT @ g @ inverse.mT).tril(-1), None


def chunk_pieces(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, chunk: int,
                 inverse: Tensor | None = None) -> tuple[ChunkPieces, Tensor]:
    """The :class:`ChunkPieces` of queries and keys of the same T tokens (q, k, w (..., T, D),
    beta (..., T)), T a multiple of ``chunk``, and the inverses (..., C, n, n) of the chunks'
    triangular systems; differentiable. All chunks at once. ``inverse``: those inverses from
    an earlier call on the same inputs (a backward's recompute), which saves the triangular
    solve."""
    T = q.shape[-2]
    if T % chunk:
        raise ValueError(f"chunk_pieces needs a length that is a multiple of chunk={chunk}, got {T}")
    Q, K, W = (x.unflatten(-2, (T // chunk, chunk)) for x in (q, k, w))  # (..., C, n, D)
    R, S, inverse = _ut_transform(W, K, beta.unflatten(-1, (T // chunk, chunk)), inverse)
    seen = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()  # l <= i
    QW = (Q @ W.mT).masked_fill(~seen, 0)  # q_i·w_l for l <= i
    own = (Q @ K.mT - QW @ S).masked_fill(~seen, 0)
    return ChunkPieces(own, Q - QW @ R, K - S.mT @ W, _product(W, R)), inverse


class CarriedKeys:
    """Every key so far carried to the last token, kept in two parts so that a decoding step
    reads the long part once and writes only the short one:

        all = [old · productᵀ, recent]

    ``old`` (..., c, D): the keys up to a token r, carried to r; ``product`` (..., D, D):
    H_last ⋯ H_{r+1}, the matrices of the tokens after r (None: the identity, no token after
    r); ``recent`` (..., s, D): the keys after r, carried to the last token. A step
    (:meth:`step`) multiplies ``product`` and ``recent`` by the new token's matrix (O(D² + s·D))
    and reads ``old`` once for the logits; every :data:`FOLD` tokens ``recent`` is folded into
    ``old`` (O(c·D²), a matrix product). Immutable: a step returns a new object, so a KV cache
    can put an earlier one back. Two are equal when their keys are (:meth:`all`).
    """

    __hash__ = None  # type: ignore[assignment]  # compared by value

    def __init__(self, old: Tensor, product: Tensor | None = None, recent: Tensor | None = None) -> None:
        self.old, self.product = old, product
        self.recent = old[..., :0, :] if recent is None else recent

    @property
    def shape(self) -> torch.Size:
        """The shape of :meth:`all` (..., c + s, D)."""
        return self.old.shape[:-2] + (self.old.shape[-2] + self.recent.shape[-2], self.old.shape[-1])

    def all(self) -> Tensor:
        """(..., c + s, D): every key carried to the last token."""
        old = self.old if self.product is None else self.old @ self.product.mT
        return torch.cat([old, self.recent], dim=-2) if self.recent.shape[-2] else old

    def last(self, n: int) -> "CarriedKeys":
        """The last n keys (a sliding cache's)."""
        c, s = self.old.shape[-2], self.recent.shape[-2]
        if n >= c + s:
            return self
        if n >= s:
            return CarriedKeys(self.old[..., c - (n - s):, :], self.product, self.recent)
        return CarriedKeys(self.recent[..., s - n:, :])

    def step(self, q: Tensor, k: Tensor, w: Tensor, beta: Tensor) -> tuple[Tensor, "CarriedKeys"]:
        """One new token: its query ``q`` and key ``k`` (..., 1, D), unit ``w`` (..., 1, D) and
        ``beta`` (..., 1). Returns the logits q_iᵀ H_i ⋯ H_{j+1} k_j (..., 1, c + s + 1)
        against every key, its own last, and the keys carried to the new token."""
        bw = beta[..., None] * w  # (..., 1, D)
        recent = torch.cat([self.recent - (self.recent @ w.mT) @ bw, k], dim=-2)  # H_i on each, then k_i
        if self.product is None:  # H_i = I - β w wᵀ
            product = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device) - bw.mT @ w
        else:  # H_i ⋯ H_{r+1}
            product = self.product - bw.mT @ (w @ self.product)
        logits = torch.cat([(q @ product) @ self.old.mT, q @ recent.mT], dim=-1)  # (qᵀ P) k̃_j; q·(recent, carried)
        if recent.shape[-2] >= FOLD:
            return logits, CarriedKeys(torch.cat([self.old @ product.mT, recent], dim=-2))
        return logits, CarriedKeys(self.old, product, recent)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CarriedKeys) and other.shape == self.shape and torch.equal(other.all(), self.all())

    def _parts(self) -> tuple[Tensor, ...]:
        return (self.old, self.recent) if self.product is None else (self.old, self.product, self.recent)

    def is_inference(self) -> bool:
        """Made under ``torch.inference_mode()`` (a KV cache then clones it before autograd reads it)."""
        return any(t.is_inference() for t in self._parts())

    def clone(self) -> "CarriedKeys":
        """A copy without autograd history, as cloning an inference tensor gives (the KV cache's
        way out of inference mode: a part kept from an earlier step under autograd must not
        lead back into that step's graph)."""
        copy = lambda t: t.detach().clone()  # noqa: E731
        return CarriedKeys(copy(self.old), None if self.product is None else copy(self.product), copy(self.recent))


#: Tokens a :class:`CarriedKeys` keeps apart before folding them into its long part: a fold
#: costs a (c, D) x (D, D) product, FOLD steps cost FOLD rank-one updates of the short part.
FOLD = 64
