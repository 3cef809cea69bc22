"""per_row_alibi: x-transformers' PerRowDataDependentAlibi (FoX's forget gates, computed per query
row) against a slow loop over its formula (b_ij = sum_{l=j}^{i-1} s log sigmoid(u_i·v_l / sqrt(d)),
transcribed here, with posenc's mirror for keys after the query), against the installed
x-transformers on the same weights (the bias and the whole attention), the exact special case
that is FoX with shifted gates, and decoding, packing and the bias's properties; the fused path's
blockwise stick term (no (Tq, Tk) tensor kept) against the dense term and the slow loop, forward
and backward, and what autograd saves."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from helpers import assert_same_grads
from posenc import Attention, KVCache, ModelConfig, SequenceInfo, Transformer
from posenc.backends import LEAVES, LayerTerms, Leaf, flex, fused, plan
from posenc.backends import stick_breaking as sticks
from posenc.backends.fused import fused_attention
from posenc.encoding import QKProjection
from posenc.masks import AttentionMask
from posenc.relative.per_row_alibi import MEMORY_KEY, PerRowDataDependentAlibi, per_row_bias, per_row_term
from posenc.terms import StickTerm

F64 = torch.float64
C, H, D, d = 16, 2, 8, 4


def _enc(**config) -> PerRowDataDependentAlibi:
    torch.manual_seed(0)
    return posenc.build("per_row_alibi", d_model=C, num_heads=H, dim_head=d, **config)


def _gates(x: torch.Tensor, w: torch.Tensor, s: float) -> torch.Tensor:
    """g[b, h, i, l] = s log sigmoid(u_i · v_l / sqrt(d)), loop by loop, with w laid out as
    x-transformers' (qk h d) rows: u = rows [h d, (h + 1) d), v = rows H d + [h d, (h + 1) d)."""
    B, T, _ = x.shape
    g = torch.zeros(B, H, T, T, dtype=F64)
    for b in range(B):
        for h in range(H):
            wu, wv = w[h * d : (h + 1) * d], w[H * d + h * d : H * d + (h + 1) * d]
            for i in range(T):
                for l in range(T):
                    z = float((wu @ x[b, i]) @ (wv @ x[b, l])) / math.sqrt(d)
                    g[b, h, i, l] = s * float(torch.nn.functional.logsigmoid(torch.tensor(z, dtype=F64)))
    return g


def _slow_bias(x: torch.Tensor, w: torch.Tensor, s: float = 1.0) -> torch.Tensor:
    """b_ij = sum_{l=j}^{i-1} g_il for j <= i (x-transformers: diagonal and above masked, then
    a reverse cumulative sum), sum_{l=i+1}^{j} g_il for j > i (posenc's mirror)."""
    g = _gates(x, w, s)
    B, _, T, _ = g.shape
    out = torch.zeros_like(g)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(T):
                    ls = range(j, i) if j <= i else range(i + 1, j + 1)
                    out[b, h, i, j] = sum(float(g[b, h, i, l]) for l in ls)
    return out


def _handle(x: torch.Tensor, memory: dict | None = None) -> QKProjection:
    return QKProjection.of(Attention(C, H), x, memory)


def _score(enc, x: torch.Tensor) -> torch.Tensor:
    T = x.shape[1]
    q = torch.zeros(x.shape[0], H, T, D, dtype=x.dtype)
    pos = torch.arange(T)[None]
    return enc.score(q, q, pos, pos, proj=_handle(x))


