"""path: PaTH attention (Yang et al. 2025, arXiv:2505.16381) against

* a slow loop over the paper's formula: every product P_ij = H_i ⋯ H_{j+1} (and its mirror
  H_{i+1} ⋯ H_j for a key after its query) built as a D x D matrix, pair by pair;
* flash-linear-attention's naive reference ``naive_path_attn`` (fla/ops/path_attn/naive.py) and
  its layer's w and β (``PaTHAttention`` in fla/layers/path_attn.py, ``ShortConvolution`` in
  fla/modules/conv/short_conv.py, ``l2_norm`` in fla/modules/l2norm.py), transcribed below as
  read at github.com/fla-org/flash-linear-attention commit
  bc3b101dcb713ddc5bd8924b66754eb68b5ccf89 (FLA is not installed here);

then KV-cache decoding against the full forward, gradients to the w and β projections, β -> 0
(NoPE) and β = 2 (reflections: norms preserved)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_same_grads

import posenc
from posenc import Attention, ModelConfig, SequenceInfo, Transformer
from posenc.encoding import QKProjection
from posenc.householder import FOLD, CarriedKeys, carried_keys
from posenc.relative.path_attention import MEMORY_KEYS, PathAttention, path_logits, path_scan
from posenc.terms import HouseholderTerm

F64 = torch.float64
C, H, D = 16, 2, 8


def _path(**config) -> PathAttention:
    torch.manual_seed(0)
    enc = posenc.build("path", d_model=C, num_heads=H, **config).to(F64)
    with torch.no_grad():  # β spread over (0, 2), not bunched at 2 sigmoid(0) = 1
        enc.bt_proj.weight.mul_(4.0)
        enc.bt_proj.bias.normal_()
    return enc


def _householder(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    return torch.eye(w.shape[-1], dtype=w.dtype) - beta * torch.outer(w, w)


def _slow_logits(q, k, w, beta) -> torch.Tensor:
    """q_iᵀ P_ij k_j (B, H, Tq, Tk), the queries the last Tq of the keys, each P_ij a D x D
    product: H_i H_{i-1} ⋯ H_{j+1} for j <= i (Yang et al. 2025: A_ij ∝ exp(k_jᵀ (prod_{s=j+1}^{i}
    H_s) q_i)); H_{i+1} ⋯ H_j for j > i (posenc's mirror for bidirectional attention)."""
    B, Hh, Tq, Dd = q.shape
    Tk = k.shape[2]
    out = torch.zeros(B, Hh, Tq, Tk, dtype=F64)
    for b, h, r, j in itertools.product(range(B), range(Hh), range(Tq), range(Tk)):
        i = Tk - Tq + r
        steps = range(i, j, -1) if j <= i else range(i + 1, j + 1)  # left to right in the product
        P = torch.eye(Dd, dtype=F64)
        for s in steps:
            P = P @ _householder(w[b, h, s], beta[b, h, s])
        out[b, h, r, j] = q[b, h, r] @ P @ k[b, h, j]
    return out


def _random_inputs(B, Hh, Tq, Tk, Dd, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hh, Tq, Dd, generator=g, dtype=F64)
    k = torch.randn(B, Hh, Tk, Dd, generator=g, dtype=F64)
    w = F.normalize(torch.randn(B, Hh, Tk, Dd, generator=g, dtype=F64), dim=-1)
    beta = 2 * torch.rand(B, Hh, Tk, generator=g, dtype=F64)
    return q, k, w, beta


# ---- (a) the paper's formula, pair by pair ------------------------------------------------------

@pytest.mark.parametrize("chunk", [1, 3, 4, 64])
@pytest.mark.parametrize("tq", [11, 4, 1])
def test_path_logits_equal_products_of_householder_matrices(tq, chunk):
    """The chunked scan (UT transform per chunk) equals the explicit D x D products, every pair,
    whatever the chunk size (T = 11: chunks that do not divide it), with fewer queries than keys."""
    q, k, w, beta = _random_inputs(2, 2, tq, 11, 4)
    torch.testing.assert_close(path_logits(q, k, w, beta, chunk=chunk), _slow_logits(q, k, w, beta),
                               atol=1e-12, rtol=1e-12)


def test_scan_continues_from_carried_keys():
    """Keys carried through every Householder up to the last earlier token, then a scan over the
    new tokens alone, give the causal logits of the whole stream (what a KV-cache step does)."""
    q, k, w, beta = _random_inputs(1, 2, 3, 10, 4, seed=1)
    _, carried = path_scan(q[..., :0, :], k[..., :7, :], w[..., :7, :], beta[..., :7], chunk=3)
    got, carried_all = path_scan(q, k[..., 7:, :], w[..., 7:, :], beta[..., 7:], carried, chunk=2)
    torch.testing.assert_close(got, _slow_logits(q, k, w, beta).tril(7), atol=1e-12, rtol=1e-12)
    for j in range(10):  # each key carried to the last token: H_9 ⋯ H_{j+1} k_j
        P = torch.eye(4, dtype=F64)
        for s in range(9, j, -1):
            P = P @ _householder(w[0, 0, s], beta[0, 0, s])
        torch.testing.assert_close(carried_all[0, 0, j], P @ k[0, 0, j], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_attention_logits_are_the_papers(causal):
    """Through posenc.Attention (eager): attention's own s·q·k plus the term is s·q_iᵀ P_ij k_j,
    with w and β the encoding's own from the layer input; the output is its softmax times v."""
    enc = _path()
    torch.manual_seed(1)
    attn = Attention(C, H, pe=enc, causal=causal, impl="eager").to(F64)
    x = torch.randn(2, 7, C, dtype=F64)
    pos = torch.arange(7)[None].expand(2, 7)
    q = attn.q_proj(x).view(2, 7, H, D).transpose(1, 2)
    k = attn.k_proj(x).view(2, 7, H, D).transpose(1, 2)
    v = attn.v_proj(x).view(2, 7, H, D).transpose(1, 2)
    w, beta, _ = enc.householders(x, pos)
    want = _slow_logits(q, k, w, beta) / math.sqrt(D)
    (term,) = enc.terms(q, k, enc.prepare(pos, pos), QKProjection.of(attn, x))
    assert isinstance(term, HouseholderTerm)
    got = q @ k.mT / math.sqrt(D) + term.dense(pos, pos)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    if causal:
        want = want.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), -math.inf)
    out = (want.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, C)
    torch.testing.assert_close(attn(x, SequenceInfo.from_offset(2, 7)), attn.o_proj(out), atol=1e-12, rtol=1e-12)


