"""stick_breaking: stick-breaking attention against a slow loop over the paper's formula (Tan et
al. 2024: A_ij = beta_ij prod_{j<t<i} (1 - beta_it), beta = sigmoid(q·k / sqrt(D)), o_i = sum_j
A_ij v_j) and against the reference's own log-space formulation (``sb_ref.stickbreaking`` of
shawntan/stickbreaking-attention); the fused function's blockwise sums against the dense term,
forward and backward; decoding with a cache, packing and padding; and the properties of the
weights (rows sum to 1 - prod (1 - beta); a spent stick gives nothing, a sure break takes all)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from helpers import assert_same_grads, tiny_model
from posenc import Attention, SequenceInfo
from posenc.backends import LEAVES, LayerTerms, Leaf, flex, plan
from posenc.backends import stick_breaking as sticks
from posenc.backends.fused import fused_attention
from posenc.masks import AttentionMask
from posenc.relative.stick_breaking import StickBreaking
from posenc.terms import StickBreakingTerm

F64 = torch.float64
C, H, D = 16, 2, 8
TOL = dict(atol=1e-12, rtol=1e-10)


@pytest.fixture(autouse=True)
def _eager_flex(monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)


def _enc(attend_current: bool = False) -> StickBreaking:
    return posenc.build("stick_breaking", d_model=C, num_heads=H, attend_current=attend_current)


def _slow_weights(q: torch.Tensor, k: torch.Tensor, attend_current: bool, causal: bool = True) -> torch.Tensor:
    """A_ij from the paper's products, loop by loop, float64 (B, H, Tq, Tk); queries are the last
    Tq keys. Key j <= i (j < i without attend_current): beta_ij times (1 - beta_it) over the keys
    t strictly between j and i (and i itself with attend_current). Key j > i (bidirectional):
    the mirror image, t between i and j. 0 where no share is taken."""
    B, _, Tq, _ = q.shape
    Tk = k.shape[2]
    beta = lambda b, h, i, t: torch.sigmoid(q[b, h, i] @ k[b, h, t] / math.sqrt(D))  # noqa: E731
    out = torch.zeros(B, H, Tq, Tk, dtype=F64)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                s = Tk - Tq + i  # the query's stream index
                for j in range(Tk):
                    if j == s and not attend_current or (j > s and causal):
                        continue
                    if j <= s:
                        between = range(j + 1, s + 1 if attend_current else s)
                    else:
                        between = range(s if attend_current else s + 1, j)
                    a = beta(b, h, i, j)
                    for t in between:
                        a = a * (1 - beta(b, h, i, t))
                    out[b, h, i, j] = a
    return out


def _qkv(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    B, T, _ = x.shape
    return tuple(p(x).view(B, T, H, D).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))


def _out(attn: Attention, weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    B, _, T, _ = v.shape
    return attn.o_proj((weights @ v).transpose(1, 2).reshape(B, T, C))


# ---- the formula ---------------------------------------------------------------------------------
@pytest.mark.parametrize("attend_current", [False, True], ids=["before", "attend_current"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
def test_attention_equals_slow_loop_over_the_formula(impl, causal, attend_current):
    enc = _enc(attend_current).to(F64)
    torch.manual_seed(1)
    attn = Attention(C, H, pe=enc, causal=causal, impl=impl).to(F64)
    x = torch.randn(2, 7, C, dtype=F64) * 3  # logits of a few units: shares from near 0 to near 1
    with torch.set_grad_enabled(impl != "flex"):  # flex has no CPU backward
        got = attn(x, SequenceInfo.from_offset(2, 7))
    q, k, v = _qkv(attn, x)
    want_weights = _slow_weights(q.detach(), k.detach(), attend_current, causal)
    torch.testing.assert_close(got, _out(attn, want_weights, v), **TOL)
    torch.testing.assert_close(enc.weights(q, k).tril() if causal else enc.weights(q, k), want_weights, **TOL)


def _reference_formulation(q, k, v, attend_current: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-space computation of shawntan/stickbreaking-attention's
    ``stickbreaking_attention/sb_ref.py`` (``stickbreaking(q, k, v, mask, cum_weight)``, at
    3147a38), with the mask and cumulative weights its tests build (``tests/test_attn.py``:
    ``triu(0)``, or ``triu(1)`` with attend_current; ``tril(-1)``): log beta hidden by -1e5,
    log(1 - beta) summed over the keys after j by a matrix product. Returns (o, rem)."""
    T = q.shape[2]
    hidden = torch.ones(T, T).triu(1 if attend_current else 0).bool()  # True: no share
    after_j = torch.ones(T, T).tril(-1).to(q)  # [t, j] = 1 for t > j
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    log_share = F.logsigmoid(logits).masked_fill(hidden, -1e5)
    log_keep = F.logsigmoid(-logits).masked_fill(hidden, 0)
    weights = torch.exp(log_share + log_keep @ after_j)
    return weights @ v, 1 - weights.sum(-1)