@pytest.mark.parametrize("scale", [1.0, 0.3])
def test_bias_equals_slow_loop_over_the_formula(scale):
    enc = _enc(post_log_scale=scale).to(F64)
    x = torch.randn(2, 7, C, dtype=F64)
    torch.testing.assert_close(_score(enc, x), _slow_bias(x, enc.gate.weight.detach(), scale), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional-mirror"])
@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
def test_attention_equals_slow_loop(impl, causal, monkeypatch, plans):
    """sdpa is the fused leaf, here in blocks of 3 query rows (3, 3 and a ragged 1)."""
    monkeypatch.setattr(flex, "COMPILE", False)
    monkeypatch.setattr(fused, "BLOCK_ROWS", 3)
    enc = _enc().to(F64)
    torch.manual_seed(1)
    attn = Attention(C, H, pe=enc, causal=causal, impl=impl).to(F64)
    x = torch.randn(2, 7, C, dtype=F64)
    with torch.set_grad_enabled(impl != "flex"):  # flex has no CPU backward
        got = attn(x, SequenceInfo.from_offset(2, 7))
    with torch.no_grad():
        q, k, v = (p(x).view(2, 7, H, D).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        logits = q @ k.transpose(-2, -1) / math.sqrt(D) + _slow_bias(x, enc.gate.weight)
        if causal:
            logits = logits.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), -math.inf)
        want = attn.o_proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, C))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    assert [p.leaf for p in plans] == [{"eager": Leaf.EAGER, "sdpa": Leaf.FUSED, "flex": Leaf.FLEX}[impl]]


def _x_transformers():
    return pytest.importorskip("x_transformers.x_transformers")


def test_parity_with_x_transformers_bias_itself():
    """x-transformers' PerRowDataDependentAlibi(x) (B, H, T, T) on the same weights: equal on
    and below the diagonal (above it, x-transformers writes 0 and its causal mask hides it)."""
    xt = _x_transformers()
    torch.manual_seed(3)
    peer = xt.PerRowDataDependentAlibi(C, H, causal=True, dim_head=d, post_log_scale=0.7)
    enc = _enc(post_log_scale=0.7)
    enc.load_state_dict({"gate.weight": peer.to_forget_gates[0].weight})
    x = torch.randn(2, 11, C)
    with torch.no_grad():
        want, got = peer(x), _score(enc, x)
    lower = torch.ones(11, 11, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., lower], want[..., lower], atol=1e-5, rtol=1e-5)
    assert float(want[..., lower].abs().max()) > 1.0  # the bias is not negligible at init


def test_parity_with_x_transformers_attention():
    xt = _x_transformers()
    torch.manual_seed(4)
    peer = xt.Attention(C, heads=H, dim_head=D, causal=True, data_dependent_alibi=True,
                        data_dependent_alibi_per_row=True, data_dependent_alibi_per_row_dim_head=d)
    mine = Attention(C, H, pe=_enc(), causal=True, impl="eager")
    ps = peer.state_dict()
    mine.load_state_dict({"q_proj.weight": ps["to_q.weight"], "k_proj.weight": ps["to_k.weight"],
                          "v_proj.weight": ps["to_v.weight"], "o_proj.weight": ps["to_out.weight"],
                          "pe.gate.weight": ps["data_dependent_alibi.to_forget_gates.0.weight"]})
    x = torch.randn(2, 11, C) * 2
    with torch.no_grad():
        torch.testing.assert_close(mine(x, SequenceInfo.from_offset(2, 11)), peer(x), atol=1e-5, rtol=1e-5)


