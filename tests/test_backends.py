"""Every registered encoding through every attention backend it supports equals the eager
reference (posenc.backends.eager), forward and backward, in the five ways attention is used:
causal, bidirectional, packed documents (cu_seqlens), left padding, and KV-cache decoding.

The reference is the eager backend of the same model (same weights), itself checked against
explicit formulas in test_core.py (attention) and the family tests (each encoding's terms).
Models run in float64 so the comparisons are tight (1e-10): a wrong mask, a dropped term or
a mis-indexed score_mod moves logits by 1e-2 or more.

FlexAttention runs here uncompiled (``posenc.backends.flex.COMPILE = False``: compiling costs
minutes on a small CPU) and forward-only on CPU: flex_attention has no CPU backward
(posenc.torch_facts.FLEX_HAS_CPU_BACKWARD), so its backward is checked only where CUDA exists.
"""

from __future__ import annotations

import pytest
import torch

import posenc
from helpers import all_hybrids, tiny_model
from posenc import SequenceInfo
from posenc.backends import IMPLS, LEAVES, Leaf, LayerTerms, SharedBias, flex, plan
from posenc.masks import AttentionMask

F64 = torch.float64
TOL = dict(atol=1e-10, rtol=1e-10)
ENCODINGS = posenc.list_encodings()
HYBRIDS = all_hybrids()  # named NoPE/RoPE hybrids (sliding / chunked layers): forward and backward cases

# What a backend cannot run, from the encoding's capabilities; everything else must equal eager.
def unsupported(impl: str, name: str) -> str | None:
    if name in HYBRIDS:  # their layers' encodings (rope, none, nope_temperature) run everywhere
        return None
    if impl == "flex" and posenc.build(name, d_model=32, num_heads=4).has_value_terms:
        return "value terms (Shaw's a^V) need the probabilities, which flex_attention does not return"
    return None


FAST = ("sdpa", "flex")
SCENARIOS = ("causal", "bidirectional", "packed", "left_padded", "kv_cache")
CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _eager_flex(monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)


def test_tables_are_not_empty_and_name_real_things():
    assert len(ENCODINGS) >= 17, ENCODINGS
    assert set(LEAVES) == set(Leaf) and set(IMPLS) == {"eager", "sdpa", "flex", "auto"}
    assert any(unsupported("flex", n) for n in ENCODINGS) and not all(unsupported("flex", n) for n in ENCODINGS)


def _cases() -> list:
    cases = []
    for name in ENCODINGS + HYBRIDS:
        for impl in FAST:
            reason = unsupported(impl, name)
            cases.append(pytest.param(name, impl, id=f"{name}-{impl}", marks=[] if reason is None else
                                      pytest.mark.skip(reason=f"unsupported: {reason}")))
    return cases


def _model(name: str, impl: str, causal: bool = True):
    model = tiny_model(name, causal=causal, impl=impl, dtype=F64, n_kv_head=2)
    return model


def _set_impl(model, impl: str) -> None:
    for block in model.blocks:
        block.attn.impl = impl


def _inputs(scenario: str) -> tuple[torch.Tensor, SequenceInfo | None]:
    g = torch.Generator().manual_seed(5)
    if scenario == "packed":
        return torch.randint(0, 64, (1, 11), generator=g), SequenceInfo.from_cu_seqlens([0, 4, 5, 11])
    if scenario == "left_padded":
        valid = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1]])
        return torch.randint(0, 64, (2, 9), generator=g), SequenceInfo.from_padding_mask(valid)
    return torch.randint(0, 64, (2, 9), generator=g), None


def _forward(model, scenario: str, tokens: torch.Tensor, seq: SequenceInfo | None) -> torch.Tensor:
    if scenario != "kv_cache":
        return model(tokens, seq)
    cache = model.new_cache()
    parts = [model(tokens[:, :4], cache=cache)]  # a prompt, then one token per step
    for t in range(4, tokens.shape[1]):
        parts.append(model(tokens[:, t : t + 1], cache=cache))
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name,impl", _cases())
def test_forward_equals_eager(name, impl, scenario):
    causal = scenario != "bidirectional"
    model = _model(name, "eager", causal)
    tokens, seq = _inputs(scenario)
    with torch.no_grad():
        # The reference: eager, and for the cache scenario the full (uncached) forward.
        want = model(tokens, seq)
        _set_impl(model, impl)
        got = _forward(model, scenario, tokens, seq)
    torch.testing.assert_close(got, want, **TOL)


