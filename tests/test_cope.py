"""cope: contextual positions against a slow loop over the paper's formula (eq. 3-5) and against
x-transformers' ``attn_use_cope`` attention on the same weights; the positions count what the
gates select, not tokens."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import Attention, SequenceInfo
from posenc.relative.cope import ContextualPosition, contextual_positions

F64 = torch.float64


def _cope(max_pos: int = 5, d_model: int = 16, heads: int = 2) -> ContextualPosition:
    torch.manual_seed(0)
    return posenc.build("cope", d_model=d_model, num_heads=heads, max_pos=max_pos, init_std=1.0)


def _slow_logits(q: torch.Tensor, k: torch.Tensor, e: torch.Tensor, causal: bool) -> torch.Tensor:
    """Scaled q·k plus z_ij = q_i·e[p_ij], loop by loop: p_ij = sum_{t=j}^{i} sigmoid(q_i·k_t / sqrt(D))
    (t from i to j for j > i), clamped to P - 1, e interpolated linearly. (B, H, T, T), -inf masked."""
    B, H, T, D = q.shape
    P = e.shape[0]
    out = torch.full((B, H, T, T), -math.inf, dtype=F64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(T if not causal else i + 1):
                    ts = range(j, i + 1) if j <= i else range(i, j + 1)
                    p = sum(torch.sigmoid(q[b, h, i] @ k[b, h, t] / math.sqrt(D)) for t in ts)
                    p = min(float(p), P - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    emb = (1 - (p - lo)) * e[lo] + (p - lo) * e[hi]
                    out[b, h, i, j] = q[b, h, i] @ k[b, h, j] / math.sqrt(D) + q[b, h, i] @ emb
    return out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_attention_equals_slow_loop_over_the_formula(impl, causal):
    enc = _cope(max_pos=4).to(F64)  # max_pos 4 < T: the clamp is reached
    torch.manual_seed(1)
    attn = Attention(16, 2, pe=enc, causal=causal, impl=impl).to(F64)
    x = torch.randn(2, 7, 16, dtype=F64) * 3
    got = attn(x, SequenceInfo.from_offset(2, 7))
    with torch.no_grad():
        q = attn.q_proj(x).view(2, 7, 2, 8).transpose(1, 2)
        k = attn.k_proj(x).view(2, 7, 2, 8).transpose(1, 2)
    v = attn.v_proj(x).view(2, 7, 2, 8).transpose(1, 2)
    probs = _slow_logits(q, k, enc.pos_emb.detach(), causal).softmax(-1)
    want = attn.o_proj((probs @ v).transpose(1, 2).reshape(2, 7, 16))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    assert enc.positions(q, k).max() == 3  # clamped


def test_positions_count_what_the_gates_select_not_tokens():
    """Gates that open only on 'marker' keys: p_ij is the number of markers from j to i."""
    T = 12
    marker = torch.tensor([1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1], dtype=torch.bool)
    gates = marker.to(F64).expand(1, 1, T, T)  # g_it = 1 on markers, 0 elsewhere
    p = contextual_positions(gates)[0, 0]
    for i in range(T):
        for j in range(i + 1):
            assert p[i, j] == int(marker[j : i + 1].sum()), (i, j)
    # tokens between markers share a position: the count is not i - j
    assert p[10, 6] == p[10, 9] == 1 and p[10, 4] == 2


def test_decoding_with_a_cache_counts_the_cached_keys():
    enc = _cope()
    torch.manual_seed(2)
    q, k = torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    full = enc.terms(q, k, None)[0].dense(None, None)
    step = enc.terms(q[:, :, -2:], k, None)[0].dense(None, None)  # the last two queries against all keys
    torch.testing.assert_close(step, full[:, :, -2:])


def _x_transformers_pair(max_pos: int):
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(3)
    peer = xt.Attention(16, heads=2, dim_head=8, causal=True, use_cope=True, cope_max_pos=max_pos)
    with torch.no_grad():
        peer.attend.cope.pos_emb.normal_()
    enc = posenc.build("cope", d_model=16, num_heads=2, max_pos=max_pos)
    mine = Attention(16, 2, pe=enc, causal=True, impl="eager")
    ps = peer.state_dict()
    mine.load_state_dict({"q_proj.weight": ps["to_q.weight"], "k_proj.weight": ps["to_k.weight"],
                          "v_proj.weight": ps["to_v.weight"], "o_proj.weight": ps["to_out.weight"],
                          "pe.pos_emb": ps["attend.cope.pos_emb"]})
    return peer, mine


@pytest.mark.parametrize("max_pos", [4, 16])
def test_parity_with_x_transformers_attention(max_pos):
    peer, mine = _x_transformers_pair(max_pos)
    x = torch.randn(2, 10, 16) * 2
    torch.testing.assert_close(mine(x, SequenceInfo.from_offset(2, 10)), peer(x), atol=1e-5, rtol=1e-5)


def test_gradient_reaches_the_gates_through_the_interpolation():
    enc = _cope()
    q = torch.randn(1, 2, 6, 8, requires_grad=True)
    k = torch.randn(1, 2, 6, 8, requires_grad=True)
    z = enc.terms(q, k, None)[0].dense(None, None)
    (z.tril() * torch.randn_like(z)).sum().backward()
    assert k.grad.abs().sum() > 0 and enc.pos_emb.grad.abs().sum() > 0


@pytest.mark.parametrize("key,value,error,match", [
    ("max_pos", 0, ValueError, r"^max_pos must be in \[1, 65536\], got 0$"),
    ("max_pos", 65537, ValueError, r"^max_pos must be in \[1, 65536\], got 65537$"),
    ("init_std", -1.0, ValueError, r"^init_std must be in \[0.0, 10000.0\], got -1.0$"),
    ("init_std", float("nan"), ValueError, "init_std"),
    ("max_pos", 2.0, TypeError, "max_pos"),
])
def test_config_refuses_bad_values_by_name(key, value, error, match):
    with pytest.raises(error, match=match):
        posenc.build("cope", d_model=16, num_heads=2, **{key: value})


# The fused path: the count term block by block from the attention's own logits.

def _count_case(T: int, gate_shift: float, heads: int = 2, D: int = 8, M: int = 6):
    """q, k with q·k/sqrt(D) around ``gate_shift`` (gates near 1 when large, near 0 when very
    negative), float64, and CoPE embeddings e (M, D)."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, heads, T, D, dtype=F64, generator=g)
    k = torch.randn(2, heads, T, D, dtype=F64, generator=g)
    u = torch.ones(D, dtype=F64) / math.sqrt(D)  # a shared direction shifts every logit
    q = q + u * math.sqrt(abs(gate_shift) * math.sqrt(D))
    k = k + math.copysign(1.0, gate_shift) * u * math.sqrt(abs(gate_shift) * math.sqrt(D))
    v = torch.randn(2, heads, T, D, dtype=F64, generator=g)
    e = torch.randn(M, D, dtype=F64, generator=g)
    return q, k, v, e


