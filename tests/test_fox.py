"""fox: the Forgetting Transformer's data-dependent bias against a slow loop over the paper's
formula (Lin et al. 2025: f_t = sigmoid(w·x_t + b), d_ij = sum_{l=j+1}^{i} log f_l) and against
x-transformers' ``attn_data_dependent_alibi`` attention on the same weights; decoding with a
cache, packing, every backend, and the bias's properties (non-positive, data dependent, ALiBi
for a constant gate)."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import Attention, KVCache, ModelConfig, SequenceInfo, Transformer
from posenc.backends import flex
from posenc.encoding import QKProjection
from posenc.relative.fox import MEMORY_KEY, ForgettingGate
from posenc.terms import PrefixSumTerm

F64 = torch.float64
C, H, D = 16, 2, 8


def _fox(**config) -> ForgettingGate:
    torch.manual_seed(0)
    enc = posenc.build("fox", d_model=C, num_heads=H, **config)
    with torch.no_grad():  # gates spread around 0.5, not x-transformers' 0.993: the bias matters
        enc.gate.bias.normal_()
    return enc


def _slow_logits(q, k, x, w, b, causal: bool, backward: bool) -> torch.Tensor:
    """q·k/sqrt(D) + d_ij, loop by loop: d_ij = sum_{l=j+1}^{i} log sigmoid(w_h·x_l + b_h) for
    j <= i; for j > i the sum over l = i+1..j of the backward heads' gates (or the forward
    heads' with one set). (B, H, T, T) float64, -inf above the diagonal when causal."""
    B, _, T, _ = q.shape
    out = torch.full((B, H, T, T), -math.inf, dtype=F64)
    for bi in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(T if not causal else i + 1):
                    hg = h + H if (backward and j > i) else h
                    ls = range(j + 1, i + 1) if j <= i else range(i + 1, j + 1)
                    d = sum(float(torch.nn.functional.logsigmoid(w[hg] @ x[bi, l] + b[hg])) for l in ls)
                    out[bi, h, i, j] = float(q[bi, h, i] @ k[bi, h, j]) / math.sqrt(D) + d
    return out


@pytest.mark.parametrize("causal,backward", [(True, False), (False, False), (False, True)],
                         ids=["causal", "bidirectional-mirror", "bidirectional-backward-gates"])
@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
def test_attention_equals_slow_loop_over_the_formula(impl, causal, backward, monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)
    enc = _fox(backward_gates=backward).to(F64)
    torch.manual_seed(1)
    attn = Attention(C, H, pe=enc, causal=causal, impl=impl).to(F64)
    x = torch.randn(2, 7, C, dtype=F64)
    with torch.set_grad_enabled(impl != "flex"):  # flex has no CPU backward
        got = attn(x, SequenceInfo.from_offset(2, 7))
    with torch.no_grad():
        q = attn.q_proj(x).view(2, 7, H, D).transpose(1, 2)
        k = attn.k_proj(x).view(2, 7, H, D).transpose(1, 2)
        v = attn.v_proj(x).view(2, 7, H, D).transpose(1, 2)
        probs = _slow_logits(q, k, x, enc.gate.weight, enc.gate.bias, causal, backward).softmax(-1)
        want = attn.o_proj((probs @ v).transpose(1, 2).reshape(2, 7, C))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_bias_is_non_positive_data_dependent_and_zero_on_the_diagonal():
    enc = _fox().to(F64)
    q = torch.zeros(1, H, 9, D, dtype=F64)
    x1, x2 = torch.randn(2, 1, 9, C, dtype=F64)
    d1 = enc.score(q, q, torch.arange(9)[None], torch.arange(9)[None], proj=_handle(x1))[0]  # (H, T, T)
    d2 = enc.score(q, q, torch.arange(9)[None], torch.arange(9)[None], proj=_handle(x2))[0]
    lower = torch.ones(9, 9, dtype=torch.bool).tril()
    assert (d1[:, lower] <= 0).all() and (d1.diagonal(dim1=-2, dim2=-1) == 0).all()
    assert (d1[:, lower] - d2[:, lower]).abs().max() > 0.1  # same positions, other content
    # below the diagonal, keys further back are forgotten more (every log-gate is < 0)
    assert (d1[:, 1:, 0] < 0).all() and (d1[:, 5, :5].diff(dim=-1) > 0).all()