def test_a_constant_gate_query_is_fox_with_gates_of_the_previous_token():
    """u_i = u for every token (the gate-query rows read only a constant input feature): then
    g_il = log sigmoid(w·x_l) with w = W_vᵀ u / sqrt(d), and sum_{l=j}^{i-1} g_il is FoX's
    sum_{l=j+1}^{i} log f'_l for gates f'_l = sigmoid(w·x_{l-1}) read from the previous
    token's input: exactly, at and below the diagonal (the mirrors differ by the same shift)."""
    enc = _enc().to(F64)
    fox = posenc.build("fox", d_model=C, num_heads=H, bias_init=0.0).to(F64)
    torch.manual_seed(5)
    x = torch.randn(2, 9, C, dtype=F64)
    x[..., 0] = 1.0  # the constant feature
    u = torch.randn(H, d, dtype=F64)
    with torch.no_grad():
        w = enc.gate.weight  # (2 H d, C)
        w[: H * d] = 0.0
        w[: H * d, 0] = u.flatten()
        wv = w[H * d :].view(H, d, C)
        fox.gate.weight.copy_(torch.einsum("hd,hdc->hc", u, wv) / math.sqrt(d))
        shifted = torch.cat([torch.randn(2, 1, C, dtype=F64), x[:, :-1]], dim=1)  # x'_l = x_{l-1}
        got, want = _score(enc, x), _score(fox, shifted)
    lower = torch.ones(9, 9, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., lower], want[..., lower], atol=1e-12, rtol=1e-12)
    assert not torch.allclose(got[..., ~lower], want[..., ~lower])  # the mirrors are not the same
    # ... and not FoX on the unshifted input: the one-token shift is the difference
    assert not torch.allclose(got[..., lower], _score(fox, x)[..., lower])


def test_bias_is_non_positive_per_row_and_zero_on_the_diagonal():
    enc = _enc().to(F64)
    x = torch.randn(1, 9, C, dtype=F64)
    b = _score(enc, x)[0]  # (H, T, T)
    assert (b <= 0).all() and (b.diagonal(dim1=-2, dim2=-1) == 0).all()
    assert (b[:, 1:, 0] < 0).all() and (b[:, 8, :8].diff(dim=-1) > 0).all()  # further back: forgotten more
    # per row: the step from key j to j + 1 is g_ij, which depends on the query i, so two rows
    # differ on the same pair of keys (FoX's steps log f_{j+1} are the same in every row)
    steps = b[:, :, 1:3].diff(dim=-1)[:, 3:, 0]  # (H, 6): g_i1 for queries i = 3..8
    assert (steps.max(dim=-1).values - steps.min(dim=-1).values > 1e-3).all()


def _model(**over) -> Transformer:
    cfg = dict(vocab_size=64, d_model=32, n_layer=3, n_head=4, n_kv_head=2, encoding="per_row_alibi",
               encoding_config={"dim_head": 4}, share_encoding=False) | over
    torch.manual_seed(0)
    return Transformer(ModelConfig(**cfg)).to(F64).eval()


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_decoding_token_by_token_equals_the_full_forward(impl):
    model = _model(attn_impl=impl)
    tokens = torch.randint(0, 64, (2, 12))
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(tokens[:, :3], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(3, 12)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(tokens), atol=1e-10, rtol=1e-10)
    assert all(cache.layer_state(i)[MEMORY_KEY].shape == (2, 4, 12, 4) for i in range(3))


def test_a_sliding_memory_keeps_the_gate_keys_of_the_keys_it_keeps():
    """KVCache(max_length=6), one layer: a step sees the last 6 keys, and its sums over them need
    no gate of a dropped key. The reference: the same step on a full prefill cut to those keys."""
    model = _model(n_layer=1)
    tokens = torch.randint(0, 64, (2, 12))
    cache = KVCache(1, max_length=6)
    with torch.no_grad():
        model(tokens[:, :3], cache=cache)
        for t in range(3, 12):
            got = model(tokens[:, t : t + 1], cache=cache)[:, -1]
            lo = max(0, t - 6)
            ref = KVCache(1)
            model(tokens[:, :t], cache=ref)
            c = ref.layers[0]
            c.set(c.k[:, :, lo:], c.v[:, :, lo:])
            ref.seq = SequenceInfo.from_offset(2, t - lo, lo)
            torch.testing.assert_close(got, model(tokens[:, t : t + 1], cache=ref)[:, -1], atol=1e-10, rtol=1e-10)


def test_packed_documents_equal_separate_ones():
    model = _model(attn_impl="eager")
    seqs = [torch.randint(0, 64, (1, n)) for n in (5, 7, 4)]
    with torch.no_grad():
        packed = model(torch.cat(seqs, dim=1), SequenceInfo.from_cu_seqlens([0, 5, 12, 16]))
        alone = torch.cat([model(s) for s in seqs], dim=1)
    torch.testing.assert_close(packed, alone, atol=1e-10, rtol=1e-10)