@pytest.mark.parametrize("attend_current", [False, True], ids=["before", "attend_current"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_equals_the_reference_formulation_and_its_remainder(impl, attend_current):
    enc = _enc(attend_current).to(F64)
    torch.manual_seed(2)
    attn = Attention(C, H, pe=enc, causal=True, impl=impl).to(F64)
    x = torch.randn(2, 9, C, dtype=F64) * 3
    got = attn(x, SequenceInfo.from_offset(2, 9))
    q, k, v = _qkv(attn, x)
    o, rem = _reference_formulation(q, k, v, attend_current)
    torch.testing.assert_close(got, attn.o_proj(o.transpose(1, 2).reshape(2, 9, C)), **TOL)
    # the rest of the stick, which posenc drops as the kernels' output does
    torch.testing.assert_close(1 - enc.weights(q, k).tril().sum(-1), rem, **TOL)


def test_is_softmax_of_the_same_logits_times_the_broken_part_of_the_stick():
    """The identity the backends rely on: sum_j A_ij v_j = softmax(l)_i·v (1 - R_i), l the
    logits (log A), R_i = prod_t (1 - beta_it) the stick left; so exp(logsumexp l_i) = 1 - R_i."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, H, 6, D, dtype=F64) * 2 for _ in range(3))
    term = StickBreakingTerm(q, k, 1 / math.sqrt(D), attend_current=True)
    logits = ((q @ k.transpose(-1, -2)) / math.sqrt(D) + term.dense(None, None)).masked_fill(
        torch.ones(6, 6).triu(1).bool(), -math.inf)
    left = torch.exp(F.logsigmoid(-(q @ k.transpose(-1, -2)) / math.sqrt(D)).tril().sum(-1))  # R_i
    torch.testing.assert_close(torch.softmax(logits, -1) @ v * (1 - left)[..., None], logits.exp() @ v, **TOL)
    torch.testing.assert_close(logits.logsumexp(-1).exp(), 1 - left, **TOL)


# ---- properties of the weights ---------------------------------------------------------------------
def _aligned(n: int, sign: torch.Tensor, c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q (1, 1, 1, 2) and keys (1, 1, n, 2) with logits sign_t · c / sqrt(2) for the last query."""
    q = torch.tensor([c, 0.0], dtype=F64).view(1, 1, 1, 2)
    k = torch.stack([sign.to(F64), torch.zeros(n, dtype=F64)], -1)[None, None]
    return q, k


@pytest.mark.parametrize("attend_current", [False, True])
def test_logits_to_minus_infinity_leave_the_stick_whole_and_the_output_zero(attend_current):
    q, k = _aligned(6, -torch.ones(6), 200.0)
    term = StickBreakingTerm(q, k, 1 / math.sqrt(2), attend_current)
    assert float(term.weights().max()) < 1e-60
    v = torch.randn(1, 1, 6, 3, dtype=F64)
    mask = AttentionMask.build(SequenceInfo.from_offset(1, 1, 5), SequenceInfo.from_offset(1, 6), causal=True)
    terms = LayerTerms(mask.q_seq.positions, mask.k_seq.positions, logits=(term,))
    for leaf in (Leaf.EAGER, Leaf.FUSED):
        out = LEAVES[leaf](q, k, v, scale=1 / math.sqrt(2), mask=mask, terms=terms)
        assert float(out.abs().max()) < 1e-60, leaf


@pytest.mark.parametrize("attend_current", [False, True])
def test_a_sure_break_takes_the_whole_stick(attend_current):
    """One key with logit -> +inf and every other -> -inf: that key's weight is 1, the output its
    value; with two sure breaks the nearer takes all and the farther nothing."""
    sign = -torch.ones(6)
    sign[2] = 1
    q, k = _aligned(6, sign, 200.0)
    w = StickBreakingTerm(q, k, 1 / math.sqrt(2), attend_current).weights()[0, 0, 0]
    torch.testing.assert_close(w, torch.eye(6, dtype=F64)[2], atol=1e-60, rtol=0)
    sign[4] = 1
    q, k = _aligned(6, sign, 200.0)
    w = StickBreakingTerm(q, k, 1 / math.sqrt(2), attend_current).weights()[0, 0, 0]
    torch.testing.assert_close(w, torch.eye(6, dtype=F64)[4], atol=1e-60, rtol=0)


def test_rows_sum_to_the_broken_part_of_the_stick_and_the_first_token_sees_nothing():
    torch.manual_seed(4)
    q, k = torch.randn(1, H, 8, D, dtype=F64), torch.randn(1, H, 8, D, dtype=F64)
    w = _enc().weights(q, k).tril()
    beta = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(D))
    left = torch.stack([torch.prod(1 - beta[..., i, :i], -1) for i in range(8)], -1)  # keys before i
    torch.testing.assert_close(w.sum(-1), 1 - left, **TOL)
    assert float(w[..., 0, :].abs().max()) == 0.0  # no key before the first token
    assert bool((w.sum(-1) < 1).all())


# ---- the fused function's blocks --------------------------------------------------------------------
def _blocks_call(kind: str, causal: bool, attend_current: bool, T: int = 23, Tq: int | None = None):
    g = torch.Generator().manual_seed(5)
    Tq = T if Tq is None else Tq
    if kind == "padded":
        valid = torch.ones(2, T, dtype=torch.bool)
        valid[0, :5] = False
        q_seq = k_seq = SequenceInfo.from_padding_mask(valid)
    else:
        q_seq, k_seq = SequenceInfo.from_offset(2, Tq, T - Tq), SequenceInfo.from_offset(2, T)
    mask = AttentionMask.build(q_seq, k_seq, causal=causal)
    q = (torch.randn(2, H, Tq, D, generator=g, dtype=F64) * 2).requires_grad_()
    k = (torch.randn(2, H, T, D, generator=g, dtype=F64) * 2).requires_grad_()
    v = torch.randn(2, H, T, D, generator=g, dtype=F64).requires_grad_()
    term = StickBreakingTerm(q, k, 1 / math.sqrt(D), attend_current)
    return q, k, v, mask, LayerTerms(q_seq.positions, k_seq.positions, logits=(term,))


@pytest.mark.parametrize("attend_current", [False, True], ids=["before", "attend_current"])
@pytest.mark.parametrize("kind,causal", [("plain", True), ("plain", False), ("padded", True), ("prefill", True)])
def test_blockwise_sums_equal_the_dense_term_forward_and_backward(kind, causal, attend_current, monkeypatch):
    """The fused leaf on the call's own q, k and scale sums the sticks block by block (blocks of
    4 query rows against 23 keys: blocks across the diagonal, before it, padding rows that see
    every key), against the eager leaf with the dense term."""
    from posenc.backends import fused

    monkeypatch.setattr(fused, "BLOCK_ROWS", 4)
    made = []
    monkeypatch.setattr(sticks.StickBlock, "add_to", _recording(sticks.StickBlock.add_to, made))
    q, k, v, mask, terms = _blocks_call(kind, causal, attend_current, Tq=9 if kind == "prefill" else None)
    assert plan("sdpa", q, k, v, mask, terms).leaf is Leaf.FUSED
    got = LEAVES[Leaf.FUSED](q, k, v, scale=1 / math.sqrt(D), mask=mask, terms=terms)
    assert made, "the fused leaf did not sum the sticks block by block"
    want = LEAVES[Leaf.EAGER](q, k, v, scale=1 / math.sqrt(D), mask=mask, terms=terms)
    torch.testing.assert_close(got, want, **TOL)
    assert_same_grads(got, want, (q, k, v), **TOL)


def _recording(fn, calls: list):
    def wrapped(self, x):
        calls.append(x.shape)
        return fn(self, x)

    return wrapped


def test_a_term_on_other_queries_is_summed_from_its_own_gates_by_the_fused_leaf(monkeypatch):
    """A stick-breaking term whose q is not the call's (another scale here) is not the call's own
    logits: the fused leaf sums it block by block from the term's q, k and scale as gate vectors
    (as per_row_alibi's stick term), with their gradient, and still leaves the weights unnormalised."""
    made = []
    monkeypatch.setattr(sticks.StickBlock, "add_to", _recording(sticks.StickBlock.add_to, made))
    q, k, v, mask, terms = _blocks_call("plain", True, False)
    got = LEAVES[Leaf.FUSED](q, k, v, scale=0.3, mask=mask, terms=terms)
    assert made, "the fused leaf did not sum the term block by block"
    want = LEAVES[Leaf.EAGER](q, k, v, scale=0.3, mask=mask, terms=terms)
    torch.testing.assert_close(got, want, **TOL)
    assert_same_grads(got, want, (q, k, v), **TOL)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_of_the_blockwise_sums(causal):
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 1, 5, 3, generator=g, dtype=F64).requires_grad_() for _ in range(3))
    fn = lambda q, k, v: fused_attention(q, k, v, scale=0.6, causal=causal, block=2, sticks=[False],  # noqa: E731
                                         normalize=False)
    assert torch.autograd.gradcheck(fn, (q, k, v))
    eager = lambda q, k, v: _dense_reference(q, k, v, 0.6, causal)  # noqa: E731
    torch.testing.assert_close(fn(q, k, v), eager(q, k, v), **TOL)
    assert torch.autograd.gradcheck(eager, (q, k, v))


