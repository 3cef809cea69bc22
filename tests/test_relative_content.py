"""Content-dependent relative encodings: fast paths against slow loops over the papers' formulas.

Each reference below loops over (batch, head, query i, key j) and writes the paper's formula
for one logit as a reader would, reading the encoding's parameters directly. The fast paths
(skew on contiguous positions, gather otherwise) must match in float64 to 1e-10, forward and
backward (gradients w.r.t. q, k and the encoding's parameters).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import posenc
from posenc import SequenceInfo, build
from posenc.attention import Attention
from posenc.context import AttentionContext
from posenc.backends import fused
from posenc.encoding import PositionalEncoding, QKProjection
from posenc.relative import RelativeLayout, log_bucket_position, skew, unskew

from helpers import tiny_model

torch.set_default_dtype(torch.float32)
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


# ---- slow references: one logit term at a time ------------------------------------------------


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


# ---- settings: (q_pos, k_pos); skew path where contiguous, gather path otherwise ---------------

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


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("label", [c for c in CONFIGS if c != "deberta_shared_kv"])  # that one: layer-level
def test_score_matches_reference_forward_and_backward(label, setting):
    enc = make(label)
    if not has_key_term(enc):
        pytest.skip("no score term")
    layer = layer_stub()
    q_pos, k_pos = SETTINGS[setting]
    B, H, D = 2, 2, 4
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, H, q_pos.shape[1], D, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(B, H, k_pos.shape[1], D, generator=g, dtype=F64, requires_grad=True)
    scale = enc.attention_scale(D)
    fast = enc.score(q, k, q_pos, k_pos, layer=layer)
    slow = ref_scores(enc, layer, q, k, q_pos, k_pos, scale)
    torch.testing.assert_close(fast, slow, **TOL)
    w = torch.randn(fast.shape, generator=g, dtype=F64)  # a random cotangent
    params = [q, k, *enc.parameters(), *layer.parameters()]
    gf = torch.autograd.grad((fast * w).sum(), params, allow_unused=True)
    gs = torch.autograd.grad((slow * w).sum(), params, allow_unused=True)
    for a, b in zip(gf, gs):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("angles", [True, False], ids=["angle_form", "table_form"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_transformer_xl_both_forms_match_reference(setting, angles, monkeypatch):
    """Both forms prepare() chooses between by cost (angle-difference identities as a DenseTerm;
    the projected distance table as a TableTerm) against the loop, forward and backward."""
    enc = make("transformer_xl")
    monkeypatch.setattr(enc, "_use_angles", lambda tq, tk: angles)
    q_pos, k_pos = SETTINGS[setting]
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 2, q_pos.shape[1], 4, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(2, 2, k_pos.shape[1], 4, generator=g, dtype=F64, requires_grad=True)
    state = enc.prepare(q_pos, k_pos)
    kinds = {type(t).__name__ for t in enc.terms(q, k, state, None)}
    assert kinds == ({"DenseTerm", "TableTerm"} if angles else {"TableTerm"})
    scale = enc.attention_scale(4)
    fast = enc.score(q, k, q_pos, k_pos, state=state)
    slow = ref_scores(enc, None, q, k, q_pos, k_pos, scale)
    torch.testing.assert_close(fast, slow, **TOL)
    w = torch.randn(fast.shape, generator=g, dtype=F64)
    params = [q, k, *enc.parameters()]
    for a, b in zip(torch.autograd.grad((fast * w).sum(), params), torch.autograd.grad((slow * w).sum(), params)):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("buckets,max_rel", [(4, 8), (256, 512), (6, 12), (0, 3)])
def test_deberta_bounds_are_where_the_table_saturates(buckets, max_rel):
    enc = build("deberta", d_model=8, num_heads=2, position_buckets=buckets, max_relative_positions=max_rel)
    lo, hi = enc.bounds
    span = enc.config.span
    d = torch.arange(lo - 3000, hi + 3001)
    c = enc._canon(d)
    assert (c[d >= hi] == span - 1).all() and (c[d <= lo] == -span).all()
    assert int(enc._canon(torch.tensor([hi - 1]))) != span - 1 and int(enc._canon(torch.tensor([lo + 1]))) != -span


@pytest.mark.parametrize("block", [1, 2, 3])
@pytest.mark.parametrize("label", list(CONFIGS))
def test_fused_blocks_match_reference(label, block, monkeypatch):
    """The sdpa backend's fused kernel one block of 1..3 query rows at a time over 5 queries
    (blocks straddle the diagonal and the clip boundaries), forward and backward."""
    monkeypatch.setattr(fused, "BLOCK_ROWS", block)
    for mode in ("causal", "cross", "gqa"):
        test_attention_matches_reference(label, mode, "sdpa")


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_shaw_value_term_matches_reference(setting):
    enc = make("shaw")
    q_pos, k_pos = SETTINGS[setting]
    g = torch.Generator().manual_seed(8)
    probs = torch.rand(2, 2, q_pos.shape[1], k_pos.shape[1], generator=g, dtype=F64).softmax(-1).requires_grad_(True)
    v = torch.zeros(2, 2, k_pos.shape[1], 4, dtype=F64)
    fast = enc.output(probs, v, q_pos, k_pos)
    slow = ref_value_term(enc, probs, q_pos, k_pos)
    torch.testing.assert_close(fast, slow, **TOL)
    w = torch.randn(fast.shape, generator=g, dtype=F64)
    params = [probs, enc.value_table]
    for a, b in zip(torch.autograd.grad((fast * w).sum(), params), torch.autograd.grad((slow * w).sum(), params)):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["causal", "bidirectional", "cross", "gqa"])
@pytest.mark.parametrize("label", list(CONFIGS))
def test_attention_matches_reference(label, mode, impl):
    """Whole attention layer (mask, softmax, Shaw's value term, o_proj) against the loops:
    the eager backend and the sdpa backend (whose terms go through the fused kernel)."""
    enc = make(label)
    kv = 1 if mode == "gqa" else None
    attn = Attention(8, 2, kv, pe=enc, causal=mode in ("causal", "gqa"), impl=impl, bias=True).to(F64)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 5, 8, generator=g, dtype=F64, requires_grad=True)
    if mode == "cross":
        ctx_x = torch.randn(2, 7, 8, generator=g, dtype=F64, requires_grad=True)
        q_seq = SequenceInfo(torch.tensor([[3, 4, 5, 6, 7], [9, 10, 11, 12, 13]]))
        k_seq = SequenceInfo(torch.stack([torch.arange(7), 2 + torch.arange(7)]))
        ctx = AttentionContext.build(q_seq, k_seq, causal=False)
        fast = attn(x, ctx, context=ctx_x)
    else:
        ctx_x = x
        q_seq = k_seq = SequenceInfo.from_offset(2, 5)
        fast = attn(x, q_seq)

    B, H, D = 2, 2, 4
    Hkv = kv or H
    q = attn.q_proj(x).view(B, -1, H, D).transpose(1, 2)
    k = attn.k_proj(ctx_x).view(B, -1, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, 1)
    v = attn.v_proj(ctx_x).view(B, -1, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, 1)
    scale = enc.attention_scale(D)
    logits = q @ k.transpose(-1, -2) * scale
    if enc.has_terms:
        logits = logits + ref_scores(enc, attn, q, k, q_seq.positions, k_seq.positions, scale)
    if attn.causal:
        logits = logits.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    probs = logits.softmax(-1)
    out = probs @ v
    if enc.has_value_terms:
        out = out + ref_value_term(enc, probs, q_seq.positions, k_seq.positions)
    slow = attn.o_proj(out.transpose(1, 2).reshape(B, 5, H * D))
    # Attention's eager path keeps logits in float32 whatever the input dtype (posenc's rule),
    # so the whole layer matches to float32 precision; the hooks alone match to 1e-10 above.
    tol = dict(atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fast, slow, **tol)
    params = [x, *([ctx_x] if mode == "cross" else []), *enc.parameters(), *attn.q_proj.parameters(), *attn.k_proj.parameters()]
    w = torch.randn(fast.shape, generator=g, dtype=F64)
    for a, b in zip(torch.autograd.grad((fast * w).sum(), params), torch.autograd.grad((slow * w).sum(), params)):
        torch.testing.assert_close(a, b, **tol)


# ---- the skew itself --------------------------------------------------------------------------


@pytest.mark.parametrize("tq,tk", [(1, 6), (3, 7), (7, 3), (5, 5), (2, 1)])
def test_skew_equals_explicit_gather(tq, tk):
    # Column c of the (Tq, Tq + Tk - 1) scores holds index difference i - j = Tq - 1 - c.
    r = tq + tk - 1
    scores = torch.randn(2, 3, tq, r, dtype=F64)
    want = torch.empty(2, 3, tq, tk, dtype=F64)
    for i in range(tq):
        for j in range(tk):
            want[..., i, j] = scores[..., i, (tq - 1) - (i - j)]
    torch.testing.assert_close(skew(scores, tk), want, atol=0, rtol=0)
    # unskew is the adjoint (transpose) of skew: <skew(s), p> == <s, unskew(p)>.
    p = torch.randn(2, 3, tq, tk, dtype=F64)
    torch.testing.assert_close((skew(scores, tk) * p).sum(), (scores * unskew(p, r)).sum(), **TOL)


def test_layout_paths_agree_on_memory_plus_segment():
    """Transformer-XL layout: 6 memory keys + 4 segment keys; skew path == gather path."""
    q_pos = (6 + torch.arange(4)).expand(2, 4)
    k_pos = torch.arange(10).expand(2, 10)
    fast = RelativeLayout.build(q_pos, k_pos)
    assert fast.index is None and fast.num_rows == 13
    d = q_pos[:, :, None] - k_pos[:, None, :]  # (B, Tq, Tk)
    x = torch.randn(2, 3, 4, 5, dtype=F64)
    rows = torch.randn(5, 13, dtype=F64)  # (D, W): column c is the row of distance distances[c]
    got = fast.query_pairs(x, rows)
    for b in range(2):
        for i in range(4):
            for j in range(10):
                c = int((fast.distances == d[b, i, j]).nonzero())
                torch.testing.assert_close(got[b, :, i, j], x[b, :, i] @ rows[:, c], **TOL)


# ---- Transformer-XL segment memory ------------------------------------------------------------


def test_transformer_xl_memory_spans_memory_plus_segment():
    """Segment 2 with a 4-token memory == a forward over the last 4 + 4 tokens (one layer)."""
    model = tiny_model("transformer_xl", n_layer=1)
    tokens = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        cache = model.new_cache(max_length=4, detach=True)
        model(tokens[:, :6], cache=cache)
        assert cache.layers[0].k.shape[2] == 4
        seg2 = model(tokens[:, 6:], cache=cache)
        ref = model(tokens[:, 2:], SequenceInfo.from_offset(2, 8, offset=2))[:, 4:]
    torch.testing.assert_close(seg2, ref, atol=1e-5, rtol=1e-5)


def test_transformer_xl_memory_is_detached():
    model = tiny_model("transformer_xl", n_layer=2).train()
    x = torch.randn(1, 10, 32, requires_grad=True)
    for detach, expect_grad in [(True, False), (False, True)]:
        cache = model.new_cache(max_length=5, detach=detach)
        model(None, inputs_embeds=x[:, :5], cache=cache)
        out = model(None, inputs_embeds=x[:, 5:], cache=cache)
        gx, gu = torch.autograd.grad(out.sum(), [x, model.encodings[0].u], allow_unused=True)
        assert (gx is not None and gx[:, :5].abs().sum() > 0) == expect_grad
        assert gu is not None and gu.abs().sum() > 0  # the encoding still learns from segment 2


# ---- DeBERTa against the reference implementation --------------------------------------------


def test_log_bucket_position_golden_and_reference():
    # bucket_size 256, max_position 512 (DeBERTa-v3): mid = 128, |d| <= 128 kept;
    # d = 300: 128 + ceil(log(300/128) / log(511/128) * 127) = 128 + ceil(78.14) = 207;
    # d = -1000: -(128 + ceil(log(7.8125) / log(3.992) * 127)) = -(128 + ceil(188.6)) = -317.
    d = torch.tensor([0, 5, -5, 128, -128, 129, 300, -1000])
    assert log_bucket_position(d, 256, 512).tolist() == [0, 5, -5, 128, -128, 129, 207, -317]
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    d = torch.arange(-3000, 3001)
    for bs, mp in [(256, 512), (4, 8), (6, 12), (32, 33), (2, 3)]:
        assert log_bucket_position(d, bs, mp).equal(make_log_bucket_position(d, bs, mp).long())


@pytest.mark.parametrize("share", [False, True])
def test_deberta_matches_hf_disentangled_attention(share):
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    C, H, T = 16, 2, 9
    cfg = DebertaV2Config(
        hidden_size=C, num_attention_heads=H, relative_attention=True, pos_att_type=["c2p", "p2c"],
        position_buckets=4, max_relative_positions=8, share_att_key=share,
    )
    torch.manual_seed(0)
    hf = DisentangledSelfAttention(cfg).to(F64).eval()
    enc = build("deberta", d_model=C, num_heads=H, position_buckets=4, max_relative_positions=8,
                share_att_key=share, layer_norm=False).to(F64)
    rel = torch.randn(8, C, dtype=F64)  # 2 * span rows, span = 4 buckets
    with torch.no_grad():
        enc.rel_embeddings.copy_(rel)
        if not share:
            enc.pos_key_proj.load_state_dict(hf.pos_key_proj.state_dict())
            enc.pos_query_proj.load_state_dict(hf.pos_query_proj.state_dict())
    proj = QKProjection(hf.query_proj, hf.key_proj, H, H, C // H)
    x = torch.randn(2, T, C, dtype=F64)
    qh = hf.transpose_for_scores(hf.query_proj(x), H)  # (B*H, T, D)
    kh = hf.transpose_for_scores(hf.key_proj(x), H)
    want = hf.disentangled_attention_bias(qh, kh, None, rel, 3).view(2, H, T, T)
    pos = torch.arange(T).expand(2, T)
    got = enc.score(qh.view(2, H, T, -1), kh.view(2, H, T, -1), pos, pos, proj=proj)
    # HF divides by sqrt(D * 3) computed in float32, hence 1e-7 rather than 1e-10.
    torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-7)


def test_deberta_attention_scale():
    for c2p, p2c, n in [(True, True, 2), (True, False, 1), (False, True, 1)]:
        enc = build("deberta", d_model=32, num_heads=4, c2p=c2p, p2c=p2c)
        assert enc.attention_scale(8) == pytest.approx(1 / math.sqrt(8 * (1 + n)))


def test_shaw_capabilities_follow_config():
    key_only = build("shaw", d_model=8, num_heads=2, use_value=False)
    value_only = build("shaw", d_model=8, num_heads=2, use_key=False)
    assert key_only.has_terms and not key_only.has_value_terms
    assert value_only.has_value_terms and not value_only.has_terms
    both = build("shaw", d_model=8, num_heads=2)
    assert both.has_terms and both.has_value_terms
    pos = torch.arange(4)[None]
    q = torch.randn(1, 2, 4, 4)
    assert [type(t).__name__ for t in key_only.terms(q, q, key_only.prepare(pos, pos), None)] == ["TableTerm"]
    assert [type(t).__name__ for t in value_only.terms(q, q, value_only.prepare(pos, pos), None)] == ["ValueTerm"]


# ---- bad inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,config,match",
    [
        ("shaw", {"clip": 0}, r"clip must be in \[1, 8388607\], got 0"),
        ("shaw", {"use_key": False, "use_value": False}, "use_key, use_value"),
        ("relative_key", {"clip": 0}, r"clip must be in \[1, 8388607\], got 0"),
        ("relative_key_query", {"clip": -2}, r"clip must be in \[1, 8388607\], got -2"),
        ("transformer_xl", {"clip": 0}, r"clip must be in \[1, 1099511627776\], got 0"),
        ("transformer_xl", {"base": -1.0}, r"base must be in \[1.0, inf\), got -1.0"),
        ("deberta", {"c2p": False, "p2c": False}, "c2p, p2c"),
        ("deberta", {"position_buckets": 600, "max_relative_positions": 512}, "position_buckets must be <="),
        ("deberta", {"position_buckets": 1}, "position_buckets must be >= 2"),
        ("deberta", {"position_buckets": 8, "max_relative_positions": 5}, "position_buckets"),
        ("deberta", {"max_relative_positions": 0, "position_buckets": 0}, r"max_relative_positions must be in \[1, 8388608\], got 0"),
    ],
)
def test_bad_config_is_a_clear_error(name, config, match):
    with pytest.raises(ValueError, match=match):
        build(name, d_model=8, num_heads=2, **config)


@pytest.mark.parametrize("name", [n for n in posenc.list_encodings() if build(n, d_model=8, num_heads=2).has_terms])
def test_bad_num_heads(name):
    with pytest.raises(ValueError, match="num_heads"):
        build(name, d_model=8, num_heads=0)


def test_other_bad_inputs():
    with pytest.raises(ValueError, match="bucket_size must be <= max_position"):
        log_bucket_position(torch.arange(5), 16, 8)
    with pytest.raises(ValueError, match="d_model must be even"):
        build("transformer_xl", d_model=9, num_heads=3)
    enc = build("deberta", d_model=8, num_heads=2, share_att_key=True, position_buckets=0, max_relative_positions=4)
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="share_att_key needs the calling attention layer"):
        enc.score(q, q, torch.arange(3)[None], torch.arange(3)[None])
    with pytest.raises(ValueError, match="skew needs"):
        skew(torch.randn(3, 4), 3)


@pytest.mark.parametrize("share_att_key", [False, True])
def test_deberta_no_grad_matches_autograd_and_tracks_parameter_updates(share_att_key):
    """Under no_grad the projected table comes from the per-forward state; it must equal the
    autograd path and follow an in-place parameter update (an optimizer step)."""
    model = tiny_model("deberta", n_layer=2, encoding_config={"share_att_key": share_att_key})
    tokens = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        a = model(tokens)
        a2 = model(tokens)
    torch.testing.assert_close(a, a2, rtol=0, atol=0)
    torch.testing.assert_close(a, model(tokens).detach(), rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.1)  # in place, as an optimizer step
        b = model(tokens)
    torch.testing.assert_close(b, model(tokens).detach(), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize(
    "name,config",
    [("shaw", {}), ("relative_key", {}), ("relative_key_query", {}), ("transformer_xl", {}),
     ("transformer_xl", {"clip": 4}), ("deberta", {}), ("deberta", {"share_att_key": True})],
)
def test_state_prepared_once_per_forward_for_all_layers(name, config, monkeypatch):
    """prepare() runs once per forward (and per decoding step), shared by the three layers
    (and, for Shaw, by its logit and value terms); the result equals the standalone hooks."""
    model = tiny_model(name, n_layer=3, encoding_config=config)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    want = model(tokens).detach()
    calls = []
    encs = [m for m in model.modules() if isinstance(m, PositionalEncoding)]
    assert len(encs) == 1, encs
    cls = type(encs[0])
    prepare, cached, inside = cls.prepare, cls.prepare_cached, []

    def counting(self, *a, **k):  # prepare, or prepare_cached (decoding), counted once a forward
        if not inside:
            calls.append(1)
        return prepare(self, *a, **k)

    def counting_cached(self, *a, **k):
        calls.append(1)
        inside.append(1)
        try:
            return cached(self, *a, **k)
        finally:
            inside.pop()

    monkeypatch.setattr(cls, "prepare", counting)
    monkeypatch.setattr(cls, "prepare_cached", counting_cached)
    with torch.no_grad():
        got = model(tokens)
        assert len(calls) == 1
        cache = model.new_cache()
        model(tokens[:, :5], cache=cache)
        step = model(tokens[:, 5:6], cache=cache)
    assert len(calls) == 3
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(step, want[:, 5:6], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name,config",
    [("deberta", {"position_buckets": 128, "max_relative_positions": 256}),
     ("deberta", {"position_buckets": 64, "max_relative_positions": 128, "c2p": False}),
     ("deberta", {"position_buckets": 64, "max_relative_positions": 64}),
     ("relative_key_query", {"clip": 40})],
)
def test_decoding_forms_match_full_forward(name, config, monkeypatch):
    """A decoding step takes the key-side terms as gathered rows dotted with the cached keys
    (TableTerm.dense without the (Tk, R) table) and DeBERTa's c2p through the queries taken to
    P's width (no projection of P by pos_key_proj); the logits must equal one full forward.
    D = 32 and up to 72 rows (the first DeBERTa config exact to 64, the second logarithmic past 32,
    so only the later steps reach 32 rows), so both forms are chosen; spies assert they were.
    The third DeBERTa config saturates at distance 62 and relative_key_query at 40, so the later
    steps read their oldest keys' one saturated row without a gather (TableTerm._key_rows)."""
    from posenc.relative.deberta import DebertaRelative
    from posenc.terms import TableTerm

    model = tiny_model(name, d_model=64, n_head=2, encoding_config=config, dtype=torch.float64)
    tokens = torch.randint(0, 64, (2, 72), generator=torch.Generator().manual_seed(0))
    taken = {"gather": 0, "c2p": 0, "saturated": 0}
    gather, c2p, saturated = TableTerm._gather_rows, DebertaRelative._c2p_table, TableTerm._saturated

    def spy_gather(self, idx, x):
        taken["gather"] += 1
        return gather(self, idx, x)

    def spy_c2p(self, q, rows):
        taken["c2p"] += 1
        return c2p(self, q, rows)

    def spy_saturated(self, *args):
        taken["saturated"] += 1
        return saturated(self, *args)

    with torch.no_grad():
        want = model(tokens)
        monkeypatch.setattr(TableTerm, "_gather_rows", spy_gather)
        monkeypatch.setattr(DebertaRelative, "_c2p_table", spy_c2p)
        monkeypatch.setattr(TableTerm, "_saturated", spy_saturated)
        # The forms prepare() picks per step; prepare_cached (the projections kept across steps)
        # is tested in test_decoding_reuses_parameter_work_across_steps.
        monkeypatch.setattr(DebertaRelative, "prepare_cached", lambda self, q_pos, k_pos, memo: self.prepare(q_pos, k_pos))
        cache = model.new_cache()
        parts = [model(tokens[:, :8], cache=cache)]
        parts += [model(tokens[:, t : t + 1], cache=cache) for t in range(8, 72)]
    assert taken["gather"] > 0
    assert taken["c2p"] > 0 if name == "deberta" and config.get("c2p", True) else taken["c2p"] == 0
    assert (taken["saturated"] > 0) == (config.get("max_relative_positions") == 64 or name == "relative_key_query")
    torch.testing.assert_close(torch.cat(parts, dim=1), want, rtol=1e-10, atol=1e-10)


def test_deberta_c2p_by_query_equals_projected_rows(monkeypatch):
    """c2p from (q W_k)·P_r + q·b_k equals q·K^r_r with P projected, forward and backward
    (gradients of q, P, W_k and b_k), for one decoding query over 29 rows (log buckets past 16)."""
    enc = build("deberta", d_model=128, num_heads=2, position_buckets=32, max_relative_positions=64, p2c=False)
    enc = enc.double()
    with torch.no_grad():
        enc.pos_key_proj.bias.normal_()  # nonzero: the q·b_k term is checked too
    q_pos, k_pos = torch.tensor([[45]]), torch.arange(46)[None]
    q = torch.randn(1, 2, 1, 64, dtype=torch.float64, requires_grad=True)
    w = torch.randn(1, 2, 1, 46, dtype=torch.float64)
    params = [q, enc.rel_embeddings, enc.pos_key_proj.weight, enc.pos_key_proj.bias]

    def run():
        state = enc.prepare(q_pos, k_pos)
        (term,) = enc.terms(q, q, state)
        out = term.dense(q_pos, k_pos)
        return out, state, torch.autograd.grad((out * w).sum(), params)

    by_query, state, g1 = run()
    assert state.keys is None and state.rows.shape[0] == 29, "one query over many rows: the by-query form"
    monkeypatch.setattr(type(enc), "_c2p_by_query", lambda self, tq, rows: False)
    projected, state, g2 = run()
    assert state.keys is not None
    torch.testing.assert_close(by_query, projected, rtol=1e-12, atol=1e-12)
    for a, b in zip(g1, g2):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["transformer_xl", "deberta"])