# ---- (b) flash-linear-attention, transcribed --------------------------------------------------

def _fla_naive_logits(q, k, w, beta, chunk: int = 64) -> torch.Tensor:
    """The logits A (B, H, T, T) of ``naive_path_attn`` (fla/ops/path_attn/naive.py), before its
    forget gate, scale, causal -inf and softmax, as read at commit bc3b101: per chunk the factor
    T = (I + strictly-lower(diag(β) W Wᵀ))⁻¹ by forward substitution, the chunk's own logits
    tril(Q Kᵀ) - tril(Q Wᵀ) T strictly-lower(diag(β) W Kᵀ), queries carried to the chunk start,
    keys to its end, and the inter-chunk loop multiplying each chunk's queries by every earlier
    chunk's I - Wᵀ T diag(β) W, going back. Inputs (B, H, T, D), as the reference transposes them."""
    B, Hh, L, Dd = q.shape
    BT = chunk
    if L % BT:
        pad = BT - L % BT
        q, k, w = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, w))
        beta = F.pad(beta, (0, pad))
    T = q.shape[2]
    w_beta = w * beta[..., None]
    q, k, w, w_beta = (t.reshape(B, Hh, T // BT, BT, Dd) for t in (q, k, w, w_beta))
    mask = torch.triu(torch.ones(BT, BT, dtype=torch.bool), diagonal=0)
    T_mat = -(w_beta @ w.transpose(-1, -2)).masked_fill(mask, 0)
    for i in range(1, BT):
        T_mat[..., i, :i] = T_mat[..., i, :i].clone() + (T_mat[..., i, :, None].clone() * T_mat[..., :, :i].clone()).sum(-2)
    T_mat = T_mat + torch.eye(BT, dtype=q.dtype)
    Twbk = T_mat @ (w_beta @ k.transpose(-1, -2)).masked_fill(mask, 0)
    qw = (q @ w.transpose(-1, -2)).tril()
    Twb = T_mat @ w_beta
    A_local = (q @ k.transpose(-1, -2)).tril() - qw @ Twbk
    q = q - qw @ Twb
    k = k - Twbk.transpose(-1, -2) @ w
    H_mat = w.transpose(-1, -2) @ Twb
    A = torch.zeros(B, Hh, T, T, dtype=q.dtype)
    q, k = (t.reshape(B, Hh, T, Dd) for t in (q, k))
    for i in range(0, T, BT):
        q_i = q[:, :, i:i + BT].clone()
        for j in range(i - BT, -BT, -BT):
            A[:, :, i:i + BT, j:j + BT] = q_i @ k[:, :, j:j + BT].transpose(-1, -2)
            q_i = q_i - q_i @ H_mat[:, :, j // BT]
    for i in range(T // BT):
        A[:, :, i * BT:(i + 1) * BT, i * BT:(i + 1) * BT] = A_local[:, :, i]
    return A[:, :, :L, :L]


def _fla_w_beta(enc: PathAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (B, H, T, D) and β (B, H, T) as FLA's ``PaTHAttention.forward`` makes them in training
    (fla/layers/path_attn.py): ``w_proj`` (low rank), ``w_conv1d`` (``ShortConvolution``: a causal
    depthwise Conv1d, padding kernel_size - 1, then SiLU), per-head ``l2_norm`` (eps 1e-6), and
    β = 2 sigmoid(``bt_proj``(x))."""
    B, T, _ = x.shape
    y = enc.w_proj(x)  # (B, T, H·D)
    conv = enc.w_conv1d
    y = F.silu(F.conv1d(y.transpose(1, 2), conv.weight, conv.bias, padding=conv.kernel_size[0] - 1,
                        groups=conv.groups)[..., :T]).transpose(1, 2)
    y = y.reshape(B, T, H, D)
    w = y / torch.sqrt((y * y).sum(-1, keepdim=True) + 1e-6)
    beta = enc.bt_proj(x).sigmoid() * 2
    return w.transpose(1, 2), beta.transpose(1, 2)


def test_w_and_beta_are_flas():
    enc = _path(conv_bias=True)
    x = torch.randn(2, 9, C, dtype=F64)
    want_w, want_beta = _fla_w_beta(enc, x)
    w, beta, _ = enc.householders(x)
    torch.testing.assert_close(w, want_w, atol=1e-14, rtol=1e-12)
    torch.testing.assert_close(beta, want_beta, atol=1e-14, rtol=1e-12)
    assert ((beta > 0) & (beta < 2)).all() and beta.std() > 0.1


@pytest.mark.parametrize("chunk", [4, 64])
def test_causal_logits_equal_flas_naive_reference(chunk):
    """path_logits' causal triangle equals FLA's reference at its chunk size (11 tokens: a padded
    last chunk at 4), and the encoding's attention output equals the reference's output
    softmax(s·A)·v on the same q, k, v, w and β."""
    q, k, w, beta = _random_inputs(2, 2, 11, 11, 8, seed=3)
    ref = _fla_naive_logits(q, k, w, beta, chunk=chunk)
    torch.testing.assert_close(path_logits(q, k, w, beta).tril(), ref.tril(), atol=1e-12, rtol=1e-12)

    enc = _path()
    torch.manual_seed(2)
    attn = Attention(C, H, pe=enc, impl="eager").to(F64)
    with torch.no_grad():
        attn.o_proj.weight.copy_(torch.eye(C))
    x = torch.randn(2, 11, C, dtype=F64)
    q, k, v = (p(x).view(2, 11, H, D).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    w, beta = _fla_w_beta(enc, x)
    A = _fla_naive_logits(q, k, w, beta, chunk=chunk) / math.sqrt(D)
    A = A.masked_fill(torch.ones(11, 11, dtype=torch.bool).triu(1), -math.inf)
    want = (A.softmax(-1) @ v).transpose(1, 2).reshape(2, 11, C)
    torch.testing.assert_close(attn(x, SequenceInfo.from_offset(2, 11)), want, atol=1e-12, rtol=1e-12)


# ---- (c) decoding with a KV cache -------------------------------------------------------------

def _model(**over) -> Transformer:
    cfg = ModelConfig(vocab_size=64, d_model=C, n_layer=2, n_head=H, n_kv_head=over.pop("n_kv_head", 1),
                      encoding="path", encoding_config=over.pop("encoding_config", {}),
                      attn_impl=over.pop("attn_impl", "eager"), **over)
    torch.manual_seed(0)
    model = Transformer(cfg).to(F64).eval()
    with torch.no_grad():
        for enc in model.encodings:
            enc.bt_proj.bias.normal_()
    return model


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_decoding_token_by_token_equals_the_full_forward(impl):
    """A prefix past one chunk (70 tokens: two chunks of the scan), then tokens one by one, then
    a block of four: the cached keys carried through their Householders and the convolution's
    last inputs, kept per layer, give one full forward's output (grouped-query heads: 2 query
    heads on 1 key head)."""
    model = _model(attn_impl=impl)
    tokens = torch.randint(0, 64, (2, 80), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        parts = [model(tokens[:, :70], cache=cache)]
        for t in range(70, 76):
            parts.append(model(tokens[:, t:t + 1], cache=cache))
        parts.append(model(tokens[:, 76:], cache=cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-10, rtol=1e-10)
    assert cache.layer_state(0)[MEMORY_KEYS].shape == (2, H, 80, D)


def test_carried_keys_step_by_step_equal_the_scan_across_folds():
    """CarriedKeys.step, token after token past two folds (FOLD tokens each), gives each new
    token's logits against every earlier key as the scan over all tokens does, and keeps every
    key carried to the last token; ``last(n)`` keeps the last n of them."""
    T = 2 * FOLD + 9
    q, k, w, beta = _random_inputs(1, 2, T, T, 4, seed=5)
    want, _ = path_scan(q, k, w, beta, chunk=16)  # (1, 2, T, T)
    _, state = path_scan(q[..., :3, :], k[..., :3, :], w[..., :3, :], beta[..., :3], chunk=16)
    keys = CarriedKeys(state)
    folded = 0
    for i in range(3, T):
        logits, keys = keys.step(q[..., i:i + 1, :], k[..., i:i + 1, :], w[..., i:i + 1, :], beta[..., i:i + 1])
        torch.testing.assert_close(logits[..., 0, :], want[..., i, : i + 1], atol=1e-12, rtol=1e-12)
        folded += keys.product is None and keys.recent.shape[-2] == 0
    assert folded == 2
    _, carried = path_scan(q, k, w, beta, chunk=16)
    torch.testing.assert_close(keys.all(), carried, atol=1e-12, rtol=1e-12)
    assert keys.shape == carried.shape
    for n in (T, 5, 2, 0):
        torch.testing.assert_close(keys.last(n).all(), carried[..., T - n:, :], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("T,chunk", [(1, 4), (5, 4), (8, 4), (37, 8), (130, 64)])
def test_carried_keys_of_a_prompt_equal_the_scans(T, chunk):
    """carried_keys (chunk ends, then suffix products of the chunks' matrices) gives the keys the
    scan carries to the last token, and their gradients."""
    q, k, w, beta = _random_inputs(2, 2, T, T, 5, seed=T)
    k.requires_grad_()
    _, want = path_scan(q, k, w, beta, chunk=chunk)
    got = carried_keys(k, w, beta, chunk=chunk)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert_same_grads(got, want, (k,), atol=1e-12, rtol=1e-12)


def test_carried_keys_compare_by_value_and_leave_inference_mode_without_history():
    q, k, w, beta = _random_inputs(1, 1, 6, 6, 4, seed=6)
    a = CarriedKeys(k[..., :5, :])
    _, b = a.step(q[..., 5:, :], k[..., 5:, :], w[..., 5:, :], beta[..., 5:])
    assert b == CarriedKeys(b.all()) and b != a
    with torch.inference_mode():
        _, c = CarriedKeys(k[..., :5, :].clone()).step(q[..., 5:, :], k[..., 5:, :], w[..., 5:, :], beta[..., 5:])
    assert c.is_inference() and not c.clone().is_inference()
    held = k[..., :5, :].clone().requires_grad_()
    _, d = CarriedKeys(held * 2).step(q[..., 5:, :], k[..., 5:, :], w[..., 5:, :], beta[..., 5:])
    assert d.old.requires_grad and not d.clone().old.requires_grad


def test_decoding_past_two_folds_equals_the_full_forward(plans):
    """A model decoding token by token for more than two folds of its carried keys gives the
    full forward's output; each step's attention takes the OWN_LOGITS leaf (no q·kᵀ), the
    prompt's the Householder leaf (no (T, T) tensor, the cache's keys carried chunk by chunk)."""
    from posenc.backends import Leaf

    model = _model(attn_impl="sdpa")
    tokens = torch.randint(0, 64, (2, 2 * FOLD + 20), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = model(tokens)
        del plans[:]
        cache = model.new_cache()
        parts = [model(tokens[:, :10], cache=cache)]
        for t in range(10, tokens.shape[1]):
            parts.append(model(tokens[:, t:t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-10, rtol=1e-10)
    layers = len(model.blocks)
    assert {p.leaf for p in plans[:layers]} == {Leaf.HOUSEHOLDER}
    assert {p.leaf for p in plans[layers:]} == {Leaf.OWN_LOGITS}


def test_sliding_cache_equals_the_same_keys_without_a_cache():
    """With a sliding cache, a decoding step sees the last max_length keys carried through every
    Householder since them: the same logits as a standalone call over those keys' tokens with the
    tokens before them (the products need only the tokens between key and query)."""
    enc = _path(conv_size=0)  # no convolution: the kept keys' own tokens give their w
    torch.manual_seed(3)
    attn = Attention(C, H, pe=enc, impl="eager").to(F64)
    x = torch.randn(1, 12, C, dtype=F64)
    cache = posenc.KVCache(1, max_length=5)
    with torch.no_grad():
        for t in range(12):
            ctx = posenc.AttentionContext.build(SequenceInfo.from_offset(1, 1, offset=t), causal=True, cache=cache)
            got = attn(x[:, t:t + 1], ctx, cache=cache)
            cache.commit(ctx.k_seq, 1)
        ctx = posenc.AttentionContext.build(SequenceInfo.from_offset(1, 6, offset=6), causal=True)
        want = attn(x[:, 6:], ctx)[:, -1:]  # the last query over the 6 last tokens: 5 cached + itself
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


# ---- (d) gradients ----------------------------------------------------------------------------

def test_gradients_reach_the_w_and_beta_projections():
    """gradcheck in float64 of an attention layer's output in every parameter of the encoding
    (w_proj's two factors, the convolution's weight and bias, bt_proj's weight and bias), each
    gradient nonzero."""
    torch.manual_seed(0)
    enc = posenc.build("path", d_model=4, num_heads=2, w_rank=3, conv_bias=True).to(F64)
    attn = Attention(4, 2, pe=enc, impl="eager").to(F64)
    x = torch.randn(1, 5, 4, dtype=F64)
    seq = SequenceInfo.from_offset(1, 5)
    names = [n for n, _ in enc.named_parameters()]
    assert {"w_proj.0.weight", "w_proj.1.weight", "w_conv1d.weight", "w_conv1d.bias", "bt_proj.weight",
            "bt_proj.bias"} == set(names)
    params = [p.detach().clone().requires_grad_(True) for p in enc.parameters()]

    def f(*ps):
        return torch.func.functional_call(attn, {f"pe.{n}": p for n, p in zip(names, ps)}, (x, seq))

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-7, rtol=1e-5)
    grads = torch.autograd.grad(f(*params).square().sum(), params)
    assert all(g.abs().max() > 1e-6 for g in grads), [float(g.abs().max()) for g in grads]


# ---- (e), (f): properties -----------------------------------------------------------------------

def test_beta_to_zero_is_nope():
    """β -> 0 makes every H_t the identity: the term vanishes and attention is plain q·k (NoPE)."""
    enc = _path()
    with torch.no_grad():
        enc.bt_proj.weight.zero_()
        enc.bt_proj.bias.fill_(-60.0)  # β = 2 sigmoid(-60) ≈ 1.8e-26
    torch.manual_seed(1)
    attn = Attention(C, H, pe=enc, impl="eager").to(F64)
    plain = Attention(C, H, impl="eager").to(F64)
    plain.load_state_dict({n: p for n, p in attn.state_dict().items() if not n.startswith("pe.")})
    x = torch.randn(2, 9, C, dtype=F64)
    pos = torch.arange(9)[None]
    q = attn.q_proj(x).view(2, 9, H, D).transpose(1, 2)
    k = attn.k_proj(x).view(2, 9, H, D).transpose(1, 2)
    (term,) = enc.terms(q, k, enc.prepare(pos, pos), QKProjection.of(attn, x))
    assert term.dense(pos, pos).abs().max() < 1e-14  # rounding of q_iᵀ P_ij k_j - q_i·k_j only
    for causal in (True, False):
        attn.causal = plain.causal = causal
        seq = SequenceInfo.from_offset(2, 9)
        torch.testing.assert_close(attn(x, seq), plain(x, seq), atol=1e-14, rtol=1e-14)


def test_reflections_are_orthogonal_and_their_products_preserve_norms():
    """At β = 2 every H_t = I - 2 w wᵀ of a unit w is orthogonal, so the scan's P_ijᵀ q_i keeps
    |q_i| for every key; for β < 2 the eigenvalue 1 - β along w shrinks it (|P_ijᵀ q_i| <= |q_i|).
    P_ijᵀ q_i is read from the logits against the D unit keys e_1..e_D (one batch row each)."""
    g = torch.Generator().manual_seed(6)
    Dd, T = 5, 9
    w = F.normalize(torch.randn(1, 1, T, Dd, generator=g, dtype=F64), dim=-1)
    for t in range(T):
        Ht = _householder(w[0, 0, t], torch.tensor(2.0, dtype=F64))
        torch.testing.assert_close(Ht.T @ Ht, torch.eye(Dd, dtype=F64), atol=1e-14, rtol=0)
    q = torch.randn(1, 1, T, Dd, generator=g, dtype=F64).expand(Dd, 1, T, Dd)
    keys = torch.eye(Dd, dtype=F64)[:, None, None, :].expand(Dd, 1, T, Dd)  # row d: every key is e_d
    for beta, equal in ((torch.full((1, 1, T), 2.0, dtype=F64), True),
                        (2 * torch.rand(1, 1, T, generator=g, dtype=F64), False)):
        logits = path_logits(q, keys, w.expand(Dd, 1, T, Dd), beta.expand(Dd, 1, T))  # (Dd, 1, T, T)
        moved = logits[:, 0].permute(1, 2, 0)  # (T, T, Dd): [i, j] = P_ijᵀ q_i
        norms, q_norm = moved.norm(dim=-1), q[0, 0].norm(dim=-1)[:, None].expand(T, T)
        if equal:
            torch.testing.assert_close(norms, q_norm, atol=1e-12, rtol=1e-12)
        else:
            assert (norms <= q_norm + 1e-12).all() and (norms < q_norm - 1e-3).any()


def test_the_encodings_own_w_is_unit_to_flas_eps():
    """w = y / sqrt(|y|² + 1e-6) (FLA's l2_norm): |w| is 1 to within 1e-6 / |y|², so its
    reflection at β = 2 is orthogonal to that order."""
    enc = _path()
    x = torch.randn(2, 6, C, dtype=F64)
    with torch.no_grad():
        w, _, _ = enc.householders(x)
    assert ((w.norm(dim=-1) - 1).abs() < 1e-3).all()
    Ht = _householder(w[0, 0, 3], torch.tensor(2.0, dtype=F64))
    y2 = 1e-6 / (1 - w[0, 0, 3].square().sum())  # |y|² from |w|² = |y|² / (|y|² + eps)
    torch.testing.assert_close(Ht.T @ Ht, torch.eye(D, dtype=F64), atol=float(8e-6 / y2), rtol=0)


# ---- boundaries of the short convolution ------------------------------------------------------

def test_convolution_restarts_where_position_ids_do_not_continue():
    """A packed document's first tokens read no tap of the previous document (FLA passes
    cu_seqlens to its convolution): w of a document packed after another equals its w alone."""
    enc = _path()
    x = torch.randn(1, 9, C, dtype=F64)
    packed = SequenceInfo.from_cu_seqlens([0, 4, 9]).positions
    w, beta, _ = enc.householders(x, packed)
    alone, _, _ = enc.householders(x[:, 4:])
    torch.testing.assert_close(w[:, :, 4:], alone, atol=1e-14, rtol=0)
    joined, _, _ = enc.householders(x)  # one document: the fifth token reads the fourth
    assert (joined[:, :, 4] - w[:, :, 4]).abs().max() > 1e-3


def test_keys_before_the_call_need_a_cache():
    enc = _path()
    attn = Attention(C, H, pe=enc).to(F64)
    q, k = torch.zeros(1, H, 1, D, dtype=F64), torch.zeros(1, H, 5, D, dtype=F64)
    pos = torch.arange(5)[None]
    with pytest.raises(ValueError, match="path needs the Householders of all 5 keys"):
        enc.terms(q, k, enc.prepare(pos[:, -1:], pos), QKProjection.of(attn, torch.zeros(1, 1, C, dtype=F64)))


def test_autocast_leaves_the_products_in_float32():
    """Under bfloat16 autocast the term is computed as without it, in float32: a bfloat16 product
    of Householders would drift with every token."""
    torch.manual_seed(0)
    enc = posenc.build("path", d_model=C, num_heads=H)
    attn = Attention(C, H, pe=enc, impl="eager")
    x = torch.randn(1, 70, C)
    pos = torch.arange(70)[None]
    q = attn.q_proj(x).view(1, 70, H, D).transpose(1, 2)
    k = attn.k_proj(x).view(1, 70, H, D).transpose(1, 2)
    with torch.no_grad():
        (want,) = enc.terms(q, k, enc.prepare(pos, pos), QKProjection.of(attn, x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (got,) = enc.terms(q, k, enc.prepare(pos, pos), QKProjection.of(attn, x))
    got, want = got.dense(pos, pos), want.dense(pos, pos)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=0, rtol=0)
