"""posenc.backends.plan: which leaf runs an attention call, and every leaf against the eager
reference.

Each case builds the inputs of one call (q, k, v, the mask, the layer's terms from a built
encoding), asks ``plan`` for its leaf, runs that leaf and compares it with the eager leaf,
forward and (where autograd records) backward, in float64. The cases must cover every leaf of
``Leaf``: a new leaf without a case fails ``test_every_leaf_has_a_case``.
"""

from __future__ import annotations

import pytest
import torch

from helpers import assert_same_grads

import posenc
from posenc import Attention, SequenceInfo
from posenc.backends import LEAVES, Leaf, LayerTerms, SharedBias, flex, plan
from posenc.encoding import QKProjection
from posenc.masks import AttentionMask
from posenc.terms import HouseholderTerm

F64 = torch.float64
TOL = dict(atol=1e-10, rtol=1e-10)
H, D = 4, 8


@pytest.fixture(autouse=True)
def _eager_flex(monkeypatch):
    monkeypatch.setattr(flex, "COMPILE", False)


def _first(flag: str) -> str:
    """The first registered encoding with capability ``flag`` (from the registry, not by name)."""
    for name in posenc.list_encodings():
        enc = posenc.build(name, d_model=H * D, num_heads=H)
        if getattr(enc, flag) and not enc.has_value_terms:
            return name
    raise AssertionError(f"no registered encoding has {flag}")


def _learned_bias() -> str:
    for name in posenc.list_encodings():
        enc = posenc.build(name, d_model=H * D, num_heads=H)
        if enc.has_bias and any(p.requires_grad for p in enc.parameters()):
            return name
    raise AssertionError("no registered bias encoding has parameters")


def _fixed_bias() -> str:
    for name in posenc.list_encodings():
        enc = posenc.build(name, d_model=H * D, num_heads=H)
        if enc.has_bias and not any(True for _ in enc.parameters()):
            return name
    raise AssertionError("no registered bias encoding is parameter-free")


def _value_terms() -> str:
    for name in posenc.list_encodings():
        if posenc.build(name, d_model=H * D, num_heads=H).has_value_terms:
            return name
    raise AssertionError("no registered encoding has value terms")


def _unnormalized() -> str:
    """The first registered encoding whose terms leave the weights unnormalised (exp of the
    logits: ``LayerTerms.normalized`` False), read from the terms it returns, not its name."""
    for name in posenc.list_encodings():
        enc = posenc.build(name, d_model=H * D, num_heads=H)
        if not enc.has_terms or enc.reads_layer_input:
            continue
        q, pos = torch.zeros(1, H, 2, D), torch.arange(2)[None]
        if not LayerTerms.of(pos, pos, None, enc.terms(q, q, enc.prepare(pos, pos), None)).normalized:
            return name
    raise AssertionError("no registered encoding has unnormalised weights")


def _householder() -> str:
    """The first registered encoding whose terms, given a layer input, are one HouseholderTerm
    (read from the terms it returns, not its name)."""
    for name in posenc.list_encodings():
        enc = posenc.build(name, d_model=H * D, num_heads=H)
        if not enc.has_terms:
            continue
        q, pos = torch.zeros(1, H, 2, D), torch.arange(2)[None]
        terms = enc.terms(q, q, enc.prepare(pos, pos), _projection(enc, torch.zeros(1, 2, H * D)))
        if any(isinstance(t, HouseholderTerm) for t in terms):
            return name
    raise AssertionError("no registered encoding has a Householder term")


def _projection(enc, x: torch.Tensor) -> QKProjection | None:
    """The layer an encoding that reads the layer input sees: its projections and input x (B, T, C)."""
    if not enc.reads_layer_input:
        return None
    attn = Attention(H * D, H, pe=enc).to(x.dtype)
    return QKProjection(attn.q_proj, attn.k_proj, H, H, D, x)