def _dense_reference(q, k, v, scale, causal):
    z = q @ k.transpose(-1, -2) * scale
    logits = z + StickBreakingTerm(q, k, scale).dense(None, None)
    if causal:
        logits = logits.masked_fill(torch.ones(5, 5).triu(1).bool(), -math.inf)
    return logits.exp() @ v


def test_fused_attention_refuses_sticks_with_a_softmax():
    q = torch.zeros(1, 1, 2, 2)
    with pytest.raises(ValueError, match=r"sticks need normalize=False"):
        fused_attention(q, q, q, scale=1.0, sticks=[False])
    with pytest.raises(TypeError, match=r"sticks must hold bools"):
        fused_attention(q, q, q, scale=1.0, sticks=[1], normalize=False)


# ---- decoding, packing, padding --------------------------------------------------------------------
@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_decoding_token_by_token_equals_the_full_forward(impl, attend_current):
    model = tiny_model("stick_breaking", impl=impl, dtype=F64, encoding_config={"attend_current": attend_current})
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :3], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(3, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
def test_packed_documents_equal_separate_ones_and_padding_is_ignored(impl):
    model = tiny_model("stick_breaking", impl=impl, dtype=F64)
    g = torch.Generator().manual_seed(8)
    a, b = torch.randint(0, 64, (1, 5), generator=g), torch.randint(0, 64, (1, 7), generator=g)
    with torch.no_grad():
        packed = model(torch.cat([a, b], 1), SequenceInfo.from_cu_seqlens([0, 5, 12]))
        torch.testing.assert_close(packed[:, :5], model(a), **TOL)
        torch.testing.assert_close(packed[:, 5:], model(b), **TOL)
        padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), a], 1)
        valid = torch.tensor([[False] * 3 + [True] * 5])
        torch.testing.assert_close(model(padded, SequenceInfo.from_padding_mask(valid))[:, 3:], model(a), **TOL)


