"""The foundation: positions helpers, masks, attention paths, model wiring and bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import Attention, AttentionContext, ModelConfig, SequenceInfo, Transformer
from posenc.cli import main as cli_main


# ---- positions -----------------------------------------------------------------------------
def test_positions_from_offset_scalar_and_per_row():
    s = SequenceInfo.from_offset(2, 3, 5)
    assert s.positions.tolist() == [[5, 6, 7], [5, 6, 7]]
    s = SequenceInfo.from_offset(2, 3, torch.tensor([0, 4]))
    assert s.positions.tolist() == [[0, 1, 2], [4, 5, 6]]


def test_positions_from_padding_mask_left_and_right():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    s = SequenceInfo.from_padding_mask(mask)
    assert s.positions.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0]]
    assert s.valid.tolist() == mask.bool().tolist()


def test_positions_from_cu_seqlens_restart_per_document():
    s = SequenceInfo.from_cu_seqlens([0, 3, 5, 9])
    assert s.positions.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert s.segment_ids.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2]]


@pytest.mark.parametrize(
    "bad, match",
    [([1, 3], "start at 0"), ([0, 3, 3], "strictly increasing"), ([0], ">= 2 entries")],
)
def test_cu_seqlens_bad_inputs(bad, match):
    with pytest.raises(ValueError, match=match):
        SequenceInfo.from_cu_seqlens(bad)


def test_sequence_info_bad_shapes():
    with pytest.raises(ValueError, match="positions must have shape"):
        SequenceInfo(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="valid must have the shape"):
        SequenceInfo(torch.zeros(1, 3, dtype=torch.long), valid=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="integer"):
        SequenceInfo(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="offset must be >= 0"):
        SequenceInfo.from_offset(1, 3, -1)


# ---- masks ----------------------------------------------------------------------------------
def reference_mask(q_seq, k_seq, q_index, k_index, causal):
    """Loop over (b, i, j): who may attend to whom, spelled out."""
    B, Tq = q_seq.positions.shape
    Tk = k_seq.positions.shape[1]
    m = torch.zeros(B, 1, Tq, Tk, dtype=torch.bool)
    for b in range(B):
        for i in range(Tq):
            for j in range(Tk):
                ok = True
                if causal and k_index[j] > q_index[i]:
                    ok = False
                if k_seq.valid is not None and not k_seq.valid[b, j]:
                    ok = False
                if q_seq.segment_ids is not None and q_seq.segment_ids[b, i] != k_seq.segment_ids[b, j]:
                    ok = False
                m[b, 0, i, j] = ok
            if not m[b, 0, i].any():
                m[b, 0, i] = True
    return m


@pytest.mark.parametrize("causal", [True, False])
def test_mask_matches_reference(causal):
    packed = SequenceInfo.from_cu_seqlens([0, 2, 5, 6])
    padded = SequenceInfo.from_padding_mask(torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]))
    for seq in (packed, padded):
        ctx = AttentionContext.build(seq, causal=causal)
        T = seq.positions.shape[1]
        ref = reference_mask(seq, seq, torch.arange(T), torch.arange(T), causal)
        assert torch.equal(ctx.mask.expand_as(ref), ref)


# ---- attention -----------------------------------------------------------------------------
def reference_attention(attn: Attention, x, ctx_x, mask):
    """Multi-head attention written per head with explicit softmax, no positional encoding."""
    B, Tq, C = x.shape
    H, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(B, Tq, H, D)
    k = attn.k_proj(ctx_x).view(B, -1, Hkv, D)
    v = attn.v_proj(ctx_x).view(B, -1, Hkv, D)
    out = torch.zeros(B, Tq, H, D, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            logits = q[b, :, h] @ k[b, :, g].T / math.sqrt(D)
            if mask is not None:
                logits = logits.masked_fill(~mask[b if mask.shape[0] > 1 else 0, 0], float("-inf"))
            out[b, :, h] = torch.softmax(logits, -1) @ v[b, :, g]
    return attn.o_proj(out.reshape(B, Tq, H * D))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_matches_reference_with_gqa(impl, causal):
    attn = Attention(32, 4, 2, causal=causal, impl=impl).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    seq = SequenceInfo.from_padding_mask(torch.tensor([[1] * 7, [0, 0] + [1] * 5]))
    ctx = AttentionContext.build(seq, causal=causal)
    torch.testing.assert_close(attn(x, ctx), reference_attention(attn, x, x, ctx.mask))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_cross_attention_q_len_differs_from_k_len(impl):
    attn = Attention(16, 2, causal=False, impl=impl).double()
    x, mem = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 8, 16, dtype=torch.float64)
    q_seq, k_seq = SequenceInfo.from_offset(2, 3), SequenceInfo.from_offset(2, 8)
    ctx = AttentionContext.build(q_seq, k_seq, causal=False)
    torch.testing.assert_close(attn(x, ctx, context=mem), reference_attention(attn, x, mem, None))


def test_attention_bad_inputs():
    with pytest.raises(ValueError, match="num_kv_heads"):
        Attention(32, 4, 3)
    with pytest.raises(ValueError, match="impl"):
        Attention(32, 4, impl="flash")
    attn = Attention(32, 4)
    with pytest.raises(ValueError, match="positions cover 5 tokens but x has 4"):
        attn(torch.randn(1, 4, 32), SequenceInfo.from_offset(1, 5))


# ---- model ---------------------------------------------------------------------------------
def test_shared_specs_resolve_to_one_module():
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, encoding="learned")
    assert len(Transformer(cfg).encodings) == 1
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, encoding="learned", share_encoding=False)
    assert len(Transformer(cfg).encodings) == 3
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, layer_encodings=("learned", None, "sinusoidal"))
    m = Transformer(cfg)
    assert len(m.encodings) == 2 and m.blocks[1].attn.pe is None


@pytest.mark.parametrize("before_last", [0, 1, 3])
def test_absolute_before_last_layers_is_where_positions_enter(before_last):
    """DeBERTa's enhanced mask decoder: absolute positions enter before the last N layers.
    Reference: run the blocks by hand and add PE(p) at layer n_layer - N."""
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, causal=False, encoding="sinusoidal",
                      absolute_before_last=before_last)
    m = Transformer(cfg).eval()
    tokens = torch.randint(0, 256, (2, 6))
    seq = SequenceInfo.from_offset(2, 6)
    ctx = AttentionContext.build(seq, causal=False)
    pe = posenc.absolute.sinusoidal_table(seq.positions, 32)  # (B, T, C)
    with torch.no_grad():
        x = m.tok_emb(tokens)
        for i, block in enumerate(m.blocks):
            if i == 3 - before_last:
                x = x + pe
            x = block(x, ctx, None, i)
        if before_last == 0:
            x = x + pe
        ref = m.head(m.ln_f(x))
        torch.testing.assert_close(m(tokens), ref)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(d_model=30, n_head=4), ValueError, "divisible"),
        (dict(n_head=4, n_kv_head=3), ValueError, "multiple of n_kv_head"),
        (dict(encoding="nope-not-real"), ValueError, "valid encodings"),
        (dict(attn_impl="flash"), ValueError, "attn_impl"),
        (dict(dropout=1.5), ValueError, "dropout"),
        (dict(dropout=float("nan")), ValueError, "dropout"),
        (dict(n_layer=0), ValueError, "n_layer"),
        (dict(n_layer=2, absolute_before_last=3), ValueError, "absolute_before_last"),
        (dict(n_layer=2, layer_encodings=("none",)), ValueError, "layer_encodings"),
        (dict(vocab_size=2.5), TypeError, "vocab_size"),
    ],
)
def test_model_config_bad_inputs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ModelConfig(**kwargs)


def test_build_and_registry_errors():
    with pytest.raises(ValueError, match="valid encodings: none"):
        posenc.build("nonexistent", d_model=32, num_heads=4)
    with pytest.raises(ValueError, match="divisible"):
        posenc.build("none", d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="already registered"):
        posenc.register("none", family="none", summary="", paper="")(type("X", (posenc.PositionalEncoding,), {}))
    with pytest.raises(ValueError, match="family"):
        posenc.list_encodings("nonsense")


def test_generate_matches_step_by_step_argmax():
    model = Transformer(ModelConfig(d_model=32, n_head=4, n_layer=2, encoding="sinusoidal")).eval()
    prompt = torch.randint(0, 256, (2, 5))
    out = model.generate(prompt, 4)
    seq = prompt
    for _ in range(4):  # reference: full forward on the whole prefix every step, no cache
        nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(out, seq)


def test_model_input_errors():
    model = Transformer(ModelConfig(d_model=32, n_head=4, n_layer=1, encoding="none"))
    with pytest.raises(ValueError, match="tokens must have shape"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="positions have shape"):
        model(torch.zeros(1, 3, dtype=torch.long), SequenceInfo.from_offset(1, 4))
    with pytest.raises(ValueError, match="either tokens or inputs_embeds"):
        model(torch.zeros(1, 3, dtype=torch.long), inputs_embeds=torch.zeros(1, 3, 32))


def test_cli_list_prints_every_encoding(capsys):
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    for name in posenc.list_encodings():
        assert name in out
        assert posenc.get_info(name).paper in out


def test_shared_encoding_appears_once_in_state_dict():
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, encoding="learned")
    m = Transformer(cfg)
    keys = [k for k in m.state_dict() if "weight" in k and m.state_dict()[k].shape == (1024, 32)]
    assert keys == ["encodings.0.weight"]
    assert all(b.attn.pe is m.encodings[0] for b in m.blocks)


def test_kv_cache_append_equals_concatenation_across_growth():
    from posenc.attention import KVCache

    cache = KVCache(1)
    ks, vs = [], []
    with torch.no_grad():
        for t in (5, 1, 1, 20, 1, 3):  # crosses the initial capacity (16) and a doubling
            k, v = torch.randn(2, 3, t, 4), torch.randn(2, 3, t, 4)
            ks.append(k)
            vs.append(v)
            kk, vv = cache.update(0, k, v)
            assert torch.equal(kk, torch.cat(ks, 2)) and torch.equal(vv, torch.cat(vs, 2))
    assert cache.layers[0].kbuf.shape[2] >= 31 and cache.layers[0].n == 31
    with pytest.raises(ValueError, match="batch size changed"):
        cache.update(0, torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4))


@pytest.mark.parametrize("bias_batch", [1, 2])
def test_causal_sdpa_with_bias_row_blocks_match_reference(bias_batch):
    # Blocks of 4 rows over T = 11 (the last block is short): every query's softmax is
    # written out over the keys j <= i, forward and gradients w.r.t. q, k, v and the bias.
    from posenc.attention import causal_sdpa_with_bias

    B, H, T, D = 2, 3, 11, 5
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.randn(bias_batch, H, T, T, dtype=torch.float64, requires_grad=True)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    got = causal_sdpa_with_bias(q, k, v, bias.masked_fill(~causal, float("-inf")), 0.3, rows=4)
    want = torch.zeros(B, H, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = 0.3 * (k[b, h, : i + 1] @ q[b, h, i]) + bias[b % bias_batch, h, i, : i + 1]
                want[b, h, i] = torch.softmax(logits, -1) @ v[b, h, : i + 1]
    torch.testing.assert_close(got, want)
    up = torch.randn_like(want)
    g_got = torch.autograd.grad((got * up).sum(), (q, k, v, bias))
    g_want = torch.autograd.grad((want * up).sum(), (q, k, v, bias))
    for a, w in zip(g_got, g_want):
        torch.testing.assert_close(a, w)