def _seqs(kind: str, T: int, B: int = 2) -> tuple[SequenceInfo, SequenceInfo]:
    if kind == "padded":
        valid = torch.ones(B, T, dtype=torch.bool)
        valid[0, : T // 3] = False
        s = SequenceInfo.from_padding_mask(valid)
        return s, s
    if kind == "decode":  # one new query after T - 1 cached keys
        return SequenceInfo.from_offset(B, 1, T - 1), SequenceInfo.from_offset(B, T)
    if kind in ("window_prefill", "chunk_prefill"):  # T - 60 new queries after 60 cached keys
        return SequenceInfo.from_offset(B, T - 60, 60), SequenceInfo.from_offset(B, T)
    s = SequenceInfo.from_offset(B, T)
    return s, s


def _call(name: str | None, kind: str, T: int, causal: bool = True, grad: bool = False, device: str = "cpu"):
    """q, k, v (B, H, T, D) float64 and the mask and terms of one layer of ``name``."""
    q_seq, k_seq = _seqs(kind, T)
    local = {"window": 40} if kind.startswith("window") else {"chunk": 50} if kind.startswith("chunk") else {}
    mask = AttentionMask.build(q_seq, k_seq, causal=causal, **local)
    g = torch.Generator().manual_seed(3)
    mk = lambda t: torch.randn(2, H, t, D, generator=g, dtype=F64).to(device).requires_grad_(grad)  # noqa: E731
    q, k, v = mk(mask.tq), mk(mask.tk), mk(mask.tk)
    if name is None:
        return q, k, v, mask, LayerTerms(q_seq.positions, k_seq.positions)
    enc = posenc.build(name, d_model=H * D, num_heads=H, **({"clip": 3} if name == "shaw" else {})).to(F64)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=F64))
    q_pos, k_pos = q_seq.positions, k_seq.positions
    bias = SharedBias(enc.logit_bias(), mask) if enc.has_bias else None
    x = torch.randn(2, mask.tk, H * D, generator=g, dtype=F64)
    proj = _projection(enc, x)
    if proj is not None and mask.tq < mask.tk:  # cached keys: their per-key state from a first call over them
        c, memory = mask.tk - mask.tq, {}
        layer = (proj.q_proj, proj.k_proj, H, H, D)
        with torch.no_grad():
            enc.terms(k[:, :, :c], k[:, :, :c], enc.prepare(k_pos[:, :c], k_pos[:, :c]), QKProjection(*layer, x[:, :c], memory))
        proj = QKProjection(*layer, x[:, c:], memory)
    terms = enc.terms(q, k, enc.prepare(q_pos, k_pos), proj) if enc.has_terms or enc.has_value_terms else []
    return q, k, v, mask, LayerTerms.of(q_pos, k_pos, bias, terms)


# (leaf, impl, encoding capability, scenario, T, causal, autograd)
CASES = [
    (Leaf.EMPTY, "flex", "has_bias", "plain", 0, True, False),
    (Leaf.EMPTY, "sdpa", None, "plain", 0, False, True),
    (Leaf.EAGER, "eager", "has_terms", "plain", 7, True, True),
    (Leaf.EAGER, "sdpa", "has_terms", "decode", 40, True, False),
    (Leaf.SDPA_CAUSAL, "sdpa", None, "plain", 7, True, True),
    (Leaf.SDPA_MASK, "sdpa", None, "padded", 7, True, True),
    (Leaf.SDPA_MASK, "auto", None, "plain", 7, False, True),
    (Leaf.SDPA_LOCAL_ROWS, "sdpa", None, "window", 300, True, True),
    (Leaf.SDPA_LOCAL_ROWS, "sdpa", None, "window_prefill", 300, True, True),
    (Leaf.SDPA_LOCAL_ROWS, "sdpa", None, "chunk_prefill", 300, True, True),
    (Leaf.CPU_FLASH_BIAS, "sdpa", "learned_bias", "plain", 7, True, True),
    (Leaf.CPU_FLASH_BIAS, "auto", "fixed_bias", "plain", 7, False, True),
    (Leaf.SDPA_BIAS, "sdpa", "fixed_bias", "padded", 7, True, True),
    (Leaf.SDPA_BIAS, "sdpa", "learned_bias", "padded", 7, True, False),
    (Leaf.FUSED, "sdpa", "learned_bias", "padded", 7, True, True),
    (Leaf.FUSED, "sdpa", "has_terms", "plain", 7, True, True),
    (Leaf.FUSED, "sdpa", "value_terms", "padded", 7, True, True),
    (Leaf.FUSED, "sdpa", "unnormalized", "padded", 7, True, True),
    (Leaf.FUSED, "sdpa", "unnormalized", "plain", 70, False, True),
    (Leaf.EAGER, "sdpa", "unnormalized", "decode", 40, True, False),
    (Leaf.HOUSEHOLDER, "sdpa", "householder", "plain", 70, True, True),
    (Leaf.HOUSEHOLDER, "auto", "householder", "plain", 7, True, False),
    (Leaf.FUSED, "sdpa", "householder", "padded", 70, True, True),
    (Leaf.OWN_LOGITS, "sdpa", "householder", "decode", 40, True, False),
    (Leaf.OWN_LOGITS, "auto", "householder", "decode", 40, True, True),
    (Leaf.FUSED, "sdpa", "householder", "plain", 70, False, True),
    (Leaf.FLEX, "flex", "has_terms", "padded", 7, True, False),
    (Leaf.FLEX, "flex", "unnormalized", "padded", 7, True, False),
    (Leaf.FLEX, "flex", "unnormalized", "plain", 7, False, False),
    (Leaf.FLEX, "flex", "has_bias", "plain", 7, False, False),
]


def _encoding(capability: str | None) -> str | None:
    if capability is None:
        return None
    return {"learned_bias": _learned_bias, "fixed_bias": _fixed_bias, "value_terms": _value_terms,
            "unnormalized": _unnormalized, "householder": _householder}.get(
        capability, lambda: _first(capability))()


def test_every_leaf_has_a_case():
    assert {c[0] for c in CASES} | {Leaf.SDPA_BIAS_ROWS} == set(Leaf) == set(LEAVES)