def test_decoding_reuses_parameter_work_across_steps(name, monkeypatch):
    """Decoding without autograd keeps the projected position rows in the cache's memo: each
    step projects only the distances it adds (Transformer-XL) or nothing (DeBERTa), and every
    step's logits equal the full forward's. With autograd, no memo is used."""
    model = tiny_model(name, n_layer=2)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(tokens)
    enc = next(m for m in model.modules() if isinstance(m, PositionalEncoding))
    projected = []  # rows projected per call
    if name == "transformer_xl":
        orig = type(enc).relative_keys
        monkeypatch.setattr(type(enc), "relative_keys", lambda self, d: projected.append(d.numel()) or orig(self, d))
    else:
        orig = type(enc)._project
        monkeypatch.setattr(type(enc), "_project", lambda self, p, proj: projected.append(p.shape[0]) or orig(self, p, proj))
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(tokens[:, :6], cache=cache)]
        after_prompt = len(projected)
        steps += [model(tokens[:, t : t + 1], cache=cache) for t in range(6, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), want, rtol=1e-5, atol=1e-5)
    assert after_prompt > 0 and cache.prepare_memo
    if name == "transformer_xl":
        assert projected[after_prompt:] == [1] * 6  # one new distance per step
    else:
        assert len(projected) == after_prompt  # all rows projected once, with the prompt
    cache = model.new_cache()
    model(tokens[:, :6], cache=cache)
    model(tokens[:, 6:7], cache=cache)  # autograd on: prepare(), nothing kept
    assert not cache.prepare_memo


