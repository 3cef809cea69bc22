"""Memory-lean attention with logit terms: forward and backward block by block over queries.

Shapes: B batch, H query heads, Hkv key/value heads, Tq queries, Tk keys, D head dim, R the
number of distinct (clipped or bucketed) relative positions of a term.

    logits = q·kᵀ·scale + bias + Σ table terms (gathered by bucket)
             + Σ prefix-sum terms (c_i - c_j) + Σ count terms q_i·e[p_ij]
             + Σ stick terms Σ_{t=j}^{e_i} power·log sigmoid(∓y_it)  (masked: -inf)
               (stick-breaking: y the logits themselves, log(1 - sigmoid); per_row_alibi: y of
               its gate vectors)
    p      = softmax(logits), or exp(logits) with ``normalize=False`` (stick-breaking's logits
             are its log weights: rows sum to at most 1)
    out    = p·v + Σ_value terms  mass(i, r)·values[r]

where ``mass(i, r) = Σ_j p_ij [bucket(i, j) = r]``. The terms are :mod:`posenc.terms`'
:class:`~posenc.terms.TableTerm` (B, H, T, R) and :class:`~posenc.terms.ValueTerm`; a
content-independent bias comes as one dense float tensor (B|1, H, Tq, Tk).

:func:`fused_attention` is a ``torch.autograd.Function`` in the manner of FlashAttention
(Dao et al. 2022, Alg. 1-2): the forward keeps only its inputs and the output (B, H, Tq, Dv);
the backward recomputes the probabilities of one block of query rows at a time (the same
softmax of the same logits, so exactly the forward's) and produces dq, dk, dv and the gradient of every term's tensor:

* a TableTerm's table by a scatter-add of the logit gradient dS by bucket, O(T·R) memory;
* a PrefixSumTerm's sums (FoX) by the row and column sums of dS, O(T) memory: the (Tq, Tk)
  difference c_i - c_j exists one block at a time. FoX at T=2048 (B=1, H=8, D=64, float32,
  causal, forward + backward, one thread, two rounds on a 2-core machine shared with other
  jobs): 2.9 s and 119-127 MiB peak RSS growth, against 8.8-9.3 s and 455-505 MiB with the
  difference passed as a dense bias (T=1024: 0.85-0.88 s against 2.4-3.1 s);
* a CountTerm (CoPE) from its gates' logits, which are the block's own scaled logits, and its
  embeddings (:mod:`.counting`): its counts, gains and their gradients exist one block at a
  time, and only over the keys a count can tell apart;
* a stick term (:class:`~posenc.terms.StickSums`) likewise (:mod:`.stick_breaking`): its
  sums and their gradient exist one block at a time, from the block's own logits when they are
  its gates (stick-breaking: the gradient reaches dq and dk through the logits), else from its
  gate vectors (per_row_alibi: a width-d product per block, the gradient into the vectors);
* a ValueTerm's values from the block's per-bucket probability mass;
* the dense bias, which is a (B|1, H, Tq, Tk) tensor anyway.

So no (B, H, Tq, Tk) tensor outlives a block: the peak is one block's (B, H, rows, Tk)
scratch. With ``causal`` the key columns right of a block's last query are skipped (about
half the work at Tq = Tk). Half-precision inputs are computed in float32, float64 stays
float64; the output and the gradients have their inputs' dtypes.

A query row that sees no key (all masked) gets a zero output and zero gradients (the
softmax of an empty row is defined as nothing rather than NaN). Unnormalised (``normalize=False``)
the weights are p = exp(logits) and the backward's dL/dlogits is ``p·dP`` (no row sum to
subtract): the output is sum_j p_ij v_j itself. Hidden logits are set to the
dtype's most negative finite value, not -inf: on CPU ``exp(-inf)`` takes a slow path that
doubled the softmax's cost. ``bias`` should therefore be finite (hide keys with ``mask``).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ..masks import AttentionMask
from ..terms import CountTerm, DenseTerm, HouseholderTerm, LogitsTerm, PrefixSumTerm, StickRule, StickSums, TableTerm, ValueTerm
from . import LayerTerms
from .blocks import Blocks, Spec, bucket_range, memo_buckets

__all__ = ["attention", "fused_attention", "BLOCK_ROWS"]

# Query rows per block: the scratch is (B, H, rows, Tk) float32, i.e. rows / Tq of one dense
# logit tensor. 64 rows keep it in cache: the whole-model training step (B=2, 6 layers, width
# 512, 8 heads, T=1024, two threads, a quiet 2-core EPYC) ran 3-11 % faster and peaked 9-15 %
# lower than at 256 (relative_key 1910 against 2154 ms, 424 against 498 MiB; Shaw 2145 / 2266
# ms; FoX 1710 / 1770 ms), and 128 was between. CoPE's count term does a dozen elementwise
# passes more per block, where the gap is widest (one attention call, T=1024: 121 ms at 64
# rows, 205 at 256).
BLOCK_ROWS = 64


def _check(q: Tensor, k: Tensor, v: Tensor, scale, mask, bias, tables, values, q_pos, k_pos, causal, block) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, heads, T, D), got {_desc(t)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    B, H, Tq, D = q.shape
    Bk, Hkv, Tk, Dk = k.shape
    if Bk != B or Dk != D or k.dtype != q.dtype:
        raise ValueError(f"k must be (B={B}, Hkv, Tk, D={D}) in {q.dtype}, got {tuple(k.shape)} {k.dtype}")
    if v.shape[:3] != k.shape[:3] or v.dtype != q.dtype:
        raise ValueError(f"v must be (B, Hkv, Tk, Dv) = {tuple(k.shape[:3])} + (Dv,) in {q.dtype}, got {tuple(v.shape)} {v.dtype}")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"the query heads ({H}) must be a multiple of the key/value heads ({Hkv})")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale == scale) or abs(scale) == float("inf"):
        raise ValueError(f"scale must be a finite float, got {scale!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1, got {block!r}")
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 4:
            raise ValueError(f"mask must be a bool tensor (B|1, 1|H, Tq, Tk) or None, got {_desc(mask)}")
        if mask.shape[0] not in (1, B) or mask.shape[1] not in (1, H) or mask.shape[2:] != (Tq, Tk):
            raise ValueError(f"mask must have shape (1 or {B}, 1 or {H}, {Tq}, {Tk}), got {tuple(mask.shape)}")
    if bias is not None:
        if not isinstance(bias, Tensor) or not bias.is_floating_point() or bias.dim() != 4:
            raise ValueError(f"bias must be a float tensor (B|1, H, Tq, Tk) or None, got {_desc(bias)}")
        if bias.shape[0] not in (1, B) or bias.shape[1] not in (1, H) or bias.shape[2:] != (Tq, Tk):
            raise ValueError(f"bias must have shape (1 or {B}, 1 or {H}, {Tq}, {Tk}), got {tuple(bias.shape)}")
    for t in tables:
        if not isinstance(t, TableTerm):
            raise TypeError(f"tables must hold TableTerm objects, got {type(t).__name__}")
        rows = Tq if t.side == "query" else Tk
        if _factored(t):
            x, r = t.x, t.rows
            if x.dim() != 4 or x.shape[:3] != (B, H, Tq) or r.dim() not in (2, 3) or r.shape[-2] != x.shape[-1]:
                raise ValueError(f"a factored query-side TableTerm needs x (B={B}, H={H}, Tq={Tq}, D) and rows "
                                 f"(H, D, R) or (D, R), got {tuple(x.shape)} and {tuple(r.shape)}")
            continue
        tb = t.table
        if tb.dim() != 4 or tb.shape[0] not in (1, B) or tb.shape[1] not in (1, H) or tb.shape[2] != rows or tb.shape[3] < 1:
            raise ValueError(
                f"a {t.side}-side TableTerm's table must have shape (1 or {B}, 1 or {H}, {rows}, R >= 1), got {tuple(tb.shape)}"
            )
        if not tb.is_floating_point():
            raise TypeError(f"a TableTerm's table must be floating point, got {tb.dtype}")
    for t in values:
        if not isinstance(t, ValueTerm):
            raise TypeError(f"values must hold ValueTerm objects, got {type(t).__name__}")
        vt = t.values
        if vt.dim() != 3 or vt.shape[0] not in (1, H) or vt.shape[1] < 1 or vt.shape[2] != v.shape[-1]:
            raise ValueError(f"a ValueTerm's values must have shape (1 or {H}, R >= 1, Dv={v.shape[-1]}), got {tuple(vt.shape)}")
    if tables or values:
        for name, pos, n in (("q_pos", q_pos, Tq), ("k_pos", k_pos, Tk)):
            if not isinstance(pos, Tensor) or pos.dim() != 2 or pos.shape[0] not in (1, B) or pos.shape[1] != n:
                raise ValueError(f"{name} must be an int tensor of shape (1 or {B}, {n}) when terms are given, got {_desc(pos)}")
            if pos.is_floating_point() or pos.dtype == torch.bool:
                raise TypeError(f"{name} must be an integer tensor, got {pos.dtype}")


def _desc(x) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {x!r}"


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    mask: Tensor | None = None,
    causal: bool = False,
    bias: Tensor | None = None,
    tables: Sequence[TableTerm] = (),
    values: Sequence[ValueTerm] = (),
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    block: int | None = None,
    sums: Sequence[PrefixSumTerm] = (),
    counts: Sequence[Tensor] = (),
    count_causal: bool | None = None,
    sticks: Sequence[bool | StickSums] = (),
    normalize: bool = True,
) -> Tensor:
    """Attention with logit terms that never keeps (B, H, Tq, Tk) probabilities for backward.

    Args:
        q: (B, H, Tq, D). k: (B, Hkv, Tk, D), v: (B, Hkv, Tk, Dv) (grouped-query heads are
            repeated inside; their gradients summed back).
        scale: multiplier of q·kᵀ (the terms are already in logit units).
        mask: bool (B|1, 1|H, Tq, Tk), True where a query may see a key; None = all.
        causal: queries aligned to the end of the keys (query i is stream index Tk - Tq + i)
            see only keys at or before them; combined with ``mask``. Blocks of keys that no
            query of a block may see are skipped, so prefer it to putting causality in ``mask``.
        bias: dense logit bias (B|1, 1|H, Tq, Tk), e.g. ``posenc.terms.BiasTerm.dense``.
        tables: :class:`~posenc.terms.TableTerm` logit terms, tables (B|1, 1|H, T, R).
        values: :class:`~posenc.terms.ValueTerm` output terms, values (1|H, R, Dv).
        q_pos, k_pos: positions (B|1, Tq), (B|1, Tk) for the terms' buckets.
        block: query rows per block (None: :data:`BLOCK_ROWS`).
        sums: :class:`~posenc.terms.PrefixSumTerm` logit terms, sums (B, H, Tq) and (B, H, Tk).
        counts: the embeddings e (M, D) of :class:`~posenc.terms.CountTerm` logit terms (CoPE)
            whose gates are this call's own scaled logits (the term's q, k and scale are these).
        count_causal: the keys after each query are hidden in every row (the counts and
            sticks need not look past the query); None: ``causal``.
        sticks: stick terms summed block by block: a :class:`~posenc.terms.StickSums` term
            (per_row_alibi's :class:`~posenc.terms.StickTerm`: gates (B, H, Tq, d) and (B, H,
            Tk, d)), read from this call's own scaled logits when its gates are this call's q,
            k and scale; or a bool, a :class:`~posenc.terms.StickBreakingTerm` on this call's
            own logits given by its ``attend_current``.
        normalize: False: the weights are exp(logits), not their softmax (stick-breaking's
            logits are its log weights; given with ``sticks``, or with the term's dense form
            in ``bias``).

    Returns (B, H, Tq, Dv) in q's dtype. Differentiable in q, k, v, bias, every table, every
    ValueTerm's values, every PrefixSumTerm's sums, every count term's embeddings and every
    stick term's gate vectors.
    """
    tables, values, sums, counts, sticks = tuple(tables), tuple(values), tuple(sums), tuple(counts), tuple(sticks)
    block = BLOCK_ROWS if block is None else block
    _check(q, k, v, scale, mask, bias, tables, values, q_pos, k_pos, causal, block)
    _check_sums(sums, q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    _check_counts(counts, q.shape[-1])
    stick_specs, gates = _stick_inputs(sticks, q, k, scale, normalize)
    spec = Spec(
        float(scale), causal, block, q_pos, k_pos, mask,
        tuple(t.side for t in tables), tuple(_factored(t) for t in tables),
        tuple(t.bucket for t in tables), tuple(t.bucket for t in values),
        bias is not None, tuple(t.after is not None for t in sums),
        len(counts), causal if count_causal is None else bool(count_causal), stick_specs, normalize,
    )
    extra = [bias] if bias is not None else []
    for t in tables:
        extra += [t.x, t.rows] if _factored(t) else [t.table]
    extra += [t.values for t in values]
    for t in sums:
        extra += t.tensors()
    extra += counts
    extra += gates
    return _Fused.apply(spec, q, k, v, *extra)


def _check_sums(sums: Sequence[PrefixSumTerm], B: int, H: int, Tq: int, Tk: int) -> None:
    for t in sums:
        if not isinstance(t, PrefixSumTerm):
            raise TypeError(f"sums must hold PrefixSumTerm objects, got {type(t).__name__}")
        for x, n in zip(t.tensors(), (Tq, Tk, Tq, Tk)):
            if not x.is_floating_point() or tuple(x.shape) != (B, H, n):
                raise ValueError(f"a PrefixSumTerm's sums must be float (B={B}, H={H}, {n}), got {_desc(x)}")


def _check_counts(counts: Sequence[Tensor], D: int) -> None:
    for e in counts:
        if not isinstance(e, Tensor) or not e.is_floating_point() or e.dim() != 2 or e.shape[1] != D or e.shape[0] < 1:
            raise ValueError(f"counts must hold float embeddings (M >= 1, D={D}), got {_desc(e)}")


def _stick_inputs(sticks: Sequence, q: Tensor, k: Tensor, scale: float, normalize: bool):
    """Per stick term (rule, gate scale or None when its gates are this call's own logits), and
    the gate vectors of the others, flat: [gate_q, gate_k, ...]."""
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {_desc(normalize)}")
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    specs, gates = [], []
    for t in sticks:
        if isinstance(t, bool):
            specs.append((StickRule.breaking(t), None))
            log_weights = True
        elif isinstance(t, StickSums):
            gq, gk = t.gate_q, t.gate_k
            own = gq is q and gk is k and t.gate_scale == scale  # the breaks are this call's logits
            if not own:
                if (not gq.is_floating_point() or gq.dim() != 4 or tuple(gq.shape[:3]) != (B, H, Tq) or not gk.is_floating_point()
                        or tuple(gk.shape) != (B, H, Tk, gq.shape[-1])):
                    raise ValueError(f"a stick term's gates must be float (B={B}, H={H}, Tq={Tq}, d) and (B={B}, H={H}, "
                                     f"Tk={Tk}, d), got {_desc(gq)} and {_desc(gk)}")
                gates += [gq, gk]
            specs.append((t.rule, None if own else float(t.gate_scale)))
            log_weights = not t.normalized
        else:
            raise TypeError("sticks must hold bools (each stick-breaking term's attend_current) or stick terms "
                            f"(StickSums), got {_desc(t)}")
        if log_weights and normalize:
            raise ValueError("sticks need normalize=False: stick-breaking's logits are its log weights, "
                             "taken by exp, not softmax")
    return tuple(specs), gates


def attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: AttentionMask, terms: LayerTerms) -> Tensor:
    """The backend leaf: :func:`fused_attention` with a layer's terms and the forward's mask."""
    bias = None if terms.bias is None else terms.bias.dense()
    counts, sticks = [], []
    for t in terms.logits:
        if isinstance(t, StickSums):
            sticks.append(t)  # summed block by block: from the call's own logits when they are its gates
        elif isinstance(t, CountTerm) and t.q is q and t.k is k and t.scale == scale:
            counts.append(t.emb)  # its gates are this call's own logits: counted block by block
        elif isinstance(t, (DenseTerm, LogitsTerm, CountTerm, HouseholderTerm)):  # dense, a count on other q/k: the dense form
            d = t.dense(terms.q_pos, terms.k_pos)
            bias = d if bias is None else bias + d
    # Causality as a flag lets the fused function skip key blocks; padding and documents (and
    # the rows-that-see-nothing rule) come as the dense bool mask, broadcast over queries.
    only_causal = mask.causal_only
    m = None if only_causal else mask.dense()
    m = None if m is None else m.expand(m.shape[0], 1, mask.tq, mask.tk)
    return fused_attention(
        q, k, v, scale=scale, mask=m, causal=only_causal, bias=bias,
        tables=[t for t in terms.logits if isinstance(t, TableTerm)], values=terms.values,
        q_pos=terms.q_pos, k_pos=terms.k_pos, sums=[t for t in terms.logits if isinstance(t, PrefixSumTerm)],
        counts=counts,  # causal counts only with causal alone: padding rows see every key
        sticks=sticks, normalize=terms.normalized,
    )


def _factored(t: TableTerm) -> bool:
    """A query-side term given as factors (``TableTerm.product``) whose table was not built:
    each block of query rows computes just the columns its buckets reach, x_rows @ rows[:, lo:hi],
    so no (B, H, Tq, R) table exists (Transformer-XL's R = Tq + Tk - 1 made it twice the size
    of the logits, per layer)."""
    return t.side == "query" and t.is_factored and t.x is not None


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half types accumulate in float32 (their softmax loses the small logit differences
    # that carry position); float64 stays float64 (a reference model).
    return torch.promote_types(dtype, torch.float32)


def _sum_to(t: Tensor, shape: torch.Size) -> Tensor:
    """Sum a broadcast gradient back to its input's shape (batch or head dims of size 1)."""
    dims = [d for d in range(t.dim()) if shape[d] == 1 and t.shape[d] != 1]
    return t.sum(dims, keepdim=True) if dims else t


def _expand_heads(x: Tensor, H: int) -> Tensor:
    """(B, Hkv, T, D) -> (B, H, T, D): grouped-query heads repeated as attention repeats them."""
    return x if x.shape[1] == H else x.repeat_interleave(H // x.shape[1], dim=1)


def _split(spec: Spec, extra: Sequence[Tensor]):
    """(bias or None, per table term its table or its (x, rows) factors, value tensors, per
    prefix-sum term (query sums, key sums, after pair or None), count terms' embeddings, per
    stick term with gate vectors of its own (gate_q, gate_k))."""
    n_gates = 2 * sum(g is not None for _, g in spec.sticks)
    flat = extra[len(extra) - n_gates :] if n_gates else ()
    gates = [(flat[i], flat[i + 1]) for i in range(0, n_gates, 2)]
    extra = extra[: len(extra) - n_gates]
    n = int(spec.has_bias)
    tables: list = []
    for f in spec.factored:
        tables.append((extra[n], extra[n + 1]) if f else extra[n])
        n += 2 if f else 1
    counts = extra[len(extra) - spec.n_counts :] if spec.n_counts else ()
    extra = extra[: len(extra) - spec.n_counts]
    n_sums = sum(4 if a else 2 for a in spec.sums_after)
    vals, rest = extra[n : len(extra) - n_sums], extra[len(extra) - n_sums :]
    sums, n = [], 0
    for a in spec.sums_after:
        sums.append((rest[n], rest[n + 1], (rest[n + 2], rest[n + 3]) if a else None))
        n += 4 if a else 2
    return (extra[0] if spec.has_bias else None), tables, vals, sums, counts, gates


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec: Spec, q: Tensor, k: Tensor, v: Tensor, *extra: Tensor) -> Tensor:
        cdt = _compute_dtype(q.dtype)
        B, H, Tq, _ = q.shape
        bias, tables, vals, sums, counts, gates = _split(spec, extra)
        qc, kc, vc = q.to(cdt), _expand_heads(k.to(cdt), H), _expand_heads(v.to(cdt), H)
        geo = Blocks(spec, qc, kc, bias, tables, sums, counts, gates)
        out = qc.new_zeros(B, H, Tq, v.shape[-1])  # (B, H, Tq, Dv)
        for i0, i1, z in geo.ranges():
            if z == 0:
                continue
            idx_of = memo_buckets(geo, i0, i1, z)
            p, _, _ = geo.probs(i0, i1, z, idx_of)  # (B, H, rows, z)
            o = torch.matmul(p, vc[:, :, :z])  # (B, H, rows, Dv)
            for fn, val in zip(spec.value_buckets, vals):
                o.add_(_mass(p, idx_of(fn), val.shape[-2]) @ val.to(cdt))
            out[:, :, i0:i1] = o
        ctx.spec = spec
        # Saved: inputs, the output (for the backward's row sums) and nothing (Tq, Tk)-sized.
        ctx.save_for_backward(q, k, v, out, *extra)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout: Tensor):
        spec: Spec = ctx.spec
        q, k, v, out, *extra = ctx.saved_tensors
        cdt = out.dtype
        B, H, Tq, _ = q.shape
        Hkv, Tk = k.shape[1], k.shape[2]
        bias, tables, vals, sums, counts, gates = _split(spec, extra)
        qc, kc, vc = q.to(cdt), _expand_heads(k.to(cdt), H), _expand_heads(v.to(cdt), H)
        do = dout.to(cdt)
        # (B, H, Tq, 1): Σ_j p_ij dP_ij, from the full output; unnormalised weights have no row sum to subtract
        delta = (do * out).sum(-1, keepdim=True) if spec.normalized else None
        geo = Blocks(spec, qc, kc, bias, tables, sums, counts, gates)
        # per prefix-sum term: gradients of (query sums, key sums[, after query sums, after key sums])
        dsums = [[qc.new_zeros(B, H, Tq), qc.new_zeros(B, H, Tk)] + ([qc.new_zeros(B, H, Tq), qc.new_zeros(B, H, Tk)] if a else [])
                 for a in spec.sums_after]
        vt = vc.transpose(-1, -2).contiguous()  # (B, H, Dv, Tk), as kᵀ in Blocks
        dq, dk, dv = torch.zeros_like(qc), torch.zeros_like(kc), torch.zeros_like(vc)
        need_bias = bias is not None and ctx.needs_input_grad[4]
        dbias = qc.new_zeros(B, H, Tq, Tk) if need_bias else None
        # query side (B, H, Tq, R); key side (B, H, R, Tk), transposed at the end; factored:
        # (dx (B, H, Tq, D), drows (H, D, R)).
        dtabs = []
        for t, side, f in zip(tables, spec.sides, spec.factored):
            if f:
                x, rows = geo.factors[len(dtabs)]
                dtabs.append((torch.zeros_like(x), torch.zeros_like(rows.expand(H, -1, -1))))
            else:
                R = t.shape[-1]
                dtabs.append(qc.new_zeros(B, H, Tq, R) if side == "query" else qc.new_zeros(B, H, R, Tk))
        dvals = [qc.new_zeros(B, H, *val.shape[-2:]) for val in vals]
        dcounts = [torch.zeros_like(e) for e in geo.counts]  # (M, D) each
        dq_counts = torch.zeros_like(qc) if counts else None  # through q_i·e: not scaled
        # stick terms' gate vectors: d(gate_q) is summed unscaled (scaled once at the end)
        dgates = [(torch.zeros_like(gq), gkt.new_zeros(B, H, Tk, gkt.shape[-2])) for gq, gkt in geo.gates]
        gate_scales = [g for _, g in spec.sticks if g is not None]
        for i0, i1, z in geo.ranges():
            if z == 0:
                continue
            idx_of = memo_buckets(geo, i0, i1, z)
            p, counted, broken = geo.probs(i0, i1, z, idx_of)  # (B, H, rows, z)
            dob = do[:, :, i0:i1]  # (B, H, rows, Dv)
            dp = torch.matmul(dob, vt[..., :z])  # (B, H, rows, z)
            for n, (fn, val) in enumerate(zip(spec.value_buckets, vals)):
                idx = idx_of(fn)
                dvals[n].add_(_mass(p, idx, val.shape[-2]).transpose(-1, -2) @ dob)  # (B, H, R, Dv)
                dp.add_(torch.matmul(dob, val.to(cdt).transpose(-1, -2)).expand(B, H, -1, -1).gather(-1, idx))
            dv[:, :, :z].add_(torch.matmul(p.transpose(-1, -2), dob))
            ds = (dp if delta is None else dp.sub_(delta[:, :, i0:i1])).mul_(p)  # (B, H, rows, z): dL/dlogits
            del p
            if dbias is not None:
                dbias[:, :, i0:i1, :z] = ds
            for g, a in zip(dsums, spec.sums_after):
                # d(c_i - c_j): +row sums to c_i, -column sums to c_j; hidden keys have ds = 0
                before = ds if spec.causal else ds * geo.at_or_before(i0, i1, z)
                g[0][:, :, i0:i1].add_(before.sum(-1))
                g[1][:, :, :z].sub_(before.sum(-2))
                if not spec.causal:
                    later = ds - before  # keys after the query: c'_j - c'_i, or c_j - c_i mirrored
                    gq, gk = (g[2], g[3]) if a else (g[0], g[1])
                    gq[:, :, i0:i1].sub_(later.sum(-1))
                    gk[:, :, :z].add_(later.sum(-2))
            for n, side in enumerate(spec.sides):
                idx = idx_of(spec.table_buckets[n])
                if spec.factored[n]:
                    lo, hi = bucket_range(idx)
                    x, rows = geo.factors[n]
                    dt = ds.new_zeros(B, H, i1 - i0, hi - lo).scatter_add_(-1, idx - lo, ds)  # (B, H, rows, hi - lo)
                    dtabs[n][0][:, :, i0:i1].add_(torch.matmul(dt, rows[..., lo:hi].transpose(-1, -2)))
                    dtabs[n][1][..., lo:hi].add_(torch.matmul(x[:, :, i0:i1].transpose(-1, -2), dt).sum(0))
                elif side == "query":
                    dtabs[n][:, :, i0:i1].scatter_add_(-1, idx, ds)
                else:
                    dtabs[n][..., :z].scatter_add_(-2, idx, ds)
            # count terms: their gains' gradients from ds, then their gates' on the same logits
            on_logits = []  # (first key, d of the block's logits [a, z)) through gates that are the logits
            for c, de in zip(counted, dcounts):
                dx, dqc, dec = c.grads(ds)
                on_logits.append((c.a, dx))
                dq_counts[:, :, i0:i1].add_(dqc)
                de.add_(dec)
            # stick terms: on the same logits (stick-breaking), or into their gate vectors
            n = 0
            for b, (_, gate_scale) in zip(broken, spec.sticks):
                dy = b.grads(ds)  # (B, H, rows, z)
                if gate_scale is None:
                    on_logits.append((0, dy))
                    continue
                gqs, gkt = geo.gates[n]
                dgates[n][0][:, :, i0:i1] = torch.matmul(dy, gkt[..., :z].transpose(-1, -2))  # (B, H, rows, d)
                dgates[n][1][:, :, :z].add_(torch.matmul(dy.transpose(-1, -2), gqs[:, :, i0:i1]))  # (B, H, z, d)
                n += 1
            for a, dx in on_logits:
                ds[..., a:].add_(dx)
            dq[:, :, i0:i1] = torch.matmul(ds, kc[:, :, :z])
            dk[:, :, :z].add_(torch.matmul(ds.transpose(-1, -2), geo.qs[:, :, i0:i1]))
        dq.mul_(spec.scale)
        if dq_counts is not None:
            dq.add_(dq_counts)
        if Hkv != H:  # grouped heads: each kv head's gradient is the sum over its query heads
            dk = dk.unflatten(1, (Hkv, H // Hkv)).sum(2)
            dv = dv.unflatten(1, (Hkv, H // Hkv)).sum(2)
        grads = [None, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)]
        if bias is not None:
            grads.append(_sum_to(dbias, bias.shape).to(bias.dtype) if dbias is not None else None)
        for t, side, g in zip(tables, spec.sides, dtabs):
            if isinstance(t, tuple):  # factored: dx, and drows summed to rows' own shape
                (x, rows), (dx, drows) = t, g
                grads.append(dx.to(x.dtype))
                grads.append((drows if rows.dim() == 3 else drows.sum(0)).to(rows.dtype))
                continue
            g = g if side == "query" else g.transpose(-1, -2)
            grads.append(_sum_to(g, t.shape).to(t.dtype))
        for val, g in zip(vals, dvals):
            grads.append(_sum_to(g.sum(0), val.shape).to(val.dtype))
        for (cq, ck, after), g in zip(sums, dsums):
            for t, gt in zip((cq, ck) + (() if after is None else after), g):
                grads.append(gt.to(t.dtype))
        for e, g in zip(counts, dcounts):
            grads.append(g.to(e.dtype))
        for (gq, gk), (dgq, dgk), gate_scale in zip(gates, dgates, gate_scales):
            grads += [dgq.mul_(gate_scale).to(gq.dtype), dgk.to(gk.dtype)]
        return tuple(grads)


def _mass(p: Tensor, idx: Tensor, r: int) -> Tensor:
    """Per-bucket probability mass (B, H, rows, R) of probabilities p (B, H, rows, z)."""
    return p.new_zeros(*p.shape[:-1], r).scatter_add_(-1, idx, p)