def _dense_reference(q, k, v, e, causal):
    """softmax(scale q·kᵀ + CountTerm.dense) v, the term built whole (the eager path)."""
    from posenc.terms import CountTerm
    scale = q.shape[-1] ** -0.5
    logits = (q @ k.transpose(-1, -2)) * scale + CountTerm(q, k, e, scale).dense(None, None)
    if causal:
        T = q.shape[-2]
        logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return logits.softmax(-1) @ v


@pytest.mark.parametrize("gate_shift", [3.0, 0.0, -30.0], ids=["gates_open", "gates_half", "gates_shut"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("T,M", [(80, 6), (200, 40)], ids=["short_table", "long_table"])
def test_fused_count_equals_the_dense_term_forward_and_backward(gate_shift, causal, T, M):
    """M = 40 with half-open gates: the counts reach M - 1 about 80 keys before a query, at the
    edge of the first window, so the window grows (a count just below M - 1 must not be read as
    M - 1)."""
    from posenc.backends.fused import fused_attention
    q, k, v, e = _count_case(T, gate_shift, M=M)
    ins = [t.clone().requires_grad_() for t in (q, k, v, e)]
    ref = [t.clone().requires_grad_() for t in (q, k, v, e)]
    got = fused_attention(*ins[:3], scale=8 ** -0.5, causal=causal, counts=[ins[3]], block=16)
    want = _dense_reference(*ref, causal)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, ins, g), torch.autograd.grad(want, ref, g), atol=1e-11, rtol=1e-9)


def test_fused_count_reads_only_the_keys_a_count_can_tell_apart():
    """Open gates: every count of a block reaches M - 1 a few keys before the block, so the
    block counts from there (a > 0) and the keys before it gain q_i·e[M - 1], as the dense
    term gives them; shut gates: nothing saturates and every key is counted (a = 0)."""
    from posenc.backends.counting import CountBlock
    for shift, counted_from_zero in ((3.0, False), (-30.0, True)):
        q, k, _, e = _count_case(200, shift)
        x = (q[:, :, 150:182] @ k.transpose(-1, -2)[..., :182]) * 8 ** -0.5
        c = CountBlock(x, q[:, :, 150:182], e, torch.arange(150, 182), causal=True)
        assert (c.a == 0) == counted_from_zero, (shift, c.a)
        z = x.clone().zero_()
        c.add_to(z)
        from posenc.terms import CountTerm
        want = CountTerm(q, k, e, 8 ** -0.5).dense(None, None)[:, :, 150:182, :182]
        keep = torch.ones(32, 182, dtype=torch.bool).tril(150)  # keys at or before each query
        torch.testing.assert_close(z[..., keep], want[..., keep], atol=1e-12, rtol=1e-12)


def test_training_keeps_no_query_by_key_tensor_for_the_backward():
    """The fused path (impl='sdpa' in training) saves no (T, T)-sized tensor for the backward;
    the eager reference does (its counts, gates and logits)."""
    T = 96
    enc = _cope(max_pos=8, d_model=16, heads=2)
    x = torch.randn(1, T, 16, requires_grad=True)

    def largest_saved(impl: str) -> int:
        attn = Attention(16, 2, pe=enc, causal=True, impl=impl)
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            attn(x, SequenceInfo.from_offset(1, T)).sum().backward()
        return max(sizes)

    assert largest_saved("sdpa") < T * T  # inputs and the output: (1, T, 16) and (1, 2, T, 8)
    assert largest_saved("eager") >= 2 * T * T  # the reference keeps (1, 2, T, T) tensors


def test_fused_refuses_counts_that_are_not_embeddings():
    from posenc.backends.fused import fused_attention
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"counts must hold float embeddings \(M >= 1, D=8\)"):
        fused_attention(q, q, q, scale=1.0, counts=[torch.randn(4, 6)])