@pytest.mark.parametrize("leaf,impl,capability,kind,T,causal,grad", CASES,
                         ids=[f"{c[0].name}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_leaf_is_planned_and_equals_eager(leaf, impl, capability, kind, T, causal, grad):
    name = _encoding(capability)
    q, k, v, mask, terms = _call(name, kind, T, causal, grad)
    # a Householder term (a decoding step's logits) replaces the call's scaled q·kᵀ: the call's scale is the term's
    scale = terms.logits[0].scale if capability == "householder" else 0.3
    with torch.set_grad_enabled(grad):
        p = plan(impl, q, k, v, mask, terms)
        assert p.leaf is leaf, p
        assert p.reason
        got = LEAVES[p.leaf](q, k, v, scale=scale, mask=mask, terms=terms)
        want = LEAVES[Leaf.EAGER](q, k, v, scale=scale, mask=mask, terms=terms)
    assert got.shape == want.shape == (2, H, mask.tq, D)
    torch.testing.assert_close(got, want, **TOL)
    if grad:
        assert_same_grads(got, want, (q, k, v), **TOL)


def test_row_blocks_are_planned_off_the_cpu_and_equal_eager():
    """Plain causal with a fixed bias off the CPU flash leaf (another device: planned on meta
    tensors) takes the row-blocked leaf past BIAS_ROWS queries; the leaf itself runs on CPU."""
    from posenc.backends.planner import BIAS_ROWS

    name = _fixed_bias()
    q, k, v, mask, terms = _call(name, "plain", BIAS_ROWS + 9)
    meta = torch.empty(q.shape, device="meta", dtype=F64)
    assert plan("sdpa", meta, meta, meta, mask, terms).leaf is Leaf.SDPA_BIAS_ROWS
    with torch.no_grad():
        got = LEAVES[Leaf.SDPA_BIAS_ROWS](q, k, v, scale=0.3, mask=mask, terms=terms)
        want = LEAVES[Leaf.EAGER](q, k, v, scale=0.3, mask=mask, terms=terms)
    torch.testing.assert_close(got, want, **TOL)
    _, _, _, short, short_terms = _call(name, "plain", BIAS_ROWS)
    assert plan("sdpa", meta, meta, meta, short, short_terms).leaf is Leaf.SDPA_BIAS


def test_flex_refusals_name_impl():
    q, k, v, mask, terms = _call(_value_terms(), "plain", 5)
    with torch.no_grad(), pytest.raises(ValueError, match=r"impl='flex' cannot apply value terms"):
        plan("flex", q, k, v, mask, terms)
    q, k, v, mask, terms = _call(_fixed_bias(), "plain", 5, grad=True)
    with pytest.raises(ValueError, match=r"impl='flex' has no backward on CPU"):
        plan("flex", q, k, v, mask, terms)


def test_bad_impl_is_refused_by_the_plan():
    q, k, v, mask, terms = _call(None, "plain", 3)
    with pytest.raises(ValueError, match=r"impl must be one of 'eager', 'sdpa', 'flex', 'auto', got 'flash'"):
        plan("flash", q, k, v, mask, terms)


def test_a_model_forward_records_its_plans(plans):
    """The ``plans`` fixture sees every layer's call: a decoding step of a model with
    content-dependent terms takes the eager composition, its prompt the fused function."""
    from helpers import tiny_model

    model = tiny_model(_first("has_terms"), n_layer=2)
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 64, (1, 20)), cache=cache)
        assert [p.leaf for p in plans] == [Leaf.FUSED] * 2
        model(torch.randint(0, 64, (1, 1)), cache=cache)
    assert [p.leaf for p in plans[2:]] == [Leaf.EAGER] * 2


@pytest.mark.parametrize("capability,grad,T,leaf", [
    ("fixed_bias", False, 7, Leaf.SDPA_BIAS),
    ("fixed_bias", True, 7, Leaf.SDPA_BIAS),
    ("fixed_bias", False, 300, Leaf.SDPA_BIAS_ROWS),
    ("learned_bias", True, 7, Leaf.FUSED),
])
@pytest.mark.parametrize("dv", [D // 2, 2 * D])
def test_values_of_another_width_skip_the_cpu_flash_leaf(capability, grad, T, leaf, dv):
    """The CPU flash kernel needs one head size for q, k and v ("Q/K/V should have the same head
    size"): with values narrower (PoPE's q and k are twice their width) or wider than q, a bias
    alone on CPU takes the next leaf, whose sdpa() handles the widths, and equals eager."""
    q, k, v, mask, terms = _call(_encoding(capability), "plain", T, grad=grad)
    assert plan("sdpa", q, k, v, mask, terms).leaf is Leaf.CPU_FLASH_BIAS  # one width: the flash leaf
    v = torch.randn(*v.shape[:3], dv, generator=torch.Generator().manual_seed(5), dtype=F64).requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        p = plan("sdpa", q, k, v, mask, terms)
        assert p.leaf is leaf, p
        got = LEAVES[p.leaf](q, k, v, scale=0.3, mask=mask, terms=terms)
        want = LEAVES[Leaf.EAGER](q, k, v, scale=0.3, mask=mask, terms=terms)
    assert got.shape == want.shape == (2, H, T, dv)
    torch.testing.assert_close(got, want, **TOL)
    if grad:
        assert_same_grads(got, want, (q, k, v), **TOL)
