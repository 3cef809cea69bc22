"""Every registered encoding, run the ways users run models: ``inference_mode`` (forward and
cached ``generate``), a model built inside ``inference_mode``, ``no_grad``, bf16 autocast on
CPU, train (forward + backward) and eval, an inference forward followed by training, and
``torch.compile(fullgraph=True, dynamic=True)``.

Each mode is compared with the plain eval forward (grad enabled, float32) of the same model,
not just run: a mode that silently changes the numbers fails.
"""

from __future__ import annotations

import pytest
import torch

from helpers import all_encodings, all_hybrids, tiny_model

ENCODINGS = all_encodings()
MODELS = ENCODINGS + all_hybrids()  # the named NoPE/RoPE hybrids too (inference_mode, no_grad)
V, B, T = 64, 2, 12


def test_registry_is_not_empty():
    assert len(ENCODINGS) >= 10, ENCODINGS


def _tokens() -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))


def _reference(name: str) -> torch.Tensor:
    """Logits of the plain eval forward of a freshly built model (autograd on, no context)."""
    model = tiny_model(name)
    return model(_tokens()).detach()


def _cached_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """A prefix of 5 tokens, then one token per step, through one KV cache."""
    cache = model.new_cache()
    parts = [model(tokens[:, :5], cache=cache)]
    for t in range(5, tokens.shape[1]):
        parts.append(model(tokens[:, t : t + 1], cache=cache))
    return torch.cat(parts, dim=1)


# Same model, same math: only autograd bookkeeping differs, so results agree to float32
# rounding of differently ordered reductions (the cached path reorders them).
EXACT = dict(atol=1e-6, rtol=1e-6)
CACHED = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_inference_mode_forward_generate_and_cache(name):
    ref = _reference(name)
    model = tiny_model(name)
    tokens = _tokens()
    with torch.inference_mode():
        torch.testing.assert_close(model(tokens), ref, **EXACT)
        torch.testing.assert_close(_cached_logits(model, tokens), ref, **CACHED)
        out = model.generate(tokens[:, :6], 4)
    # generate is greedy: every new token is the argmax of a full no-cache forward of its prefix.
    seq = tokens[:, :6]
    with torch.no_grad():
        for _ in range(4):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("name", ENCODINGS)
def test_model_built_inside_inference_mode(name):
    ref = _reference(name)
    tokens = _tokens()
    with torch.inference_mode():
        model = tiny_model(name)  # parameters and buffers are inference tensors
        torch.testing.assert_close(model(tokens), ref, **EXACT)
        torch.testing.assert_close(_cached_logits(model, tokens), ref, **CACHED)


@pytest.mark.parametrize("name", MODELS)
def test_no_grad(name):
    ref = _reference(name)
    model = tiny_model(name)
    with torch.no_grad():
        torch.testing.assert_close(model(_tokens()), ref, **EXACT)
        torch.testing.assert_close(_cached_logits(model, _tokens()), ref, **CACHED)


# bf16 keeps 8 significant bits (unit roundoff 2**-9 = 0.002). Autocast runs the ~8 matmuls
# on the path from embeddings to logits in bf16 (q, k, v, o, two MLP per layer, the head),
# each adding about one bf16 rounding of relative error. Measured over the registry (T = 12,
# 2 layers): 0.0026 - 0.0073 of the largest |logit|; the bound leaves 2x over the worst.
# A real bug (angles or a table computed in bf16, a mask lost) gives errors of the order of
# the logits themselves.
BF16_REL = 0.015


@pytest.mark.parametrize("name", ENCODINGS)
def test_bf16_autocast_close_to_float32(name):
    ref = _reference(name)
    model = tiny_model(name)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(_tokens())
    assert got.dtype in (torch.bfloat16, torch.float32)
    got = got.float()
    assert torch.isfinite(got).all()
    err = (got - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert scale > 0
    assert err <= BF16_REL * scale, f"{name}: bf16 error {err:.3g} > {BF16_REL} x {scale:.3g}"


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ENCODINGS)
def test_train_then_eval(name):
    """Train mode (dropout 0) gives the eval logits and finite gradients for every parameter
    that takes part; eval mode afterwards gives the reference again."""
    ref = _reference(name)
    model = tiny_model(name).train()
    logits = model(_tokens())
    torch.testing.assert_close(logits.detach(), ref, **EXACT)
    logits.square().mean().backward()
    grads = _grads(model)
    assert "tok_emb.weight" in grads
    for n, g in grads.items():
        assert torch.isfinite(g).all(), n
    enc_params = [n for n, _ in model.encodings.named_parameters()]
    assert all(f"encodings.{n}" in grads for n in enc_params), set(enc_params) - set(grads)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(_tokens()), ref, **EXACT)


@pytest.mark.parametrize("name", ENCODINGS)
def test_inference_forward_does_not_poison_training(name):
    """Tables or memos built under inference_mode must not leak into a later autograd forward
    ("Inference tensors cannot be saved for backward"), nor change its gradients."""
    fresh = tiny_model(name).train()
    fresh(_tokens()).square().mean().backward()
    want = _grads(fresh)

    model = tiny_model(name)
    with torch.inference_mode():
        model(_tokens())
        _cached_logits(model, _tokens())
    model.train()
    model(_tokens()).square().mean().backward()
    got = _grads(model)
    assert got.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(got[n], want[n], **EXACT, msg=lambda m: f"{n}: {m}")


# Encodings that do not compile with fullgraph=True today, measured with torch_facts.OBSERVED_WITH (CPU):
# a change in either direction (a fix, or a new failure) makes the test fail.
COMPILE_FAILS: dict[str, str] = {
    "recurrent": "embed branches on bool(reset.any()) (recurrent.py: data-dependent guard)",
    "floater": "codes() checks int(max position) with check_int (floater.py: data-dependent guard)",
}


@pytest.mark.compile
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=COMPILE_FAILS[n]))
        if n in COMPILE_FAILS
        else n
        for n in MODELS
    ],
)
def test_compile_fullgraph_dynamic(name):
    torch._dynamo.reset()
    model = tiny_model(name)
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch.no_grad():
        for length in (T, 7):
            tokens = _tokens()[:, :length]
            torch.testing.assert_close(compiled(tokens), model(tokens), **EXACT)
    torch.testing.assert_close(compiled(_tokens()).detach(), _reference(name), **EXACT)
