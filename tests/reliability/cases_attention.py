"""Attention paths and the KV cache across grad modes, empty sequences on every backend, and
positions without bounds (issue 24)."""

from __future__ import annotations

import torch

import posenc
from posenc import ModelConfig, SequenceInfo, Transformer

from . import Case

A = "attention"


def _model(encoding: str = "rope", impl: str = "sdpa") -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=50, d_model=32, n_head=4, n_layer=2, encoding=encoding, attn_impl=impl)).eval()


def _tokens(B: int, T: int) -> torch.Tensor:
    return torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(1))


def _inference_prefill_then(mode) -> str:
    model = _model()
    tokens = _tokens(2, 6)
    with torch.no_grad():
        want = model(tokens)
    cache = model.new_cache()
    with torch.inference_mode():
        first = model(tokens[:, :4], cache=cache)
    with mode():
        rest = model(tokens[:, 4:], cache=cache)
    same = torch.allclose(torch.cat([first, rest.detach()], dim=1), want, atol=1e-5, rtol=1e-5)
    return "continued; equal to the full forward within 1e-5" if same else "continued; differs from the full forward"


def _empty_on_flex(compiled: bool) -> str:
    from posenc.backends import flex

    old, flex.COMPILE = flex.COMPILE, compiled
    try:
        with torch.no_grad():
            out = _model("alibi", "flex")(torch.zeros(2, 0, dtype=torch.long))
    finally:
        flex.COMPILE = old
    return f"output of shape {tuple(out.shape)}"


def _standalone_step_without_commit() -> None:
    attn = posenc.Attention(32, 4, pe=posenc.build("alibi", d_model=32, num_heads=4))
    cache = posenc.KVCache(1)
    x = torch.randn(1, 6, 32)
    with torch.no_grad():
        attn(x[:, :5], SequenceInfo.from_offset(1, 5), cache=cache)  # no cache.commit(...)
        attn(x[:, 5:], SequenceInfo.from_offset(1, 1, 5), cache=cache)


def _rope_far(position: int) -> None:
    rope = posenc.build("rope", d_model=32, num_heads=4)
    q = torch.randn(1, 4, 1, 8)
    rope.rotate(q, q, torch.tensor([[position]]), torch.tensor([[position]]))


CASES = [
    Case(A, "a KV cache filled under torch.inference_mode(), continued under torch.no_grad()",
         r"^continued; equal to the full forward within 1e-5$", run=lambda: _inference_prefill_then(torch.no_grad),
         error=None),
    Case(A, "a KV cache filled under torch.inference_mode(), continued with autograd",
         r"^continued; equal to the full forward within 1e-5$", run=lambda: _inference_prefill_then(torch.enable_grad),
         error=None),
    Case(A, "a (B, 0) batch on flex, compiled (the default)", r"output of shape \(2, 0, 50\)",
         run=lambda: _empty_on_flex(True), error=None),
    Case(A, "a (B, 0) batch on flex, uncompiled", r"output of shape \(2, 0, 50\)",
         run=lambda: _empty_on_flex(False), error=None),
    Case(A, "a standalone Attention step on a KV cache whose last step was not committed",
         r"cache layer 0 holds 6 keys with this step's but the context describes 1: .*cache.commit",
         run=_standalone_step_without_commit),
    Case(A, "a RoPE position of 2**53 (float64 angles no longer hold every integer)",
         r"positions must be <= 9007199254740991 \(2\*\*53 - 1.*got 9007199254740992", run=lambda: _rope_far(2**53)),
    Case(A, "SequenceInfo.from_offset with offset + length past int64",
         r"offset must be <= 9223372036854775798 for length 10 .*got 9223372036854775800",
         run=lambda: SequenceInfo.from_offset(1, 10, 2**63 - 8)),
    Case(A, "SequenceInfo.from_offset with a tensor offset whose row runs past int64",
         r"offset must be <= 9223372036854775803 for length 5 .*got 9223372036854775807",
         run=lambda: SequenceInfo.from_offset(2, 5, torch.tensor([0, 2**63 - 1]))),
]
