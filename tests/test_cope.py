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
    full = enc.terms(q, k, None)[0].logits
    step = enc.terms(q[:, :, -2:], k, None)[0].logits  # the last two queries against all keys
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
    z = enc.terms(q, k, None)[0].logits
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
