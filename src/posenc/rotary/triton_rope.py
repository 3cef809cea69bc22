"""A fused Triton RoPE kernel: q and k rotated in one launch, forward and backward, so a CUDA
rotation reads and writes each tensor once where eager PyTorch makes several passes.

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D) (Hkv <= H for GQA); r = 2 * h <= D rotated channels
(h pairs); channels r.. pass through. The rotation of each pair is the one of
:mod:`posenc.rotary.kernels` (Su et al. 2021): (a, b) -> (a cos - b sin, b cos + a sin),
pairs (x_j, x_{j+h}) in the ``"half"`` layout, (x_{2j}, x_{2j+1}) in the ``"interleaved"`` one.

Where the angles come from (three sources, one kernel):

* per-token cos/sin (B|1, T, h) float32: what :func:`~posenc.rotary.functional.apply_rotary_qk`
  receives (RoPE's table rows gathered at the positions, or xPos's scaled cos/sin);
* float32 tables (P, h) gathered by integer positions (B, T) inside the kernel
  (:func:`rotary_qk_table`): packed documents, KV-cache offsets and left padding are just
  positions; the tables are :func:`~posenc.rotary.angles.angles_cos_sin` of float64 angles;
* angles computed in the kernel (:func:`rotary_qk_angles`) from positions and float64 inv_freq:
  the angle, its cos and sin are float64 in registers, rounded once to float32, i.e. the same
  float32 values as the tables (float32 angles would be off by up to 2^-4 rad at 2^20).

Every scaling only changes inv_freq and the attention factor (folded into cos/sin), and xPos's
scale is folded into its cos/sin by :class:`~posenc.rotary.xpos.XPos`, so the kernel needs
neither. Arithmetic is float32 in registers, one rounding to the input dtype at the store.

Backward: the forward is y = M x per pair with M = [[c, -s], [s, c]] (c, s = scale * cos,
scale * sin for any scale: attention factor, xPos's zeta^(+-m/scale_base)), so the input
gradient is M^T g = [[c, s], [-s, c]] g: the same kernel with sin negated (the rotation by
-theta, with the same scale). cos/sin get no gradient (they never require one in posenc).

Launch: one program per (token block, head block) of q or of k (q's programs first on grid
axis 0, then k's) and batch index (axis 1). A program loads its cos/sin tile once and rotates
``BLOCK_H`` heads with it. The inner dim must be contiguous (stride 1); other strides are free,
so q/k views of a fused qkv projection need no copy.

Triton is optional: this module imports it at the top, and nothing imports this module until a
Triton kernel is asked for (``import posenc`` never imports triton). On CPU tensors it only runs
under ``TRITON_INTERPRET=1`` (the interpreter, for tests). Note: the interpreter (triton 3.8)
truncates float32 -> bfloat16 instead of rounding to nearest, so bfloat16 results there are
within one bf16 ulp of the exact result, not half an ulp as on a GPU.

Design after flash-attention's ``ops/triton/rotary.py`` (Dao-AILab) in spirit; written here.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

__all__ = ["SUPPORTED_DTYPES", "interpreting", "rotary_qk", "rotary_qk_table", "rotary_qk_angles"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# cos/sin sources (constexpr SRC)
_PER_TOKEN, _TABLE, _ANGLES = 0, 1, 2


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _rotate_tile(
    X, OUT, C, S, POS, pid, b, H, T,
    sxb, sxh, sxt, sob, soh, sot,  # x and out strides (inner stride 1)
    scb, sct,  # cos/sin strides: (B|1, T, h) per token, or (P, h) table rows (scb unused)
    spb, spt,  # positions strides (B|1, T)
    HALF: tl.constexpr, D: tl.constexpr, INTERLEAVED: tl.constexpr, CONJ: tl.constexpr,
    SRC: tl.constexpr, COPY_REST: tl.constexpr, LIBDEVICE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_REST: tl.constexpr,
):
    n_tb = tl.cdiv(T, BLOCK_T)
    t0 = (pid % n_tb) * BLOCK_T
    h0 = (pid // n_tb) * BLOCK_H
    t = t0 + tl.arange(0, BLOCK_T)  # (BT,)
    j = tl.arange(0, BLOCK_K)  # (BK,) pair index
    tmask = t < T
    pmask = tmask[:, None] & (j < HALF)[None, :]  # (BT, BK)
    b64 = b.to(tl.int64)
    t64 = t.to(tl.int64)

    # ---- cos/sin tile (BT, BK), float32, loaded once for BLOCK_H heads ----
    if SRC == 0:
        cs_off = b64 * scb + t64[:, None] * sct + j[None, :]
        cos = tl.load(C + cs_off, mask=pmask, other=1.0)
        sin = tl.load(S + cs_off, mask=pmask, other=0.0)
    else:
        pos = tl.load(POS + b64 * spb + t64 * spt, mask=tmask, other=0).to(tl.int64)  # (BT,)
        if SRC == 1:
            cs_off = pos[:, None] * sct + j[None, :]
            cos = tl.load(C + cs_off, mask=pmask, other=1.0)
            sin = tl.load(S + cs_off, mask=pmask, other=0.0)
        else:
            # C holds inv_freq (h,) then the attention factor, float64 (a float kernel argument
            # would be float32): the angle, its cos/sin and the factor in float64, rounded once.
            inv = tl.load(C + j, mask=j < HALF, other=0.0).to(tl.float64)
            attn_factor = tl.load(C + HALF).to(tl.float64)
            ang = pos.to(tl.float64)[:, None] * inv[None, :]
            if LIBDEVICE:  # the GPU's correctly range-reduced float64 __nv_cos/__nv_sin
                cos, sin = libdevice.cos(ang), libdevice.sin(ang)
            else:  # the interpreter (numpy) has no libdevice
                cos, sin = tl.cos(ang), tl.sin(ang)
            cos = (cos * attn_factor).to(tl.float32)
            sin = (sin * attn_factor).to(tl.float32)
    if CONJ:
        sin = -sin  # backward: the transpose, the rotation by -theta

    for i in range(BLOCK_H):
        h = h0 + i
        if h < H:
            xrow = X + b64 * sxb + h.to(tl.int64) * sxh + t64[:, None] * sxt  # (BT, 1) row starts
            orow = OUT + b64 * sob + h.to(tl.int64) * soh + t64[:, None] * sot
            if INTERLEAVED:
                c2 = tl.arange(0, 2 * BLOCK_K)
                m2 = tmask[:, None] & (c2 < 2 * HALF)[None, :]
                xx = tl.load(xrow + c2[None, :], mask=m2, other=0.0).to(tl.float32)  # (BT, 2BK)
                x1, x2 = tl.split(tl.reshape(xx, (BLOCK_T, BLOCK_K, 2)))
                o1 = x1 * cos - x2 * sin
                o2 = x2 * cos + x1 * sin
                out = tl.reshape(tl.join(o1, o2), (BLOCK_T, 2 * BLOCK_K))
                tl.store(orow + c2[None, :], out.to(OUT.dtype.element_ty), mask=m2)
            else:
                x1 = tl.load(xrow + j[None, :], mask=pmask, other=0.0).to(tl.float32)
                x2 = tl.load(xrow + HALF + j[None, :], mask=pmask, other=0.0).to(tl.float32)
                tl.store(orow + j[None, :], (x1 * cos - x2 * sin).to(OUT.dtype.element_ty), mask=pmask)
                tl.store(orow + HALF + j[None, :], (x2 * cos + x1 * sin).to(OUT.dtype.element_ty), mask=pmask)
            if COPY_REST:  # pass-through channels r..D, bit for bit
                cr = 2 * HALF + tl.arange(0, BLOCK_REST)
                mr = tmask[:, None] & (cr < D)[None, :]
                tl.store(orow + cr[None, :], tl.load(xrow + cr[None, :], mask=mr), mask=mr)


@triton.jit
def _rope_qk_kernel(
    Q, QO, CQ, SQ, PQ, K, KO, CK, SK, PK,
    HQ, TQ, HK, TK, n_q_programs,
    sqb, sqh, sqt, sqob, sqoh, sqot, scqb, scqt, spqb, spqt,
    skb, skh, skt, skob, skoh, skot, sckb, sckt, spkb, spkt,
    HALF: tl.constexpr, D: tl.constexpr, INTERLEAVED: tl.constexpr, CONJ: tl.constexpr,
    SRC: tl.constexpr, COPY_REST: tl.constexpr, LIBDEVICE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_REST: tl.constexpr,
):
    pid = tl.program_id(0)
    b = tl.program_id(1)
    if pid < n_q_programs:
        _rotate_tile(Q, QO, CQ, SQ, PQ, pid, b, HQ, TQ, sqb, sqh, sqt, sqob, sqoh, sqot, scqb, scqt, spqb, spqt,
                     HALF, D, INTERLEAVED, CONJ, SRC, COPY_REST, LIBDEVICE, BLOCK_T, BLOCK_H, BLOCK_K,
                     BLOCK_REST)
    else:
        _rotate_tile(K, KO, CK, SK, PK, pid - n_q_programs, b, HK, TK, skb, skh, skt, skob, skoh, skot,
                     sckb, sckt, spkb, spkt,
                     HALF, D, INTERLEAVED, CONJ, SRC, COPY_REST, LIBDEVICE, BLOCK_T, BLOCK_H, BLOCK_K,
                     BLOCK_REST)


# ---- launch ------------------------------------------------------------------------------
def _check_tensor(name: str, x: Tensor, inplace: bool) -> Tensor:
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16 for the triton kernel, got {x.dtype}")
    if x.dim() != 4:
        raise ValueError(f"{name} must have shape (B, H, T, D), got {tuple(x.shape)}")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"the triton kernel needs CUDA tensors ({name} is on {x.device}); "
            "on CPU it runs only under TRITON_INTERPRET=1 (tests)"
        )
    if x.stride(-1) != 1:
        if inplace:
            raise ValueError(f"inplace=True needs {name} with a contiguous last dim, got strides {x.stride()}")
        x = x.contiguous()
    return x


def _blocks(T: int, H: int, half: int, D: int) -> dict:
    block_k = triton.next_power_of_2(half)
    rest = D - 2 * half
    return dict(
        BLOCK_T=min(32, triton.next_power_of_2(max(T, 1))),
        # Reuse each cos/sin tile across a few heads, but keep enough programs for small inputs.
        BLOCK_H=min(4, triton.next_power_of_2(max(H, 1))),
        BLOCK_K=block_k,
        BLOCK_REST=triton.next_power_of_2(rest) if rest else 1,
    )


def _launch(q, k, cq, sq, cK, sk, pq, pk, *, half, interleaved, conj, src, inplace):
    """Rotate q and k (already checked) into new tensors, or into themselves when ``inplace``."""
    B, HQ, TQ, D = q.shape
    HK, TK = k.shape[1], k.shape[2]
    qo = q if inplace else torch.empty_like(q, memory_format=torch.contiguous_format)
    ko = k if inplace else torch.empty_like(k, memory_format=torch.contiguous_format)
    if half == 0 or q.numel() + k.numel() == 0:  # nothing to rotate
        if not inplace:
            qo.copy_(q), ko.copy_(k)
        return qo, ko
    blk = _blocks(max(TQ, TK), max(HQ, HK), half, D)
    n_q = triton.cdiv(TQ, blk["BLOCK_T"]) * triton.cdiv(HQ, blk["BLOCK_H"]) if q.numel() else 0
    n_k = triton.cdiv(TK, blk["BLOCK_T"]) * triton.cdiv(HK, blk["BLOCK_H"]) if k.numel() else 0
    if n_q + n_k == 0:
        return qo, ko

    def cs_strides(c):  # per token (B|1, T, h): batch stride 0 when broadcast; table (P, h): row stride
        if src == _PER_TOKEN:
            return (c.stride(0) if c.shape[0] > 1 else 0), c.stride(1)
        return 0, (c.stride(0) if c.dim() == 2 else 0)

    def pos_strides(p):
        if p is None:
            return 0, 0
        return (p.stride(0) if p.shape[0] > 1 else 0), p.stride(1)

    grid = (n_q + n_k, B)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _rope_qk_kernel[grid](
            q, qo, cq, sq, pq, k, ko, cK, sk, pk,
            HQ, TQ, HK, TK, n_q,
            *q.stride()[:3], *qo.stride()[:3], *cs_strides(cq), *pos_strides(pq),
            *k.stride()[:3], *ko.stride()[:3], *cs_strides(cK), *pos_strides(pk),
            HALF=half, D=D, INTERLEAVED=interleaved, CONJ=conj, SRC=src, COPY_REST=(not inplace) and 2 * half < D,
            LIBDEVICE=q.is_cuda,
            **blk,
        )
    return qo, ko


class _RotaryQK(torch.autograd.Function):
    """Per-token cos/sin: forward rotates by theta, backward by -theta (M^T, same scale)."""

    @staticmethod
    def forward(ctx, q, k, cq, sq, cK, sk, interleaved):
        half = cq.shape[-1]
        ctx.save_for_backward(cq, sq, cK, sk)
        ctx.interleaved = interleaved
        return _launch(q, k, cq, sq, cK, sk, None, None, half=half, interleaved=interleaved, conj=False,
                       src=_PER_TOKEN, inplace=False)

    @staticmethod
    def backward(ctx, gq, gk):
        cq, sq, cK, sk = ctx.saved_tensors
        gq = gq if gq.stride(-1) == 1 else gq.contiguous()
        gk = gk if gk.stride(-1) == 1 else gk.contiguous()
        dq, dk = _launch(gq, gk, cq, sq, cK, sk, None, None, half=cq.shape[-1], interleaved=ctx.interleaved,
                         conj=True, src=_PER_TOKEN, inplace=False)
        return dq, dk, None, None, None, None, None


class _RotaryQKTable(torch.autograd.Function):
    """cos/sin gathered by position from tables (src=_TABLE) or computed from angles (_ANGLES)."""

    @staticmethod
    def forward(ctx, q, k, c, s, pq, pk, half, interleaved, src):
        ctx.save_for_backward(c, s, pq, pk)
        ctx.args = (half, interleaved, src)
        return _launch(q, k, c, s, c, s, pq, pk, half=half, interleaved=interleaved, conj=False, src=src,
                       inplace=False)

    @staticmethod
    def backward(ctx, gq, gk):
        c, s, pq, pk = ctx.saved_tensors
        half, interleaved, src = ctx.args
        gq = gq if gq.stride(-1) == 1 else gq.contiguous()
        gk = gk if gk.stride(-1) == 1 else gk.contiguous()
        dq, dk = _launch(gq, gk, c, s, c, s, pq, pk, half=half, interleaved=interleaved, conj=True, src=src,
                         inplace=False)
        return dq, dk, None, None, None, None, None, None, None


def _check_inplace(q: Tensor, k: Tensor, inplace: bool) -> None:
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {inplace!r}")
    if inplace and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        raise ValueError(
            "inplace=True is for inference: q and k must not require grad (use torch.no_grad() or "
            "torch.inference_mode(), or inplace=False)"
        )
    if inplace and q.numel() and q.data_ptr() == k.data_ptr():  # a safety check, not a cache key
        raise ValueError("inplace=True needs q and k in separate memory, got one tensor (or view) for both")


def _check_qk(q: Tensor, k: Tensor, inplace: bool) -> tuple[Tensor, Tensor]:
    _check_inplace(q, k, inplace)
    q, k = _check_tensor("q", q, inplace), _check_tensor("k", k, inplace)
    if k.dtype != q.dtype:
        raise TypeError(f"q and k must have one dtype for the triton kernel, got {q.dtype} and {k.dtype}")
    if k.device != q.device:
        raise ValueError(f"q and k must be on one device, got {q.device} and {k.device}")
    if k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share B and D")
    return q, k


def _f32(name: str, t: Tensor, device: torch.device) -> Tensor:
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a float tensor, got {t.dtype}")
    t = t.to(device=device, dtype=torch.float32)
    return t if t.stride(-1) == 1 else t.contiguous()


def rotary_qk(
    q: Tensor, k: Tensor, cos_q: Tensor, sin_q: Tensor, cos_k: Tensor, sin_k: Tensor,
    layout: str = "half", inplace: bool = False,
) -> tuple[Tensor, Tensor]:
    """Rotate q by cos_q/sin_q (B|1, Tq, h) and k by cos_k/sin_k (B|1, Tk, h) in one launch.

    The Triton form of :func:`~posenc.rotary.functional.apply_rotary_qk` (which checks the
    shapes and calls this for ``kernel="triton"``). Differentiable in q and k; ``inplace=True``
    (inference only) writes the rotation into q and k and returns them.
    """
    q, k = _check_qk(q, k, inplace)
    if cos_q.requires_grad or sin_q.requires_grad or cos_k.requires_grad or sin_k.requires_grad:
        raise ValueError("the triton kernel gives no gradient to cos/sin; use kernel='eager' or 'compiled'")
    cq, sq, cK, sk = (_f32(n, t, q.device) for n, t in
                      (("cos_q", cos_q), ("sin_q", sin_q), ("cos_k", cos_k), ("sin_k", sin_k)))
    interleaved = layout == "interleaved"
    if inplace:
        return _launch(q, k, cq, sq, cK, sk, None, None, half=cq.shape[-1], interleaved=interleaved, conj=False,
                       src=_PER_TOKEN, inplace=True)
    return _RotaryQK.apply(q, k, cq, sq, cK, sk, interleaved)


def _check_positions(name: str, p: Tensor, x: Tensor, limit: int | None, check_range: bool) -> Tensor:
    if p.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {p.dtype}")
    if p.dim() != 2 or p.shape[1] != x.shape[2] or p.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"{name} must have shape (B or 1, T) = (1 or {x.shape[0]}, {x.shape[2]}), got {tuple(p.shape)}")
    p = p.to(x.device)
    if check_range and p.numel():
        lo, hi = (int(v) for v in torch.aminmax(p))  # a host sync: the price of never reading past the table
        if lo < 0 or (limit is not None and hi >= limit):
            bound = f"[0, {limit - 1}]" if limit is not None else ">= 0"
            raise ValueError(f"{name} must be in {bound}, got values in [{lo}, {hi}]")
    return p


def rotary_qk_table(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, q_pos: Tensor, k_pos: Tensor,
    layout: str = "half", inplace: bool = False, check_positions: bool = True,
) -> tuple[Tensor, Tensor]:
    """Rotate q at q_pos (B|1, Tq) and k at k_pos (B|1, Tk), reading rows of the float32 tables
    cos/sin (P, h) (from :func:`~posenc.rotary.angles.angles_cos_sin` of ``arange(P)``).

    Positions must lie in [0, P): checked (one host sync) so the kernel never reads past the
    table. ``check_positions=False`` skips that sync for callers that guarantee the range
    (e.g. ``arange`` positions); a position out of range then reads arbitrary memory.
    """
    q, k = _check_qk(q, k, inplace)
    if cos.dim() != 2 or sin.shape != cos.shape or 2 * cos.shape[1] > q.shape[-1]:
        raise ValueError(
            f"cos/sin must be tables (P, h) with 2h <= D = {q.shape[-1]}, got {tuple(cos.shape)}/{tuple(sin.shape)}"
        )
    c, s = _f32("cos", cos, q.device), _f32("sin", sin, q.device)
    pq = _check_positions("q_pos", q_pos, q, c.shape[0], check_positions)
    pk = _check_positions("k_pos", k_pos, k, c.shape[0], check_positions)
    interleaved = layout == "interleaved"
    if inplace:
        return _launch(q, k, c, s, c, s, pq, pk, half=c.shape[1], interleaved=interleaved, conj=False,
                       src=_TABLE, inplace=True)
    return _RotaryQKTable.apply(q, k, c, s, pq, pk, c.shape[1], interleaved, _TABLE)


def rotary_qk_angles(
    q: Tensor, k: Tensor, inv_freq: Tensor, q_pos: Tensor, k_pos: Tensor, attention_factor: float = 1.0,
    layout: str = "half", inplace: bool = False,
) -> tuple[Tensor, Tensor]:
    """Rotate q at q_pos and k at k_pos with cos/sin computed in the kernel: angle = m * inv_freq,
    cos, sin in float64 (times ``attention_factor``), rounded once to float32 — the float32 values
    of :func:`~posenc.rotary.angles.angles_cos_sin`, without a table.

    ``inv_freq``: (h,), e.g. :meth:`RotaryEmbedding.frequencies` (any scaling); sent as float64.
    Positions are not range-checked (no host sync): any integer, negative ones included, gives
    the rotation by its angle.
    """
    q, k = _check_qk(q, k, inplace)
    if not isinstance(inv_freq, Tensor) or inv_freq.dim() != 1 or 2 * inv_freq.shape[0] > q.shape[-1]:
        raise ValueError(f"inv_freq must have shape (h,) with 2h <= D = {q.shape[-1]}, got {inv_freq!r:.80}")
    h = inv_freq.shape[0]
    af = torch.full((1,), float(attention_factor), dtype=torch.float64, device=q.device)  # a fill: no host copy
    f = torch.cat([inv_freq.detach().to(device=q.device, dtype=torch.float64), af])  # (h + 1,): inv_freq, factor
    pq = _check_positions("q_pos", q_pos, q, None, False)
    pk = _check_positions("k_pos", k_pos, k, None, False)
    interleaved = layout == "interleaved"
    if inplace:
        return _launch(q, k, f, f, f, f, pq, pk, half=h, interleaved=interleaved, conj=False,
                       src=_ANGLES, inplace=True)
    return _RotaryQKTable.apply(q, k, f, f, pq, pk, h, interleaved, _ANGLES)