def test_gradient_reaches_the_gates_through_the_cache():
    model = _model()
    cache = model.new_cache()
    tokens = torch.randint(0, 64, (2, 6))
    model(tokens[:, :4], cache=cache)
    model(tokens[:, 4:], cache=cache).sum().backward()
    assert all(enc.gate.weight.grad.abs().sum() > 0 for enc in model.encodings)


def test_per_row_bias_aligns_queries_at_the_end_of_the_keys():
    """Two queries against five keys are rows 3 and 4 of the square bias."""
    g = torch.Generator().manual_seed(7)
    u, v = torch.randn(1, 2, 5, 3, generator=g, dtype=F64), torch.randn(1, 2, 5, 3, generator=g, dtype=F64)
    torch.testing.assert_close(per_row_bias(u[..., 3:, :], v), per_row_bias(u, v)[..., 3:, :])


def test_refuses_calls_without_the_layer_input_or_the_cached_gate_keys():
    enc = _enc()
    q = torch.zeros(1, H, 3, D)
    pos = torch.arange(3)[None]
    with pytest.raises(ValueError, match="per_row_alibi computes its forget gates from the attention layer's input"):
        enc.score(q, q, pos, pos)
    with pytest.raises(ValueError, match=r"shape \(1, t, 16\)"):
        enc.score(q, q, pos, pos, proj=_handle(torch.zeros(1, 4, C)))
    with pytest.raises(ValueError, match="gate keys of all 5 keys"):
        enc.terms(q, torch.zeros(1, H, 5, D), None, _handle(torch.zeros(1, 3, C)))


@pytest.mark.parametrize("key,value,error,match", [
    ("dim_head", 0, ValueError, r"^dim_head must be in \[1, 1024\], got 0$"),
    ("dim_head", 1025, ValueError, r"^dim_head must be in \[1, 1024\], got 1025$"),
    ("post_log_scale", -0.5, ValueError, r"^post_log_scale must be in \[0.0, 100.0\], got -0.5$"),
    ("post_log_scale", float("inf"), ValueError, "post_log_scale"),
    ("dim_head", 8.0, TypeError, "dim_head"),
])
def test_config_refuses_bad_values_by_name(key, value, error, match):
    with pytest.raises(error, match=match):
        posenc.build("per_row_alibi", d_model=C, num_heads=H, **{key: value})


def test_the_probe_reads_identical_tokens_as_alibi():
    """``posenc check``'s stream of identical tokens: every gate is the same, so the bias of a
    query at p for the key at 0 is p times one log gate (per head), through the cache slot."""
    from posenc.analysis import probes as P

    probe = P.Probe()
    enc = posenc.build("per_row_alibi", d_model=probe.d_model, num_heads=probe.num_heads)
    n = P.STREAM_CHUNK + 90
    stream = P.position_logits(enc, torch.arange(n), torch.tensor([0]), probe, terms_only=True)[:, :, 0]  # (H, n)
    slope = stream[:, 1:2]
    assert (slope < 0).all()
    torch.testing.assert_close(stream, slope * torch.arange(n, dtype=F64), atol=1e-3, rtol=1e-5)


# ---- the fused path: the stick term block by block ----------------------------------------------------
TOL = dict(atol=1e-12, rtol=1e-10)


def _recording(fn, calls: list):
    def wrapped(self, x):
        calls.append(x.shape)
        return fn(self, x)

    return wrapped


