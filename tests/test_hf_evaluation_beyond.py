"""posenc.hf.evaluation's per-token losses and the perplexity past L: ``HFCausalLM.token_losses``
and ``token_perplexity(..., trained=L)`` against a slow loop over the model's own full logits
(``model(ids).logits``, one log_softmax per position)."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_byte_llama import byte_llama  # noqa: E402

from posenc.hf.evaluation import HFCausalLM, token_perplexity  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return byte_llama()


@pytest.fixture(scope="module")
def stream():
    return torch.randint(0, 260, (1000,), generator=torch.Generator().manual_seed(3))


@torch.no_grad()
def slow_losses(model, ids: torch.Tensor) -> torch.Tensor:
    """(T - 1,) losses of one window ``ids`` (T,): for each t, -log_softmax(logits[t])[ids[t + 1]]
    from the model's own forward over the whole window."""
    logits = model(ids[None]).logits[0].double()  # (T, V)
    return torch.tensor([-torch.log_softmax(logits[t], -1)[ids[t + 1]].item() for t in range(len(ids) - 1)],
                        dtype=torch.float64)


@pytest.mark.parametrize("head_chunk", [7, 4096])
def test_token_losses_are_the_slow_loop_token_by_token(model, stream, head_chunk):
    ids = stream[:120].view(2, 60)
    got = HFCausalLM(model, head_chunk=head_chunk).token_losses(ids)
    assert got.shape == (2, 59) and got.dtype == torch.float32
    want = torch.stack([slow_losses(model, row) for row in ids])
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5), (got.double() - want).abs().max()
    # per token, not only on average: a permutation of the losses would fail here
    assert not torch.allclose(got.double(), want.flip(1), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("length,windows,trained", [(96, 3, 40), (64, 2, 62), (50, 4, 1)])
def test_beyond_is_the_perplexity_of_the_tokens_past_L(model, stream, length, windows, trained):
    """``ppl`` over every scored token, ``beyond`` over the predictions of the queries at
    positions >= L of each window (loss t is the query at position t), both exp(mean) of the slow loop's losses; each inside its
    bootstrap interval; ``beyond_tokens`` the count of those tokens."""
    lm = HFCausalLM(model, head_chunk=16)
    r = token_perplexity(lm, stream, length, windows, trained=trained, block=8, reps=200)
    per_window = [slow_losses(model, stream[i * length : (i + 1) * length]) for i in range(windows)]
    every = torch.cat(per_window)
    past = torch.cat([w[trained:] for w in per_window])  # queries at positions t >= L
    assert every.numel() == windows * (length - 1) and past.numel() == windows * (length - 1 - trained) > 0
    assert r["tokens"] == every.numel() and r["windows"] == windows and r["beyond_tokens"] == past.numel()
    assert r["ppl"] == pytest.approx(math.exp(float(every.mean())), rel=1e-5)
    assert r["nll"] == pytest.approx(float(every.mean()), rel=1e-5)
    assert r["beyond"] == pytest.approx(math.exp(float(past.mean())), rel=1e-5)
    assert r["low"] <= r["ppl"] <= r["high"] and r["low"] < r["high"]
    assert r["beyond_low"] <= r["beyond"] <= r["beyond_high"]
    assert (r["beyond_low"] < r["beyond_high"]) == (past.numel() > 8)  # one block of 8 or fewer: no spread
    if trained > 1:  # the part past L is not the whole
        assert r["beyond"] != pytest.approx(r["ppl"], rel=1e-6)


@pytest.mark.parametrize("trained", [None, 95, 96, 97, 10_000])
def test_no_beyond_keys_within_L(model, stream, trained):
    r = token_perplexity(HFCausalLM(model), stream, 96, 2, trained=trained, reps=50)
    assert set(r) == {"ppl", "nll", "tokens", "windows", "low", "high"}


def test_the_beyond_interval_is_the_block_bootstrap_of_those_tokens(model, stream):
    """beyond_low/high: posenc.intervals.block_bootstrap_ppl on the concatenated tokens past L
    with the same block and reps (windows in order, positions in order)."""
    from posenc.intervals import block_bootstrap_ppl

    r = token_perplexity(HFCausalLM(model), stream, 80, 3, trained=30, block=5, reps=120)
    past = torch.cat([slow_losses(model, stream[i * 80 : (i + 1) * 80])[30:] for i in range(3)])
    b, lo, hi = block_bootstrap_ppl(past, block=5, reps=120)
    assert (r["beyond"], r["beyond_low"], r["beyond_high"]) == pytest.approx((b, lo, hi), rel=1e-5)


@pytest.mark.parametrize("trained,error,match", [
    (0, ValueError, r"^trained must be >= 1, got 0$"),
    (-3, ValueError, r"^trained must be >= 1, got -3$"),
    (True, TypeError, r"^trained must be an int, got bool True$"),
    (2.5, TypeError, r"^trained must be an int, got float 2.5$"),
])
def test_a_bad_trained_length_is_refused_naming_it(model, stream, trained, error, match):
    with pytest.raises(error, match=match):
        token_perplexity(HFCausalLM(model), stream, 32, 1, trained=trained, reps=10)


@pytest.mark.parametrize("trained", [1000.0, "256"])
def test_a_bad_trained_length_is_refused_at_any_length(model, stream, trained):
    with pytest.raises(TypeError, match=r"^trained must be an int, got "):
        token_perplexity(HFCausalLM(model), stream, 32, 1, trained=trained, reps=10)