def test_a_constant_gate_is_alibi_with_slope_minus_log_f():
    enc = posenc.build("fox", d_model=C, num_heads=H, bias_init=-1.5).to(F64)
    with torch.no_grad():
        enc.gate.weight.zero_()
    q = torch.zeros(1, H, 6, D, dtype=F64)
    pos = torch.arange(6)[None]
    got = enc.score(q, q, pos, pos, proj=_handle(torch.randn(1, 6, C, dtype=F64)))[0]
    dist = (pos[0, :, None] - pos[0, None, :]).abs().to(F64)
    want = dist * math.log(1 / (1 + math.exp(1.5)))  # (i - j) log sigmoid(-1.5), mirrored above
    torch.testing.assert_close(got, want.expand(H, -1, -1))


def _handle(x: torch.Tensor, memory: dict | None = None) -> QKProjection:
    layer = Attention(C, H)
    return QKProjection.of(layer, x, memory)


def _x_transformers_pair(causal: bool):
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(3)
    peer = xt.Attention(C, heads=H, dim_head=D, causal=causal, data_dependent_alibi=True)
    gate = peer.data_dependent_alibi.to_forget_gates[0]
    with torch.no_grad():
        gate.bias.normal_()  # spread the gates (x-transformers starts them all at sigmoid(5))
    enc = posenc.build("fox", d_model=C, num_heads=H, backward_gates=not causal)
    mine = Attention(C, H, pe=enc, causal=causal, impl="eager")
    ps = peer.state_dict()
    mine.load_state_dict({"q_proj.weight": ps["to_q.weight"], "k_proj.weight": ps["to_k.weight"],
                          "v_proj.weight": ps["to_v.weight"], "o_proj.weight": ps["to_out.weight"],
                          "pe.gate.weight": gate.weight, "pe.gate.bias": gate.bias})
    return peer, mine


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_parity_with_x_transformers_attention(causal):
    peer, mine = _x_transformers_pair(causal)
    x = torch.randn(2, 11, C) * 2
    with torch.no_grad():
        torch.testing.assert_close(mine(x, SequenceInfo.from_offset(2, 11)), peer(x), atol=1e-5, rtol=1e-5)


def test_parity_with_x_transformers_bias_itself():
    """The bias alone: x-transformers' DataDependentAlibi(x) (B, H, T, T) against posenc's term."""
    peer, mine = _x_transformers_pair(causal=True)
    x = torch.randn(2, 11, C)
    with torch.no_grad():
        want = peer.data_dependent_alibi(x)
        q = torch.zeros(2, H, 11, D)
        got = mine.pe.score(q, q, torch.arange(11)[None], torch.arange(11)[None], proj=_handle(x))
    lower = torch.ones(11, 11, dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., lower], want[..., lower])


def _model(**over) -> Transformer:
    cfg = dict(vocab_size=64, d_model=32, n_layer=3, n_head=4, n_kv_head=2, encoding="fox",
               encoding_config={"bias_init": 0.0}, share_encoding=False) | over
    torch.manual_seed(0)
    return Transformer(ModelConfig(**cfg)).to(F64).eval()


def test_each_layer_has_its_own_gates_and_cache_slot():
    model = _model()
    assert len(model.encodings) == 3  # share_encoding=False: the paper's gate per layer
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 5)), cache=cache)
    sums = [cache.layer_state(i)[MEMORY_KEY] for i in range(3)]
    assert all(s.shape == (2, 4, 5) for s in sums)
    assert not torch.equal(sums[0], sums[1])  # each layer's own input and gates


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_decoding_token_by_token_equals_the_full_forward(impl):
    model = _model(attn_impl=impl)
    tokens = torch.randint(0, 64, (2, 12))
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(tokens[:, :3], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(3, 12)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(tokens), atol=1e-10, rtol=1e-10)


def test_a_sliding_memory_keeps_the_sums_of_the_keys_it_keeps():
    """KVCache(max_length=6): a step sees the last 6 keys with c_i - c_j of the whole stream.
    One layer, so the keys' states do not depend on what earlier steps saw; the reference is a
    full prefill whose cache is then cut to the same keys."""
    model = _model(n_layer=1)
    tokens = torch.randint(0, 64, (2, 12))
    cache = KVCache(1, max_length=6)
    with torch.no_grad():
        model(tokens[:, :3], cache=cache)
        for t in range(3, 12):
            got = model(tokens[:, t : t + 1], cache=cache)[:, -1]
            torch.testing.assert_close(got, _windowed(model, tokens[:, : t + 1], max(0, t - 6)), atol=1e-10, rtol=1e-10)


