"""Every content-independent relative bias the registry holds (a ``BiasTerm``: t5, alibi,
kerple, fire, dynamic_bias, and any registered later), through the shared bias path: one bias
per forward, nothing per pair kept for backward, batch-one only for provably equal rows, the
Toeplitz form equal to all pairs, SDPA's row blocks equal to eager. Each encoding's own formula
is tested in its own file (tests/test_<module>.py) against a slow reference
(tests/bias_reference.py).
"""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import SequenceInfo, build

from helpers import tiny_model


# From the registry: every encoding with a content-independent bias; those with learned
# parameters; those whose bias depends on q_pos - k_pos alone (a Toeplitz BiasTerm).
_BUILT = {n: build(n, d_model=16, num_heads=4) for n in posenc.list_encodings()}
BIAS = [n for n, e in _BUILT.items() if e.has_bias]
LEARNED_BIAS = [n for n in BIAS if any(True for _ in _BUILT[n].parameters())]
TOEPLITZ = [n for n in BIAS if _BUILT[n].logit_bias().toeplitz]


@pytest.mark.parametrize("name", LEARNED_BIAS)
@pytest.mark.parametrize("rows", ["shared", "per_row"])
def test_dense_bias_keeps_nothing_per_pair_for_backward(name, rows):
    # The bias is built once per forward and kept until the backward: what autograd saves to
    # differentiate it must not grow with Tq x Tk. FIRE recomputes its per-pair x and pieces in
    # backward; per-row positions (no Toeplitz form) are recomputed under a checkpoint.
    enc = build(name, d_model=16, num_heads=4, **({"init_L": 8.0} if name == "fire" else {}))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    T = 300
    pos = torch.arange(T)[None] if rows == "shared" else torch.stack([torch.arange(T), torch.arange(T) + 5])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        bias = enc.logit_bias().dense(pos, pos)
    assert bias.shape == (pos.shape[0], 4, T, T) and bias.requires_grad
    # Per position or per distance at most (an MLP's width times the distances), never per pair:
    # no saved tensor near B·T·T numbers, and all of them together less than one such tensor.
    per_pair = pos.shape[0] * T * T
    assert saved and max(saved) < per_pair / 16 and sum(saved) < per_pair / 4, saved


# -------------------------------------------------------------------- shared behaviour ---

def test_bias_encodings_are_relative_and_only_bias():
    assert {"t5", "alibi", "kerple", "fire"} <= set(BIAS)
    for name in BIAS:
        enc = build(name, d_model=16, num_heads=4)
        assert posenc.get_info(name).family == "relative", name
        assert not (enc.has_terms or enc.has_rotate or enc.has_embed), name


@pytest.mark.parametrize("name", BIAS)
def test_batch_one_bias_only_when_rows_are_provably_equal(name):
    torch.manual_seed(0)
    enc = build(name, d_model=16, num_heads=4)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    shared = SequenceInfo.from_offset(3, 7, offset=4).positions  # expanded, stride 0
    bias = enc.score_bias(shared, shared)
    assert bias.shape == (1, 4, 7, 7) and bias.dtype == torch.float32
    rows = shared.clone()  # equal rows, but not provably so: computed per row
    full = enc.score_bias(rows, rows)
    assert full.shape == (3, 4, 7, 7)
    # A bias made by a matrix product (dynamic_bias's MLP of the distance) may round its last bit
    # differently for 3 rows than for 1 (BLAS picks its blocking by size); the others are exact.
    matmul = any(isinstance(m, torch.nn.Linear) for m in enc.modules())
    tol = dict(atol=1e-6, rtol=1e-6) if matmul else dict(atol=0, rtol=0)
    torch.testing.assert_close(full, bias.expand_as(full), **tol)


# ---- the Toeplitz path: the bias of Tq + Tk - 1 distances, expanded -----------------------------


@pytest.mark.parametrize("name", TOEPLITZ)
@pytest.mark.parametrize("tq,tk,s", [(5, 5, 0), (3, 8, 5), (6, 2, -1), (1, 9, 8)])
def test_toeplitz_path_equals_all_pairs(name, tq, tk, s):
    """Contiguous shared positions (q_pos - k_pos = s + i - j): the per-distance form equals
    the function evaluated on every pair, forward and backward (float64)."""
    torch.manual_seed(0)
    enc = build(name, d_model=16, num_heads=4).to(torch.float64)
    q_pos = (max(s, 0) + torch.arange(tq))[None]
    k_pos = (max(s, 0) - s + torch.arange(tk))[None]
    fast = enc.score_bias(q_pos, k_pos)
    assert fast.shape == (1, 4, tq, tk) and fast.is_contiguous()
    # Two real rows (not a stride-0 expand) take the all-pairs path.
    slow = enc.score_bias(q_pos.repeat(2, 1), k_pos.repeat(2, 1))[:1]
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=0)
    params = [p for p in enc.parameters()]
    if params:
        w = torch.randn(fast.shape, dtype=torch.float64)
        for a, b in zip(torch.autograd.grad((fast * w).sum(), params), torch.autograd.grad((slow * w).sum(), params)):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("padded", [False, True])
def test_bias_is_built_once_per_forward(monkeypatch, padded):
    """The dense bias (and SDPA's masked float form of it) is built once per forward, not per layer."""
    from posenc.backends import SharedBias
    from posenc.terms import BiasTerm

    model = tiny_model("alibi", n_layer=3)
    dense_calls, masked_calls = [], []
    orig_dense, orig_masked = BiasTerm.dense, SharedBias.masked

    def counting_dense(self, q_pos, k_pos):
        dense_calls.append(1)
        return orig_dense(self, q_pos, k_pos)

    def counting_masked(self, dtype):
        masked_calls.append(dtype in self._masked)
        return orig_masked(self, dtype)

    monkeypatch.setattr(BiasTerm, "dense", counting_dense)
    monkeypatch.setattr(SharedBias, "masked", counting_masked)
    tokens = torch.randint(0, 64, (2, 7))
    valid = torch.tensor([[True] * 7, [False, False] + [True] * 5])
    seq = SequenceInfo.from_padding_mask(valid) if padded else None
    with torch.no_grad():
        model(tokens, seq)
    assert len(dense_calls) == 1
    # Plain causal attention takes the CPU flash kernel with the bias as it is; a padding mask
    # folds -inf into one masked copy, built by the first layer and reused by the others.
    assert masked_calls == ([False, True, True] if padded else [])


@pytest.mark.parametrize("name", BIAS)
def test_sdpa_row_blocked_bias_equals_eager_past_one_block(name):
    # T = 300 > 256 rows: the SDPA path attends in row blocks (causal_sdpa_with_bias).
    tokens = torch.randint(0, 64, (1, 300))
    with torch.no_grad():
        eager = tiny_model(name, impl="eager", dtype=torch.float64)(tokens)
        sdpa = tiny_model(name, impl="sdpa", dtype=torch.float64)(tokens)
    torch.testing.assert_close(sdpa, eager)