def _grads(model, tokens, seq) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    w = torch.randn(tokens.shape + (64,), generator=torch.Generator().manual_seed(2), dtype=F64)
    (model(tokens, seq) * w).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads, "no parameter received a gradient"
    return grads


@pytest.mark.parametrize("scenario", ("causal", "bidirectional", "packed", "left_padded"))
@pytest.mark.parametrize("name,impl", _cases())
def test_backward_equals_eager(name, impl, scenario):
    if impl == "flex" and not CUDA:
        pytest.skip("flex_attention has no CPU backward (torch_facts.FLEX_HAS_CPU_BACKWARD; checked where CUDA exists)")
    device = "cuda" if impl == "flex" else "cpu"
    model = _model(name, "eager", scenario != "bidirectional").to(device)
    tokens, seq = _inputs(scenario)
    tokens, seq = tokens.to(device), None if seq is None else seq.to(device)
    want = _grads(model, tokens, seq)
    _set_impl(model, impl)
    got = _grads(model, tokens, seq)
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], **TOL, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("compiled", [False, True], ids=["flex-uncompiled", "flex-compiled"])
@pytest.mark.parametrize("name", ENCODINGS)
def test_an_empty_batch_is_empty_on_every_backend(name, compiled, monkeypatch, plans):
    """A (B, 0) batch gives (B, 0, V) on every backend (flex's kernels fail on T = 0: the plan
    sends it to the empty leaf, which never compiles)."""
    monkeypatch.setattr(flex, "COMPILE", compiled)
    model = _model(name, "eager")
    tokens = torch.zeros(2, 0, dtype=torch.long)
    with torch.no_grad():
        want = model(tokens)
        assert want.shape == (2, 0, 64)
        for impl in IMPLS:
            _set_impl(model, impl)
            assert model(tokens).shape == (2, 0, 64), impl
    assert plans and {p.leaf.name for p in plans} == {"EMPTY"}


# ---- refusals and the choice ---------------------------------------------------------------------
def test_flex_refuses_value_terms_naming_impl():
    model = _model("shaw", "flex")
    assert model.encodings[0].has_value_terms
    with torch.no_grad(), pytest.raises(ValueError, match=r"impl='flex' cannot apply value terms"):
        model(torch.randint(0, 64, (1, 5)))


@pytest.mark.skipif(CUDA, reason="checks the CPU refusal")
def test_flex_refuses_backward_on_cpu_naming_impl():
    model = _model("alibi", "flex").train()
    with pytest.raises(ValueError, match=r"impl='flex' has no backward on CPU"):
        model(torch.randint(0, 64, (1, 5)))
    with torch.no_grad():  # forward alone is fine
        model(torch.randint(0, 64, (1, 5)))


def _terms(name: str, mask: AttentionMask) -> LayerTerms:
    enc = posenc.build(name, d_model=32, num_heads=4)
    bias = SharedBias(enc.logit_bias(), mask) if enc.has_bias else None
    return LayerTerms(mask.q_seq.positions, mask.k_seq.positions, bias)


def test_auto_is_sdpa_on_cpu_and_flex_on_cuda_with_terms():
    mask = AttentionMask.build(SequenceInfo.from_offset(1, 4), causal=True)
    q = torch.zeros(1, 4, 4, 8)
    leaf = lambda impl, q, name: plan(impl, q, q, q, mask, _terms(name, mask)).leaf  # noqa: E731
    assert leaf("auto", q, "alibi") is Leaf.CPU_FLASH_BIAS  # CPU: flex has no backward there
    assert leaf("auto", q, "none") is Leaf.SDPA_CAUSAL
    assert leaf("flex", q, "none") is Leaf.FLEX
    meta = torch.empty(1, 4, 4, 8, device="meta")
    assert leaf("auto", meta, "alibi") is Leaf.SDPA_BIAS  # not CUDA: never flex


@pytest.mark.parametrize("impl", IMPLS)
def test_every_impl_runs_a_model(impl):
    model = _model("t5", impl)
    with torch.no_grad():
        torch.testing.assert_close(model(torch.arange(6)[None]), _model("t5", "eager")(torch.arange(6)[None]), **TOL)


def test_bad_impl_names_the_parameter():
    with pytest.raises(ValueError, match=r"impl must be one of 'eager', 'sdpa', 'flex', 'auto', got 'flash'"):
        posenc.Attention(32, 4, impl="flash")
    with pytest.raises(ValueError, match=r"attn_impl"):
        posenc.ModelConfig(attn_impl="flash")


