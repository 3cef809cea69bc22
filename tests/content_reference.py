"""The slow references the content-dependent relative encodings (shaw, relative_key(_query),
transformer_xl, deberta) are checked against: each loops over (batch, head, query i, key j) and
writes the paper's formula for one logit as a reader would, reading the encoding's parameters
directly; and the position settings that take the skew path (contiguous) or the gather path.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc import build
from posenc.attention import Attention


F64 = torch.float64
TOL = dict(atol=1e-10, rtol=1e-10)

CONFIGS = {
    "shaw": {"clip": 3},
    "relative_key": {"clip": 3},
    "relative_key_query": {"clip": 3},
    "transformer_xl": {},
    "transformer_xl_clamped": {"clip": 4},
    "deberta": {"position_buckets": 4, "max_relative_positions": 8},
    "deberta_c2p_nobuckets": {"p2c": False, "position_buckets": 0, "max_relative_positions": 3},
    "deberta_p2c_shared": {"c2p": False, "position_buckets": 4, "max_relative_positions": 8, "share_att_key": True},
    "deberta_shared_kv": {"position_buckets": 6, "max_relative_positions": 12, "share_att_key": True},
}


def make(label: str, d_model: int = 8, num_heads: int = 2) -> nn.Module:
    name = label.split("_clamped")[0].split("_c2p")[0].split("_p2c")[0].split("_shared")[0]
    torch.manual_seed(0)
    enc = build(name, d_model=d_model, num_heads=num_heads, **CONFIGS[label]).to(F64)
    with torch.no_grad():  # non-trivial values everywhere (LayerNorm starts at 1/0)
        for p in enc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return enc


def clip(d: int, k: int) -> int:
    return max(-k, min(k, d))


def sinusoid(d: int, C: int, base: float) -> torch.Tensor:
    """Transformer-XL's R_d: [sin(d w_m) for m] + [cos(d w_m) for m], w_m = base^(-2m/C)."""
    w = [base ** (-2 * m / C) for m in range(C // 2)]
    return torch.tensor([math.sin(d * x) for x in w] + [math.cos(d * x) for x in w], dtype=F64)


def ref_logit(enc, layer, q, k, b, h, i, j, d, scale):
    """The relative logit term of pair (i, j) at distance d = q_pos_i - k_pos_j."""
    name, cfg = enc.name, enc.config
    if name == "shaw":  # q_i · a^K_ij, a^K_ij = w^K[clip(j - i, k)]
        return q[b, h, i] @ enc.key_table[clip(-d, cfg.clip) + cfg.clip] * scale
    if name in ("relative_key", "relative_key_query"):  # (q_i [+ k_j]) · a[clip(i - j)]
        a = enc.weight[clip(d, cfg.clip) + cfg.clip]
        t = q[b, h, i] @ a
        if name == "relative_key_query":
            t = t + k[b, h, j] @ a
        return t * scale
    if name == "transformer_xl":  # u·k_j + (q_i + v)·W_R R_(i-j)
        dd = d if cfg.clip is None else clip(d, cfg.clip)
        H, D = enc.dims.num_heads, enc.dims.head_dim
        r = (enc.r_net.weight @ sinusoid(dd, enc.dims.d_model, cfg.base)).view(H, D)[h]
        return (enc.u[h] @ k[b, h, j] + (q[b, h, i] + enc.v[h]) @ r) * scale
    if name == "deberta":  # q_i·K^r_delta + k_j·Q^r_delta, delta = clamp(bucket(i - j)) + span
        from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

        span = cfg.span
        rel = torch.tensor(d)
        if cfg.position_buckets:
            rel = make_log_bucket_position(rel, cfg.position_buckets, cfg.max_relative_positions).long()
        delta = int(rel.clamp(-span, span - 1)) + span
        P = enc.rel_embeddings[delta]
        if enc.norm is not None:
            P = enc.norm(P)
        kproj = layer.k_proj if cfg.share_att_key else enc.pos_key_proj
        qproj = layer.q_proj if cfg.share_att_key else enc.pos_query_proj
        H, D = enc.dims.num_heads, enc.dims.head_dim
        t = 0.0
        if cfg.c2p:
            kr = kproj(P).view(-1, D)
            t = t + q[b, h, i] @ kr[h * kr.shape[0] // H]  # grouped k_proj: head h reads kv head h // (H/Hkv)
        if cfg.p2c:
            t = t + k[b, h, j] @ qproj(P).view(H, D)[h]
        return t * scale
    raise AssertionError(name)


def ref_scores(enc, layer, q, k, q_pos, k_pos, scale):
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    kb = k_pos.expand(B, -1)
    rows = [
        ref_logit(enc, layer, q, k, b, h, i, j, int(q_pos[b, i] - kb[b, j]), scale)
        for b in range(B) for h in range(H) for i in range(Tq) for j in range(Tk)
    ]
    return torch.stack(rows).view(B, H, Tq, Tk)


def ref_value_term(enc, probs, q_pos, k_pos):
    """Shaw's sum_j alpha_ij a^V_ij, a^V_ij = w^V[clip(j - i, k)]."""
    B, H, Tq, Tk = probs.shape
    kk = enc.config.clip
    kb = k_pos.expand(B, -1)
    out = []
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                z = sum(probs[b, h, i, j] * enc.value_table[clip(int(kb[b, j] - q_pos[b, i]), kk) + kk] for j in range(Tk))
                out.append(z)
    return torch.stack(out).view(B, H, Tq, -1)


def layer_stub(d_model=8, num_heads=2, num_kv_heads=None):
    torch.manual_seed(3)
    return Attention(d_model, num_heads, num_kv_heads, bias=True).to(F64)


SETTINGS = {
    "self": (torch.arange(7).expand(2, 7), torch.arange(7).expand(2, 7)),
    "decode": (torch.tensor([[9], [9]]), torch.arange(10).expand(2, 10)),
    "cross_uniform": ((5 + torch.arange(3)).expand(2, 3), torch.arange(8).expand(2, 8)),
    "cross_rows": (torch.tensor([[10, 11, 12], [2, 3, 4]]), torch.stack([torch.arange(6), 4 + torch.arange(6)])),
    "packed": (torch.tensor([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6]]),) * 2,
    "kv_offsets": (torch.tensor([[6, 7], [3, 4]]), torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 1, 2, 3, 4]])),
    # Every distance past a clip or bucket range: the saturated ends alone.
    "far": ((40 + torch.arange(3)).expand(2, 3), torch.arange(4).expand(2, 4)),
    "far_future": (torch.arange(3).expand(2, 3), (40 + torch.arange(4)).expand(2, 4)),
}
SKEW_SETTINGS = ["self", "decode", "cross_uniform", "far", "far_future"]  # contiguous: the skew path


def has_key_term(enc) -> bool:
    return enc.has_terms
