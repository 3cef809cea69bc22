"""Attention backends, the mask description and the encoding hooks (issue 11)."""

from __future__ import annotations

import torch

from posenc import Attention, ModelConfig, SequenceInfo, Transformer, build
from posenc.context import AttentionContext
from posenc.backends import flex
from posenc.backends.narrow_values import narrow_value_attention
from posenc.masks import AttentionMask

from . import Case

B = "backends"


def _model(encoding: str, impl: str) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=50, d_model=32, n_head=4, n_layer=1, encoding=encoding, attn_impl=impl))


def _flex_forward(encoding: str, grad: bool) -> None:
    compile_before, flex.COMPILE = flex.COMPILE, False  # the refusal comes before any kernel
    try:
        with torch.set_grad_enabled(grad):
            _model(encoding, "flex")(torch.zeros(1, 4, dtype=torch.long))
    finally:
        flex.COMPILE = compile_before


def _padding_row() -> str:
    """A left-padded row's padding queries see no valid key: they see every key instead of NaN."""
    seq = SequenceInfo.from_padding_mask(torch.tensor([[0, 0, 1, 1]]))
    mask = AttentionMask.build(seq, causal=True)
    rows = mask.empty_rows()[0].tolist()
    assert mask.dense()[0, 0, 0].all() and rows == [True, True, False, False]
    return f"rows that see no key: {rows}; those rows see all 4 keys (no NaN)"


def _auto_on_cpu() -> str:
    model = _model("alibi", "auto").eval()
    with torch.no_grad():
        want = _model("alibi", "sdpa").eval()(torch.arange(6)[None])
        got = model(torch.arange(6)[None])
    assert torch.equal(got, want)
    return "impl='auto' on CPU runs sdpa (bit-identical output)"


def _narrow(tq: int = 8, tk: int = 8, **kw):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, tq, 8, generator=g), torch.randn(1, 2, tk, 8, generator=g)
    return narrow_value_attention(q, k, torch.randn(1, 2, tk, 4, generator=g), **{"scale": 0.3, "causal": False, **kw})


