"""Content-dependent relative encodings (shaw, relative_key(_query), transformer_xl, deberta)
through the shared terms path, against the slow loops over the papers' formulas in
tests/content_reference.py: the fast paths (skew on contiguous positions, gather otherwise)
match in float64 to 1e-10, forward and backward (gradients w.r.t. q, k and the encoding's
parameters), in attention, fused blocks and decoding; the state is prepared once per forward.
What one encoding alone does is tested in its own file (tests/test_<module>.py).
"""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import SequenceInfo, build
from posenc.attention import Attention
from posenc.context import AttentionContext
from posenc.backends import fused
from posenc.encoding import PositionalEncoding
from posenc.relative import RelativeLayout, log_bucket_position, skew, unskew

from content_reference import CONFIGS, F64, SETTINGS, TOL, has_key_term, layer_stub, make, ref_scores, ref_value_term
from helpers import tiny_model

torch.set_default_dtype(torch.float32)


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


@pytest.mark.parametrize("block", [1, 2, 3])
@pytest.mark.parametrize("label", list(CONFIGS))
def test_fused_blocks_match_reference(label, block, monkeypatch):
    """The sdpa backend's fused kernel one block of 1..3 query rows at a time over 5 queries
    (blocks straddle the diagonal and the clip boundaries), forward and backward."""
    monkeypatch.setattr(fused, "BLOCK_ROWS", block)
    for mode in ("causal", "cross", "gqa"):
        test_attention_matches_reference(label, mode, "sdpa")


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