def _blocks_call(kind: str, causal: bool, T: int = 23, Tq: int | None = None):
    """q, k, v, gate vectors (leaves, float64) and the layer's terms for a call of Tq queries
    against T keys: plain rows, left padding (row 0's first 5 keys), three packed documents, or
    a prefill of the last Tq tokens. Gates doubled: log sigmoid far from its value at 0."""
    g = torch.Generator().manual_seed(5)
    Tq = T if Tq is None else Tq
    B = 1 if kind == "packed" else 2
    if kind == "padded":
        valid = torch.ones(2, T, dtype=torch.bool)
        valid[0, :5] = False
        q_seq = k_seq = SequenceInfo.from_padding_mask(valid)
    elif kind == "packed":
        q_seq = k_seq = SequenceInfo.from_cu_seqlens([0, 9, 17, T])
    else:
        q_seq, k_seq = SequenceInfo.from_offset(B, Tq, T - Tq), SequenceInfo.from_offset(B, T)
    mask = AttentionMask.build(q_seq, k_seq, causal=causal)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=F64).requires_grad_()
    k = torch.randn(B, H, T, D, generator=g, dtype=F64).requires_grad_()
    v = torch.randn(B, H, T, D, generator=g, dtype=F64).requires_grad_()
    gq = (torch.randn(B, H, Tq, d, generator=g, dtype=F64) * 2).requires_grad_()
    gk = (torch.randn(B, H, T, d, generator=g, dtype=F64) * 2).requires_grad_()
    term = per_row_term(gq, gk, 0.7)
    return (q, k, v, gq, gk), mask, LayerTerms(q_seq.positions, k_seq.positions, logits=(term,))


@pytest.mark.parametrize("kind,causal", [("plain", True), ("plain", False), ("padded", True), ("padded", False),
                                         ("packed", True), ("prefill", True), ("prefill", False)])