def _narrow_nan_row() -> str:
    """A NaN in one query row: that row's output is NaN, the other rows are what they were."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 2, 40, 8, generator=g), torch.randn(1, 2, 40, 8, generator=g), torch.randn(1, 2, 40, 4, generator=g)
    clean = narrow_value_attention(q, k, v, scale=0.3, causal=True)
    q[0, 0, 5, 0] = float("nan")
    out = narrow_value_attention(q, k, v, scale=0.3, causal=True)
    bad = out.isnan().any(-1)
    assert bad[0, 0, 5] and int(bad.sum()) == 1 and torch.equal(out[~bad], clean[~bad])
    return "only that query row's output is NaN; every other row equals the clean result"


def _householder(nan_at: int | None = None, **kw):
    from posenc.backends.householder_flash import householder_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 8, generator=g) for _ in range(3))
    w = torch.nn.functional.normalize(torch.randn(1, 2, 40, 8, generator=g), dim=-1)
    beta = torch.rand(1, 2, 40, generator=g) * 2
    if nan_at is not None:
        beta[0, 0, nan_at] = float("nan")
    args = {"beta": beta, "scale": 0.35, "chunk": 16, **kw}
    return householder_attention(q, k, v, w, args.pop("beta"), **args)


def _householder_nan_row() -> str:
    """A NaN in one token's β (token 25, chunks of 16): NaN from the start of its chunk on in its
    head (the chunk's triangular solve mixes its rows, masked by zeros, and 0·NaN is NaN); the
    chunks before and the other head are what they were."""
    clean, out = _householder(), _householder(nan_at=25)
    bad = out[0, 0].isnan().any(-1)
    assert bad[16:].all() and not bad[:16].any() and torch.equal(out[0, 0, :16], clean[0, 0, :16])
    assert torch.equal(out[0, 1], clean[0, 1])
    return "rows from the start of the NaN token's chunk on are NaN in its head; earlier chunks and the other head unchanged"


def _own_logits_other_scale() -> None:
    from posenc.backends import LayerTerms, own_logits
    from posenc.terms import LogitsTerm

    q, seq = torch.zeros(1, 2, 1, 8), SequenceInfo.from_offset(1, 5)
    k = torch.zeros(1, 2, 5, 8)
    terms = LayerTerms.of(seq.positions[:, -1:], seq.positions, None, [LogitsTerm(torch.zeros(1, 2, 1, 5), q, k, 0.5)])
    mask = AttentionMask.build(SequenceInfo.from_offset(1, 1, 4), seq, causal=True)
    own_logits.attention(q, k, k, scale=0.25, mask=mask, terms=terms)


CASES = [
    Case(B, "the OWN_LOGITS leaf (PaTH's decoding step) called with another scale than its LogitsTerm's",
         r"^a LogitsTerm's scale \(0.5\) must be the attention's \(0.25\)", run=_own_logits_other_scale),
    Case(B, "householder_attention (PaTH's leaf) with chunk=0", r"^chunk must be an int in \[1, 4096\], got 0$",
         run=lambda: _householder(chunk=0)),
    Case(B, "householder_attention with β of another length",
         r"^beta must be a float tensor \(B=1, H=2, T=40\), got a torch.float32 tensor of shape \(1, 2, 39\)$",
         run=lambda: _householder(beta=torch.ones(1, 2, 39))),
    Case(B, "householder_attention with a NaN in one token's β", r"rows from the start of the NaN token's chunk on are NaN",
         run=_householder_nan_row, error=None),
    Case(B, "narrow_value_attention (PoPE's attention on CPU) causal with 8 queries and 9 keys",
         r"^causal needs as many queries as keys \(aligned top-left\), got Tq=8, Tk=9$",
         run=lambda: _narrow(tk=9, causal=True)),
    Case(B, "narrow_value_attention with block=0", r"^block must be a positive int, got 0$",
         run=lambda: _narrow(block=0)),
    Case(B, "narrow_value_attention with a NaN in one query row", r"only that query row's output is NaN",
         run=_narrow_nan_row, error=None),
    Case(B, "Attention(impl='flash')", r"^impl must be one of 'eager', 'sdpa', 'flex', 'auto', got 'flash'$",
         run=lambda: Attention(32, 4, impl="flash")),
    Case(B, "ModelConfig(attn_impl='flash')", r"attn_impl must be one of .*'flex'.*got 'flash'",
         run=lambda: ModelConfig(attn_impl="flash")),
    Case(B, "impl='flex' with Shaw's value terms (use_value)", r"^impl='flex' cannot apply value terms",
         run=lambda: _flex_forward("shaw", grad=False)),
    Case(B, "impl='flex' training on CPU (no flex backward on CPU)", r"^impl='flex' has no backward on CPU",
         run=lambda: _flex_forward("alibi", grad=True)),
    Case(B, "Attention(pe='alibi') (a name, not a module)", r"^pe must be a PositionalEncoding or None, got str$",
         run=lambda: Attention(32, 4, pe="alibi"), error=TypeError),
    Case(B, "attention called with encoding= of another encoding than the one it owns",
         r"this Attention owns an encoding",
         run=lambda: Attention(32, 4, pe=build("alibi", d_model=32, num_heads=4))(
             torch.randn(1, 3, 32), AttentionContext.build(SequenceInfo.from_offset(1, 3), causal=True),
             encoding=AttentionContext.build(SequenceInfo.from_offset(1, 3), causal=True).prepare(
                 build("t5", d_model=32, num_heads=4)))),
    Case(B, "causal mask with more queries than keys", r"^causal attention needs at most as many queries as keys, got Tq=5 > Tk=3$",
         run=lambda: AttentionMask.build(SequenceInfo.from_offset(1, 5), SequenceInfo.from_offset(1, 3), causal=True)),
    Case(B, "mask with causal='yes'", r"^causal must be a bool, got str 'yes'$",
         run=lambda: AttentionMask.build(SequenceInfo.from_offset(1, 5), causal="yes"), error=TypeError),
    Case(B, "left padding: padding queries that see no key", r"those rows see all 4 keys", run=_padding_row, error=None),
    Case(B, "impl='auto' on CPU", r"runs sdpa", run=_auto_on_cpu, error=None),
    Case(B, "fused_attention with an empty count-term embedding (CoPE, M = 0)",
         r"^counts must hold float embeddings \(M >= 1, D=8\), got a torch.float32 tensor of shape \(0, 8\)$",
         run=lambda: _fused_counts(torch.randn(0, 8))),
    Case(B, "fused_attention with integer count-term embeddings",
         r"^counts must hold float embeddings \(M >= 1, D=8\), got a torch.int64 tensor of shape \(4, 8\)$",
         run=lambda: _fused_counts(torch.ones(4, 8, dtype=torch.long))),
]


def _fused_counts(e: torch.Tensor) -> None:
    from posenc.backends.fused import fused_attention

    q = torch.randn(1, 2, 4, 8)
    fused_attention(q, q, q, scale=1.0, counts=[e])
