"""Causal attention whose logits are PaTH's, q_iᵀ H_i ⋯ H_{j+1} k_j times the scale, with no
(Tq, Tk) tensor: :func:`householder_attention` (the leaf :func:`attention` of a
:class:`~posenc.terms.HouseholderTerm` alone under a plain causal mask).

The sequence is cut into C chunks of n tokens (:func:`posenc.householder.chunk_pieces`: each
chunk's own logits, its queries carried back to its start, its keys carried to its end, and
its product P_c = I - Wᵀ R, D x D). A query chunk c meets key chunk c - d through its queries
carried back over the d - 1 chunks between (FLA's parallel PaTH kernel walks a query block
back the same way, ``fla/ops/path_attn/parallel.py``):

    d = 0:  the chunk's own logits;
    d >= 1: q̃_d · k_endᵀ[c - d],   q̃_1 = q_start[c],   q̃_{d+1} = q̃_d · P[c - d].

Every query chunk takes the step of distance d at once, one batched product per step, so the
loop runs C times, whatever the batch and heads, and each step holds (C - d) chunk pairs of
(n, n) logits, laid out chunk-major (C, B·H, n, ·) so each slice is one contiguous batched
matmul. The softmax is FlashAttention's online one (Dao et al. 2022, Alg. 1): a running
maximum and sum per row, the output rescaled as each distance arrives. The forward keeps q, k,
w, β, v, the output, the rows' log-sum-exp and the chunks' triangular inverses (O(T·(D + n)));
the backward recomputes the chunk pieces (the inverses kept: no triangular solve) and the
chains q̃_d (kept for its own reverse walk: O(T²·D / n) per sequence, the sequences taken in
passes that :data:`CHAIN_FLOATS` bounds), then takes each distance from the farthest back:

    dV += Pᵀ dO,  dS = P ∘ (dO Vᵀ - Σ_j P dP) · scale,  dk_end += dSᵀ q̃_d,  dq̃_d = dS k_end + g Pᵀ,
    dP[c - d] += q̃_dᵀ g     (g: the gradient of q̃_{d+1}).

The pieces' own gradients go back to q, k, w and β by autograd through
:func:`~posenc.householder.chunk_pieces` (O(T·n·D) work). A backward asked for a graph
(``create_graph``) differentiates the dense causal logits of
:func:`~posenc.householder.path_scan` instead (a (T, T) graph, as any double backward of
attention keeps).

Work per (query, key, head) pair, in multiply-adds: forward D for the logit, D²/n for the
chain and Dv for p·v, against NoPE's D + Dv; the backward about three times the forward.
Half-precision inputs are computed in float32, float64 stays float64; the output has v's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..householder import CHUNK, chunk_pieces, path_scan
from ..masks import AttentionMask
from . import LayerTerms

__all__ = ["CHAIN_FLOATS", "attention", "householder_attention"]

#: The most floats the backward keeps as chain states at once (8 MiB in float32): the batch
#: rows and heads are taken in passes that fit (at T = 1024, chunks of 64, D = 64: 4 at a time).
CHAIN_FLOATS = 1 << 21


def _check(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, scale, chunk) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("w", w)):
        if not isinstance(t, Tensor) or t.dim() != 4 or not t.is_floating_point():
            raise ValueError(f"{name} must be a 4-D float tensor (B, H, T, D), got {_desc(t)}")
    B, H, T, D = q.shape
    if k.shape != q.shape or w.shape != q.shape:
        raise ValueError(f"k and w must have q's shape {tuple(q.shape)}, got {tuple(k.shape)} and {tuple(w.shape)}")
    if v.shape[:3] != (B, H, T):
        raise ValueError(f"v must be (B={B}, H={H}, T={T}, Dv), got {tuple(v.shape)}")
    if not isinstance(beta, Tensor) or not beta.is_floating_point() or beta.shape != (B, H, T):
        raise ValueError(f"beta must be a float tensor (B={B}, H={H}, T={T}), got {_desc(beta)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale == scale) or abs(scale) == float("inf"):
        raise ValueError(f"scale must be a finite float, got {scale!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= 4096:
        raise ValueError(f"chunk must be an int in [1, 4096], got {chunk!r}")


def _desc(x) -> str:
    return f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) else f"{type(x).__name__} {x!r}"


def householder_attention(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, *, scale: float,
                          chunk: int = CHUNK) -> Tensor:
    """softmax(scale · q_iᵀ H_i ⋯ H_{j+1} k_j, causal) · v, H_t = I - β_t w_t w_tᵀ.

    q, k, w (B, H, T, D) (w unit rows), v (B, H, T, Dv), beta (B, H, T): queries and keys of
    the same T tokens. ``chunk``: tokens per chunk (T is padded to a multiple with identity
    tokens after the last, which no query sees; one longer than T is taken as T). Returns (B, H, T, Dv) in v's dtype;
    differentiable in q, k, v, w and beta.
    """
    _check(q, k, v, w, beta, scale, chunk)
    T = q.shape[2]
    if T == 0:
        return v.new_zeros(v.shape)
    # a chunk longer than the sequence only pads it: any chunk gives the same logits
    return _Householder.apply(q, k, v, w, beta, float(scale), min(chunk, T))


def attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """The backend leaf: the layer's one :class:`~posenc.terms.HouseholderTerm`, whose logits
    replace q·kᵀ·scale (its q, k and scale are this call's), under the plain causal mask."""
    (t,) = terms.logits
    if t.scale != scale:
        raise ValueError(f"a HouseholderTerm's scale ({t.scale}) must be the attention's ({scale}): its logits "
                         "replace scale·q·kᵀ")
    return householder_attention(t.q, t.k, v, t.w, t.beta, scale=scale, chunk=t.chunk)


def _padded(x: Tensor, T: int, dim: int) -> Tensor:
    """x with zeros appended along ``dim`` (counted from the end) up to length T."""
    n = T - x.shape[dim]
    return x if n == 0 else F.pad(x, (0, 0) * (-dim - 1) + (0, n))


def _chunk_major(x: Tensor, n: int) -> Tensor:
    """(N, T, X) -> (C, N, n, X), T padded with zeros to C·n: slices along the chunks are then
    contiguous, so every product below is one batched matmul without a copy."""
    N, T, X = x.shape
    C = -(-T // n)
    return _padded(x, C * n, -2).reshape(N, C, n, X).transpose(0, 1).contiguous()


def _from_chunk_major(x: Tensor, T: int) -> Tensor:
    """(C, N, n, X) -> (N, T, X), the padding dropped."""
    C, N, n, X = x.shape
    return x.transpose(0, 1).reshape(N, C * n, X)[:, :T]


def _pieces(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, n: int,
            inverse: Tensor | None = None) -> tuple[list[Tensor], Tensor]:
    """The chunk pieces of the padded sequences (padding: q = k = w = 0, β = 0, the identity),
    q, k, w (N, T, D), beta (N, T) -> each (C, N, ...) (own, q_start, k_end, product),
    differentiable, and the chunks' triangular inverses (N, C, n, n) (given: not recomputed)."""
    Tp = -(-q.shape[1] // n) * n
    pieces, inverse = chunk_pieces(_padded(q, Tp, -2), _padded(k, Tp, -2), _padded(w, Tp, -2), _padded(beta, Tp, -1),
                                   n, inverse)
    return [p.transpose(0, 1).contiguous() for p in pieces], inverse  # (N, C, ...) -> (C, N, ...)


def _group(T: int, n: int, D: int) -> int:
    """Sequences (batch rows times heads) per pass: the backward keeps every chain state of a
    pass, C(C - 1)/2 chunks of (n, D) per sequence, which :data:`CHAIN_FLOATS` bounds."""
    C = -(-T // n)
    return max(1, CHAIN_FLOATS // max(1, C * (C - 1) // 2 * n * D))


def _chains(q_start: Tensor, product: Tensor):
    """q̃_d (C - d, N, n, D) for d = 1 .. C - 1: the queries of chunks d .. C - 1 carried back
    to the end of chunk c - d (N sequences)."""
    C = q_start.shape[0]
    qt = q_start[1:]
    for d in range(1, C):
        yield qt
        if d + 1 < C:  # chunks d + 1 .. C - 1 go on, back through chunks 1 .. C - 1 - d
            qt = torch.matmul(qt[1:], product[1 : C - d])


def _forward(own: Tensor, q_start: Tensor, k_end: Tensor, product: Tensor, V: Tensor, scale: float):
    """(output (C, B·H, n, Dv), log-sum-exp (C, B·H, n)) of the causal attention, distance by
    distance with the online softmax."""
    C, _, n, _ = own.shape
    neg = torch.finfo(own.dtype).min  # finite: exp(-inf) takes a slow path on CPU
    above = torch.ones(n, n, dtype=torch.bool, device=own.device).triu(1)
    x = (own * scale).masked_fill_(above, neg)  # (C, B·H, n, n): every row sees its own key
    m = x.amax(-1)  # (C, B·H, n)
    p = torch.exp(x.sub_(m[..., None]))
    l = p.sum(-1)
    acc = torch.matmul(p, V)  # (C, B·H, n, Dv)
    kt = k_end.mT.contiguous()  # (C, B·H, D, n)
    for d, qt in enumerate(_chains(q_start, product), start=1):
        x = torch.matmul(qt, kt[: C - d]).mul_(scale)  # (C - d, B·H, n, n): query chunks d.., key chunks ..C-1-d
        m_new = torch.maximum(m[d:], x.amax(-1))
        alpha = torch.exp(m[d:] - m_new)
        p = torch.exp(x.sub_(m_new[..., None]))
        l[d:] = l[d:].mul_(alpha).add_(p.sum(-1))
        acc[d:] = acc[d:].mul_(alpha[..., None]).add_(torch.matmul(p, V[: C - d]))
        m[d:] = m_new
    return acc.div_(l[..., None]), m.add_(torch.log(l))


class _Householder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, scale: float, chunk: int) -> Tensor:
        cdt = torch.promote_types(torch.promote_types(q.dtype, v.dtype), torch.float32)
        B, H, T, D = q.shape
        qf, kf, vf, wf, bf = (x.flatten(0, 1) for x in (q, k, v, w, beta))  # (B·H, T, ...)
        out = qf.new_empty(B * H, T, v.shape[-1], dtype=cdt)
        lse = qf.new_empty(B * H, T, dtype=cdt)
        C = -(-T // chunk)
        inverse = qf.new_empty(B * H, C, chunk, chunk, dtype=cdt)  # kept: the backward's recompute needs no solve
        G = _group(T, chunk, D)
        with torch.no_grad():
            for g in range(0, B * H, G):
                rows = slice(g, g + G)
                pieces, inverse[rows] = _pieces(qf[rows].to(cdt), kf[rows].to(cdt), wf[rows].to(cdt), bf[rows].to(cdt), chunk)
                o, m = _forward(*pieces, _chunk_major(vf[rows].to(cdt), chunk), scale)
                out[rows] = _from_chunk_major(o, T)
                lse[rows] = _from_chunk_major(m[..., None], T)[..., 0]
        ctx.scale, ctx.chunk = scale, chunk
        # out (B·H, T, Dv), lse (B·H, T), inverse (B·H, C, n, n), in cdt
        ctx.save_for_backward(q, k, v, w, beta, out, lse, inverse)
        return out.view(B, H, T, -1).to(v.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, w, beta, out, lse, inverse = ctx.saved_tensors
        scale, chunk = ctx.scale, ctx.chunk
        if torch.is_grad_enabled():  # create_graph: differentiate the dense logits
            return _replayed(q, k, v, w, beta, scale, chunk, dout) + (None, None)
        cdt = out.dtype
        B, H, T, D = q.shape
        flat = [x.detach().flatten(0, 1) for x in (q, k, w, beta, v, dout)]
        dq, dk, dw, dbeta, dv = (torch.empty_like(x, dtype=cdt) for x in flat[:5])
        G = _group(T, chunk, D)
        for g in range(0, B * H, G):
            rows = slice(g, g + G)
            inputs = [x[rows].to(cdt).requires_grad_() for x in flat[:4]]
            with torch.enable_grad():
                pieces, _ = _pieces(*inputs, chunk, inverse[rows])
            dO = _chunk_major(flat[5][rows].to(cdt), chunk)  # padded rows: no gradient
            delta = (dO * _chunk_major(out[rows], chunk)).sum(-1)  # (C, G, n): Σ_j P dP per row
            m = _chunk_major(lse[rows, :, None], chunk)[..., 0]
            grads, dV = _backward(*(p.detach() for p in pieces), _chunk_major(flat[4][rows].to(cdt), chunk), dO, m, delta,
                                  scale)
            dq[rows], dk[rows], dw[rows], dbeta[rows] = torch.autograd.grad(pieces, inputs, grads)
            dv[rows] = _from_chunk_major(dV, T)
        return (dq.view(q.shape).to(q.dtype), dk.view(k.shape).to(k.dtype), dv.view(v.shape).to(v.dtype),
                dw.view(w.shape).to(w.dtype), dbeta.view(beta.shape).to(beta.dtype), None, None)


def _backward(own, q_start, k_end, product, V, dO, lse, delta, scale):
    """Gradients of the chunk pieces (own, q_start, k_end, product) and of V from dO, with the
    forward's log-sum-exp and the rows' Σ_j P dP (``delta``), distance by distance from the
    farthest back."""
    C, _, n, _ = own.shape
    chains = list(_chains(q_start, product))  # q̃_d for d = 1 .. C - 1
    kt, vt, pt = k_end.mT.contiguous(), V.mT.contiguous(), product.mT.contiguous()
    d_ke, d_prod, dV, d_qs = torch.zeros_like(k_end), torch.zeros_like(product), torch.zeros_like(V), torch.zeros_like(q_start)
    g = None  # the gradient of q̃_{d+1}
    for d in range(C - 1, 0, -1):
        qt = chains[d - 1]  # (C - d, B·H, n, D)
        p = torch.exp(torch.matmul(qt, kt[: C - d]).mul_(scale).sub_(lse[d:, ..., None]))  # (C - d, B·H, n, n)
        dob = dO[d:]
        dV[: C - d] += torch.matmul(p.mT, dob)
        ds = torch.matmul(dob, vt[: C - d]).sub_(delta[d:, ..., None]).mul_(p).mul_(scale)
        d_ke[: C - d] += torch.matmul(ds.mT, qt)
        gq = torch.matmul(ds, k_end[: C - d])  # (C - d, B·H, n, D)
        if g is not None:  # q̃_{d+1} = q̃_d[1:] @ product[1 : C - d] for the chains that went on
            d_prod[1 : C - d] += torch.matmul(qt[1:].mT, g)
            gq[1:] += torch.matmul(g, pt[1 : C - d])
        g = gq
    if g is not None:
        d_qs[1:] = g
    # d = 0: the chunks' own logits
    above = torch.ones(n, n, dtype=torch.bool, device=own.device).triu(1)
    p = torch.exp((own * scale).sub_(lse[..., None])).masked_fill_(above, 0.0)
    dV += torch.matmul(p.mT, dO)
    d_own = torch.matmul(dO, vt).sub_(delta[..., None]).mul_(p).mul_(scale)
    return (d_own, d_qs, d_ke, d_prod), dV


def _replayed(q, k, v, w, beta, scale, chunk, dout):
    """dq, dk, dv, dw, dβ with a graph of their own (a backward asked for ``create_graph``): by
    autograd through the dense causal logits of :func:`~posenc.householder.path_scan`, which
    keep (T, T) tensors, as any double backward of attention does."""
    cdt = torch.promote_types(torch.promote_types(q.dtype, v.dtype), torch.float32)
    T = q.shape[2]
    logits, _ = path_scan(q.to(cdt), k.to(cdt), w.to(cdt), beta.to(cdt), chunk=chunk)
    hidden = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    out = (torch.softmax((logits * scale).masked_fill(hidden, float("-inf")), -1) @ v.to(cdt)).to(v.dtype)
    return torch.autograd.grad(out, (q, k, v, w, beta), dout, create_graph=True, allow_unused=True)