def _windowed(model: Transformer, tokens: torch.Tensor, lo: int) -> torch.Tensor:
    """The last token's logits when its attention sees keys lo.. only: a full prefill of the
    others, its cache cut to keys lo.. (the layer's sums are kept whole; fox reads their tail)."""
    cache = KVCache(len(model.blocks))
    with torch.no_grad():
        model(tokens[:, :-1], cache=cache)
        for c in cache.layers:
            c.set(c.k[:, :, lo:], c.v[:, :, lo:])
        cache.seq = SequenceInfo.from_offset(tokens.shape[0], tokens.shape[1] - 1 - lo, lo)
        return model(tokens[:, -1:], cache=cache)[:, -1]


def test_packed_documents_equal_separate_ones():
    """The sums are not restarted per document: c_i - c_j of two tokens of one document only
    sums that document's gates, and the mask hides every other pair."""
    model = _model(attn_impl="eager")
    seqs = [torch.randint(0, 64, (1, n)) for n in (5, 7, 4)]
    with torch.no_grad():
        packed = model(torch.cat(seqs, dim=1), SequenceInfo.from_cu_seqlens([0, 5, 12, 16]))
        alone = torch.cat([model(s) for s in seqs], dim=1)
    torch.testing.assert_close(packed, alone, atol=1e-10, rtol=1e-10)


def test_a_failed_step_leaves_the_sums_as_they_were():
    model = _model()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 4)), cache=cache)
        before = [dict(cache.layer_state(i)) for i in range(3)]
        with pytest.raises(ValueError, match="batch"):
            model(torch.randint(0, 64, (3, 1)), cache=cache)
    assert all(cache.layer_state(i)[MEMORY_KEY] is before[i][MEMORY_KEY] for i in range(3))


def test_gradient_reaches_the_gates_through_the_cache():
    model = _model()
    model.requires_grad_(True)
    cache = model.new_cache()
    tokens = torch.randint(0, 64, (2, 6))
    model(tokens[:, :4], cache=cache)
    out = model(tokens[:, 4:], cache=cache)
    out.sum().backward()
    assert all(enc.gate.weight.grad.abs().sum() > 0 for enc in model.encodings)


def test_prefix_sum_term_dense_equals_its_score_mod():
    g = torch.Generator().manual_seed(5)
    cq, ck, aq, ak = (torch.randn(2, 3, n, generator=g, dtype=F64) for n in (4, 7, 4, 7))
    for term in (PrefixSumTerm(cq, ck), PrefixSumTerm(cq, ck, (aq, ak))):
        dense = term.dense(None, None)
        mod = term.score_mod(None, None)
        for b in range(2):
            for h in range(3):
                for i in range(4):
                    for j in range(7):
                        z = torch.zeros((), dtype=F64)
                        got = mod(z, torch.tensor(b), torch.tensor(h), torch.tensor(i), torch.tensor(j))
                        assert float(got) == pytest.approx(float(dense[b, h, i, j]), abs=1e-12)
        # query i is stream index 3 + i: keys up to it read c_i - c_j
        assert float(dense[0, 0, 0, 3]) == pytest.approx(float(cq[0, 0, 0] - ck[0, 0, 3]))


def test_refuses_calls_without_the_layer_input_or_the_cached_sums():
    enc = _fox()
    q = torch.zeros(1, H, 3, D)
    pos = torch.arange(3)[None]
    with pytest.raises(ValueError, match="layer's input"):
        enc.score(q, q, pos, pos)
    with pytest.raises(ValueError, match=r"shape \(1, t, 16\)"):
        enc.score(q, q, pos, pos, proj=_handle(torch.zeros(1, 4, C)))
    k = torch.zeros(1, H, 5, D)
    with pytest.raises(ValueError, match="forget gates of all 5 keys"):
        enc.terms(q, k, None, _handle(torch.zeros(1, 3, C)))


def test_cross_attention_reads_the_contexts_gates_with_queries_at_its_end():
    """Cross-attention: the gates are the context's; query i sits at key index Tk - Tq + i (as
    posenc aligns causal cross-attention), so it equals the self-attention rows of those keys."""
    enc = _fox().to(F64)
    attn = Attention(C, H, pe=enc, causal=True, impl="eager").to(F64)
    ctx_x = torch.randn(1, 6, C, dtype=F64)
    ctx = posenc.AttentionContext.build(SequenceInfo.from_offset(1, 2, 4), SequenceInfo.from_offset(1, 6), causal=True)
    with torch.no_grad():
        got = attn(ctx_x[:, -2:], ctx, context=ctx_x)
        torch.testing.assert_close(got, attn(ctx_x, SequenceInfo.from_offset(1, 6))[:, -2:])