def test_fused_blocks_equal_the_dense_term_forward_and_backward(kind, causal, monkeypatch):
    """The fused leaf sums the term block by block from the gate vectors (blocks of 4 query
    rows, the last ragged: 23 = 5·4 + 3; a prefill of 9 queries against 23 keys), against the
    eager leaf with the dense term: the output and the gradients of q, k, v and both gates."""
    monkeypatch.setattr(fused, "BLOCK_ROWS", 4)
    made = []
    monkeypatch.setattr(sticks.StickBlock, "add_to", _recording(sticks.StickBlock.add_to, made))
    inputs, mask, terms = _blocks_call(kind, causal, Tq=9 if kind == "prefill" else None)
    q, k, v = inputs[:3]
    assert plan("sdpa", q, k, v, mask, terms).leaf is Leaf.FUSED
    got = LEAVES[Leaf.FUSED](q, k, v, scale=1 / math.sqrt(D), mask=mask, terms=terms)
    assert len(made) == -(-q.shape[2] // 4), "the fused leaf did not sum the term block by block"
    want = LEAVES[Leaf.EAGER](q, k, v, scale=1 / math.sqrt(D), mask=mask, terms=terms)
    torch.testing.assert_close(got, want, **TOL)
    assert_same_grads(got, want, inputs, **TOL)


def _slow_attention(x, attn, enc, causal: bool, valid=None) -> torch.Tensor:
    """Softmax attention over q·k / sqrt(D) plus the slow loop's bias, key by key (float64)."""
    B, T, _ = x.shape
    q, k, v = (p(x).view(B, T, H, D).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    logits = q @ k.transpose(-2, -1) / math.sqrt(D) + _slow_bias(x, enc.gate.weight.detach(), enc.config.post_log_scale)
    seen = torch.ones(B, 1, T, T, dtype=torch.bool)
    if causal:
        seen = seen & torch.ones(T, T, dtype=torch.bool).tril()
    if valid is not None:
        seen = seen & valid[:, None, None, :]
    out = logits.masked_fill(~seen, -math.inf).softmax(-1) @ v
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_fused_training_step_equals_the_slow_loop_and_the_dense_gradients(causal, monkeypatch, plans):
    """Attention(impl="sdpa") with autograd takes the fused leaf (blocks of 4 rows over 11
    tokens, row 0 left-padded by 3): its output on the valid rows equals the slow loop's, and
    the gradients of the layer input and of every weight (the gate map's included) equal those
    through the dense term (impl="eager"; the slow loop's float arithmetic has none)."""
    monkeypatch.setattr(fused, "BLOCK_ROWS", 4)
    enc = _enc(post_log_scale=0.6).to(F64)
    torch.manual_seed(6)
    attn = Attention(C, H, pe=enc, causal=causal, impl="sdpa").to(F64)
    x = (torch.randn(2, 11, C, dtype=F64) * 2).requires_grad_()
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[0, :3] = False
    seq = SequenceInfo.from_padding_mask(valid)
    got = attn(x, seq)
    assert [p.leaf for p in plans] == [Leaf.FUSED]
    rows = valid[..., None]  # padding rows' outputs are meaningless (the slow loop's are NaN)
    with torch.no_grad():
        torch.testing.assert_close(got[valid], _slow_attention(x, attn, enc, causal, valid)[valid], atol=1e-10, rtol=1e-10)
    attn.impl = "eager"
    want = attn(x, seq)
    params = [x] + list(attn.parameters())
    assert any(p is enc.gate.weight for p in params)
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(7), dtype=F64) * rows
    for a, b in zip(torch.autograd.grad((got * w).sum(), params), torch.autograd.grad((want * w).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_of_the_blockwise_gates(causal):
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 1, 5, 3, generator=g, dtype=F64).requires_grad_() for _ in range(3))
    gq, gk = (torch.randn(1, 1, 5, 2, generator=g, dtype=F64).mul(2).requires_grad_() for _ in range(2))
    fn = lambda q, k, v, gq, gk: fused_attention(q, k, v, scale=0.6, causal=causal, block=2,  # noqa: E731
                                                 sticks=[per_row_term(gq, gk, 0.8)])
    assert torch.autograd.gradcheck(fn, (q, k, v, gq, gk))


def test_the_term_is_a_stick_term_of_the_layer_gates():
    """terms() gives a StickTerm over the gate vectors (B, H, T, d), not a (Tq, Tk) tensor; its
    dense form is the slow loop's bias."""
    enc = _enc().to(F64)
    x = torch.randn(2, 7, C, dtype=F64)
    q = torch.zeros(2, H, 7, D, dtype=F64)
    (term,) = enc.terms(q, q, None, _handle(x))
    assert isinstance(term, StickTerm) and term.normalized
    assert [tuple(t.shape) for t in term.tensors()] == [(2, H, 7, d), (2, H, 7, d)]
    torch.testing.assert_close(term.dense(None, None), _slow_bias(x, enc.gate.weight.detach()), atol=1e-12, rtol=1e-12)


def test_training_keeps_no_tensor_of_size_tq_tk():
    """Autograd's saved tensors through the fused leaf (sdpa): the inputs, the output and the
    (B, H, T, d) gate vectors, nothing of T·T; the eager reference keeps (1, H, T, T) tensors."""
    T = 96
    enc = _enc()
    x = torch.randn(1, T, C, requires_grad=True)

    def largest_saved(impl: str) -> int:
        attn = Attention(C, H, pe=enc, causal=True, impl=impl)
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            attn(x, SequenceInfo.from_offset(1, T)).sum().backward()
        assert sizes
        return max(sizes)

    assert largest_saved("sdpa") < T * T  # (1, T, 16), (1, 2, T, 8)
    assert largest_saved("eager") >= H * T * T


def test_fused_attention_refuses_gates_of_another_shape():
    q = torch.randn(1, H, 4, D)
    gk = torch.randn(1, H, 4, d)
    with pytest.raises(ValueError, match=r"a stick term's gates must be float \(B=1, H=2, Tq=4, d\)"):
        fused_attention(q, q, q, scale=1.0, sticks=[per_row_term(torch.randn(1, H, 3, d), gk)])
    with pytest.raises(ValueError, match=r"a stick term's gates must be float"):
        fused_attention(q, q, q, scale=1.0, sticks=[per_row_term(torch.randn(1, H, 4, d), torch.randn(1, H, 4, d + 1))])