def test_transformer_xl_kept_rows_follow_any_distance_range():
    """Transformer-XL's decoding memo keeps W_R R_d in a buffer that grows in place past its
    end (doubling) and is rebuilt when a step reaches distances below its start (positions
    given by the caller may go back): every step's rows equal a fresh projection of exactly
    that step's distances."""
    enc = build("transformer_xl", d_model=16, num_heads=2).double()
    memo: dict = {}
    steps = [(torch.arange(4, 6), torch.arange(0, 6)),  # distances -1 .. 5: the first buffer
             (torch.tensor([6]), torch.arange(0, 7)),  # 0 .. 6: one row past the end (grows)
             (torch.tensor([13]), torch.arange(0, 14)),  # 0 .. 13: past the doubled capacity (grows again)
             (torch.tensor([0, 1]), torch.arange(-2, 9)),  # -8 .. 3: below the start (rebuilt)
             (torch.tensor([14]), torch.arange(0, 15))]  # 0 .. 14: past the end again
    with torch.no_grad():
        for q_pos, k_pos in steps:
            state = enc.prepare_cached(q_pos[None], k_pos[None], memo)
            lo, hi = int(q_pos.min() - k_pos.max()), int(q_pos.max() - k_pos.min())
            assert (state.bucket.lo, state.bucket.hi) == (lo, hi)
            torch.testing.assert_close(state.keys, enc.relative_keys(torch.arange(lo, hi + 1)), rtol=0, atol=1e-14)
    lo0, hi0, buf = memo["keys"]
    assert (lo0, hi0) == (-8, 14) and buf.shape[-1] >= hi0 - lo0 + 1