@pytest.mark.parametrize("key,value,error,match", [
    ("bias_init", 50.5, ValueError, r"^bias_init must be in \[-50.0, 50.0\], got 50.5$"),
    ("bias_init", float("nan"), ValueError, "bias_init"),
    ("backward_gates", 1, TypeError, "backward_gates"),
])
def test_config_refuses_bad_values_by_name(key, value, error, match):
    with pytest.raises(error, match=match):
        posenc.build("fox", d_model=C, num_heads=H, **{key: value})


def test_the_probe_reads_positions_as_one_stream_of_identical_tokens():
    """``posenc check``'s probe: a query at p and a key at 0 are the ends of a stream of p + 1
    identical tokens, run in steps of STREAM_CHUNK through the cache slot; it equals column 0
    of one self-attention call over the stream, and every gate is the same: ALiBi-like."""
    from posenc.analysis import probes as P

    probe = P.Probe()
    enc = posenc.build("fox", d_model=probe.d_model, num_heads=probe.num_heads, bias_init=0.0)
    n = P.STREAM_CHUNK + 90
    stream = P.position_logits(enc, torch.arange(n), torch.tensor([0]), probe, terms_only=True)[:, :, 0]  # (H, n)
    whole = P.position_logits(enc, torch.arange(n), torch.arange(n), probe, terms_only=True)[:, :, 0]
    torch.testing.assert_close(stream, whole, atol=1e-4, rtol=1e-6)
    slope = stream[:, 1:2]  # log f of the one gate
    assert (slope < 0).all()
    torch.testing.assert_close(stream, slope * torch.arange(n, dtype=F64), atol=1e-3, rtol=1e-5)


def test_the_figure_forgets_the_sentences_before_the_last_end(tmp_path):
    pytest.importorskip("matplotlib")
    from posenc.analysis.fig_fox import plot_fox_forgetting

    res = plot_fox_forgetting(tmp_path, text="a b . c d . e f", closed=-3.0, open_=4.0)
    assert res.path.exists()
    gates, bias = res.data["gates"], res.data["bias"]  # (2, T), (2, T, T)
    words = res.data["words"]
    log_f = gates.log()
    for h in range(2):  # the paper's sum, loop by loop
        for i in range(len(words)):
            for j in range(i + 1):
                assert float(bias[h, i, j]) == pytest.approx(float(log_f[h, j + 1 : i + 1].sum()), abs=1e-12)
    sig = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    assert float(gates[0, 2]) == pytest.approx(sig(-3.0)) and float(gates[0, 0]) == pytest.approx(sig(4.0))
    last = bias[0, -1]  # from "f": the last sentence is near 0, each "." before it costs about 3
    assert last[-2] > -0.1 and last[4] < -3.0 and last[1] < last[4] - 3.0
    torch.testing.assert_close(bias[1, -1], (len(words) - 1 - torch.arange(len(words))) * math.log(sig(0.5)), check_dtype=False)


@pytest.mark.parametrize("after", [False, True], ids=["mirror", "backward-sums"])
@pytest.mark.parametrize("mask_kind", ["causal", "causal+padding", "none"])
def test_fused_reads_the_sums_and_returns_their_gradients(mask_kind, after):
    """fused_attention with a PrefixSumTerm (no (Tq, Tk) bias kept) against the same attention
    with the term's dense difference as a bias, forward and backward, in blocks of 3 rows."""
    from posenc.backends.fused import fused_attention

    g = torch.Generator().manual_seed(11)
    B, Hh, Tq, Tk, Dd = 2, 3, 7, 9, 4
    mk = lambda *s: torch.randn(*s, generator=g, dtype=F64, requires_grad=True)  # noqa: E731
    q, k, v = mk(B, Hh, Tq, Dd), mk(B, Hh, Tk, Dd), mk(B, Hh, Tk, Dd)
    cq, ck = mk(B, Hh, Tq), mk(B, Hh, Tk)
    pair = (mk(B, Hh, Tq), mk(B, Hh, Tk)) if after else None
    term = PrefixSumTerm(cq, ck, pair)
    causal = mask_kind != "none"
    mask = None
    if mask_kind == "causal+padding":
        mask = torch.ones(B, 1, Tq, Tk, dtype=torch.bool)
        mask[0, ..., :3] = False  # the first row's first keys are padding
    inputs = [q, k, v, cq, ck, *(pair or ())]
    got = fused_attention(q, k, v, scale=0.5, mask=mask, causal=causal, sums=[term], block=3)
    want = fused_attention(q, k, v, scale=0.5, mask=mask, causal=causal, bias=term.dense(None, None), block=3)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    w = torch.randn(got.shape, generator=g, dtype=F64)
    for a, b in zip(torch.autograd.grad((got * w).sum(), inputs), torch.autograd.grad((want * w).sum(), inputs)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