# ---- one bias definition, three forms ---------------------------------------------------------------
BIAS = [n for n in ENCODINGS if posenc.build(n, d_model=32, num_heads=4).has_bias]


def test_some_encodings_have_a_bias():
    assert len(BIAS) >= 2, BIAS


@pytest.mark.parametrize("name", BIAS)
def test_bias_dense_toeplitz_and_score_mod_agree_with_the_pointwise_fn(name):
    """The dense form (Toeplitz path for contiguous positions), the all-pairs form and the
    score_mod evaluated at every (b, h, i, j) are the same numbers: one definition, three forms."""
    enc = tiny_model(name, dtype=F64).encodings[0]
    term = enc.logit_bias()
    H = term.num_heads
    for q_pos, k_pos in (
        (torch.arange(3, 9)[None], torch.arange(0, 9)[None]),  # contiguous: Toeplitz path
        (torch.tensor([[0, 1, 2, 0, 1, 5]]), torch.tensor([[0, 1, 2, 0, 1, 5]])),  # packed-like: all pairs
        (torch.tensor([[0, 0, 1, 2], [0, 1, 2, 3]]), torch.tensor([[0, 0, 1, 2], [0, 1, 2, 3]])),
    ):
        dense = term.dense(q_pos, k_pos)
        pairs = term.all_pairs(q_pos, k_pos)
        torch.testing.assert_close(dense.expand_as(pairs), pairs, atol=1e-12, rtol=0)
        mod = term.score_mod(q_pos, k_pos)
        B, Tq, Tk = pairs.shape[0], q_pos.shape[1], k_pos.shape[1]
        b = torch.arange(B)[:, None, None, None]
        h = torch.arange(H)[None, :, None, None]
        i = torch.arange(Tq)[None, None, :, None]
        j = torch.arange(Tk)[None, None, None, :]
        zero = torch.zeros(B, H, Tq, Tk, dtype=F64)
        torch.testing.assert_close(mod(zero, b, h, i, j), pairs, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", BIAS)
def test_bias_dense_equals_slow_loop(name):
    """A Python loop over (h, i, j) calling fn on scalars: the definition, nothing shared."""
    enc = tiny_model(name, dtype=F64).encodings[0]
    term = enc.logit_bias()
    pos = torch.tensor([[0, 1, 2, 3, 7, 8]])
    dense = term.dense(pos, pos)[0]
    slow = torch.empty_like(dense)
    for h in range(term.num_heads):
        for i in range(pos.shape[1]):
            for j in range(pos.shape[1]):
                slow[h, i, j] = term.fn(torch.tensor(h), pos[0, i], pos[0, j])
    torch.testing.assert_close(dense, slow, atol=1e-12, rtol=0)


# ---- the mask description ---------------------------------------------------------------------------
MASK_SEQS = {
    "plain": SequenceInfo.from_offset(2, 7),
    "packed": SequenceInfo.from_cu_seqlens([0, 2, 3, 7]),
    "left_padded": SequenceInfo.from_padding_mask(torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])),
    "right_padded": SequenceInfo.from_padding_mask(torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])),
}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", list(MASK_SEQS))
def test_mask_mod_and_block_mask_equal_the_dense_mask(kind, causal):
    from torch.nn.attention.flex_attention import flex_attention

    seq = MASK_SEQS[kind]
    mask = AttentionMask.build(seq, causal=causal)
    dense = mask.dense()
    B, T = seq.positions.shape
    mod = mask.mask_mod()
    if dense is None:
        assert mod is None and mask.is_full and (kind, causal) == ("plain", False)
        return
    b, h = torch.arange(B)[:, None, None, None], torch.zeros(1, 1, 1, 1, dtype=torch.long)
    pointwise = mod(b, h, torch.arange(T)[None, None, :, None], torch.arange(T)[None, None, None, :])
    assert torch.equal(pointwise.expand(B, 1, T, T), dense.expand(B, 1, T, T))
    assert dense.any(-1).all(), "every query row sees a key (rows that see nothing see all)"
    q = torch.randn(B, 2, T, 4, dtype=F64)
    want = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=dense)
    torch.testing.assert_close(flex_attention(q, q, q, block_mask=mask.block_mask()), want, **TOL)


def test_plain_causal_only_for_plain_causal():
    assert AttentionMask.build(MASK_SEQS["plain"], causal=True).plain_causal
    assert not AttentionMask.build(MASK_SEQS["plain"], causal=False).plain_causal
    for kind in ("packed", "left_padded"):
        assert not AttentionMask.build(MASK_SEQS[kind], causal=True).plain_causal