# ---- config ------------------------------------------------------------------------------------------
def test_config_is_typed():
    assert _enc().config.attend_current is False
    with pytest.raises(TypeError, match="attend_current"):
        posenc.build("stick_breaking", d_model=C, num_heads=H, attend_current="yes")
    assert not any(True for _ in _enc().parameters())


@pytest.mark.compile
def test_compiles_fullgraph_and_equals_eager():
    """Under torch.compile the plan takes the dense composition (the eager leaf: exp of the
    logits), which inductor fuses; dynamic lengths, fullgraph."""
    torch._dynamo.reset()
    model = tiny_model("stick_breaking")
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for T in (9, 17):
            x = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(T))
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def test_the_probe_reads_positions_as_one_stream_of_identical_tokens():
    """``posenc check``'s probe: a query at p and a key at 0 are the ends of a stream of p + 1
    identical tokens (a one-key call would put the key on the query's own, excluded, place), so
    the term is the stick the p - 1 tokens between them and the key itself leave: -p softplus(z)
    for p >= 1, growing without bound, as the claim says (ALiBi-like for identical tokens)."""
    from posenc.analysis import checks as CH
    from posenc.analysis import probes as P
    from posenc.scan_terms import EXCLUDED

    probe = P.Probe(train_len=16, far_len=512, max_probe_position=1024)
    enc = posenc.build("stick_breaking", d_model=probe.d_model, num_heads=probe.num_heads)
    assert P.reads_the_stream(enc, probe) and not enc.reads_layer_input
    n = P.STREAM_CHUNK + 40
    stream = P.position_logits(enc, torch.arange(n), torch.tensor([0]), probe, terms_only=True)[:, :, 0]  # (H, n)
    whole = P.position_logits(enc, torch.arange(n), torch.arange(n), probe, terms_only=True)[:, :, 0]
    torch.testing.assert_close(stream, whole, atol=1e-3, rtol=1e-6)
    qc, kc = P.content_vectors(enc, probe)
    z = (qc.double() * kc.double()).sum(-1) / math.sqrt(probe.d_model // probe.num_heads)  # (H,)
    p = torch.arange(1, n, dtype=F64)
    torch.testing.assert_close(stream[:, 1:], -p * F.softplus(z)[:, None], atol=1e-3, rtol=1e-5)
    assert (stream[:, 0] == EXCLUDED).all()  # the query's own key: hidden
    assert P.values_at(enc, torch.tensor([0]), probe).item() == 0  # a hidden pair has no value
    assert CH.check_bounded(enc, probe).status == "no"
