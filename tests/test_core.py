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
        assert torch.equal(ctx.mask.dense().expand_as(ref), ref)


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
    torch.testing.assert_close(attn(x, ctx), reference_attention(attn, x, x, ctx.mask.dense()))


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
    assert len(m.encodings) == 2 and m.encoding_of(1) is None
    assert m.encoding_of(0) is m.encodings[0] and m.encoding_of(2) is m.encodings[1]
    assert all(b.attn.pe is None for b in m.blocks)  # the model owns the encodings, not the layers


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
            x = block(x, ctx, ctx.prepare(None), None, i)
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
    assert all(m.encoding_of(i) is m.encodings[0] for i in range(3))


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


# ---- positions: bad inputs ------------------------------------------------------------------
def test_padding_mask_accepts_bool_int_and_float_01():
    want = SequenceInfo.from_padding_mask(torch.tensor([[False, True, True], [True, True, False]]))
    for mask in (torch.tensor([[0, 1, 1], [1, 1, 0]]), torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])):
        got = SequenceInfo.from_padding_mask(mask)
        assert torch.equal(got.positions, want.positions) and torch.equal(got.valid, want.valid)


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min, -1e4])
def test_padding_mask_refuses_an_additive_mask(fill):
    # Hugging Face's extended attention mask: 0 at real tokens, a large negative at padding.
    # Read as 0/1 it would make real tokens padding and padding real: refused, with the fix.
    additive = torch.tensor([[fill, 0.0, 0.0], [0.0, 0.0, fill]])
    with pytest.raises(ValueError, match=r"only 0 and 1 .* looks like an additive attention mask .* mask == 0"):
        SequenceInfo.from_padding_mask(additive)
    fixed = SequenceInfo.from_padding_mask(additive == 0)
    assert fixed.valid.tolist() == [[False, True, True], [True, True, False]]


def test_padding_mask_refuses_other_values():
    with pytest.raises(ValueError, match=r"mask must hold only 0 and 1 \(1 = real token\), got 2$"):
        SequenceInfo.from_padding_mask(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match=r"got 0.5$"):
        SequenceInfo.from_padding_mask(torch.tensor([[1.0, 0.5]]))
    with pytest.raises(TypeError, match="mask must be a"):
        SequenceInfo.from_padding_mask([[1, 1]])


@pytest.mark.parametrize(
    "bad, match",
    [
        ([0, 5.7, 10], r"cu_seqlens must hold ints, got 5.7 \(float\)"),
        ([0, 5.0, 10], r"cu_seqlens must hold ints, got 5.0 \(float\)"),
        ([0, True, 2], r"cu_seqlens must hold ints, got True \(bool\)"),
        (torch.tensor([0.0, 5.7, 10.0]), r"cu_seqlens must be an integer tensor, got torch.float32"),
        (7, r"cu_seqlens must be a list of ints or an integer tensor, got int"),
    ],
)
def test_cu_seqlens_refuses_non_integers(bad, match):
    with pytest.raises(TypeError, match=match):
        SequenceInfo.from_cu_seqlens(bad)


def test_cu_seqlens_accepts_integer_tensors_of_any_width():
    for dtype in (torch.int32, torch.int64):
        s = SequenceInfo.from_cu_seqlens(torch.tensor([0, 2, 3], dtype=dtype))
        assert s.positions.tolist() == [[0, 1, 0]]


def test_from_offset_refuses_negative_tensor_offsets_like_ints():
    with pytest.raises(ValueError, match=r"offset must be >= 0, got -1$"):
        SequenceInfo.from_offset(2, 3, -1)
    with pytest.raises(ValueError, match=r"offset must be >= 0, got a minimum of -2$"):
        SequenceInfo.from_offset(2, 3, torch.tensor([0, -2]))
    with pytest.raises(TypeError, match=r"offset tensor must hold integers, got torch.float32"):
        SequenceInfo.from_offset(2, 3, torch.tensor([0.0, 1.5]))
    with pytest.raises(TypeError, match=r"offset must be an int, got float 1.5"):
        SequenceInfo.from_offset(2, 3, 1.5)
    with pytest.raises(TypeError, match=r"batch must be an int, got str '2'"):
        SequenceInfo.from_offset("2", 3)
    with pytest.raises(ValueError, match=r"batch must be >= 1, got 0"):
        SequenceInfo.from_offset(0, 3)
    with pytest.raises(TypeError, match=r"length must be an int, got float 3.0"):
        SequenceInfo.from_offset(2, 3.0)


def test_sequence_info_refuses_lists_arrays_and_negative_positions():
    np = pytest.importorskip("numpy")
    for bad in ([[0, 1, 2]], np.arange(3)[None]):
        with pytest.raises(TypeError, match=r"positions must be a \(B, T\) integer tensor, got .* torch.as_tensor"):
            SequenceInfo(positions=bad)
    with pytest.raises(ValueError, match=r"positions must be >= 0, got a minimum of -3$"):
        SequenceInfo(torch.tensor([[0, 1, -3]]))
    with pytest.raises(TypeError, match=r"segment_ids must be a tensor or None, got list"):
        SequenceInfo(torch.tensor([[0, 1]]), segment_ids=[[0, 0]])
    with pytest.raises(TypeError, match=r"segment_ids must be an integer tensor, got torch.float32"):
        SequenceInfo(torch.tensor([[0, 1]]), segment_ids=torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"valid is on meta but positions are on cpu"):
        SequenceInfo(torch.tensor([[0, 1]]), valid=torch.ones(1, 2, dtype=torch.bool, device="meta"))


# ---- forward: bad inputs --------------------------------------------------------------------
def _model(**over):
    return Transformer(ModelConfig(vocab_size=50, d_model=32, n_head=4, n_layer=1, encoding="rope", **over))


@pytest.mark.parametrize("bad", [50, 1000, -1])
def test_forward_refuses_token_ids_outside_the_vocabulary(bad):
    tokens = torch.tensor([[1, 2, bad, 3]])
    with pytest.raises(ValueError, match=rf"tokens must be in \[0, 50\) \(vocab_size\), got {bad}$"):
        _model()(tokens)


def test_forward_refuses_float_tokens_and_other_types():
    with pytest.raises(TypeError, match=r"tokens must be an integer tensor of token ids, got torch.float32"):
        _model()(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(TypeError, match=r"tokens must be an integer tensor of token ids, got torch.bool"):
        _model()(torch.tensor([[True, False]]))
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, T\), got list"):
        _model()([[1, 2]])
    with pytest.raises(TypeError, match=r"seq must be a SequenceInfo or None, got Tensor"):
        _model()(torch.tensor([[1, 2]]), torch.tensor([[0, 1]]))


def test_forward_refuses_positions_on_another_device():
    seq = SequenceInfo(torch.zeros(1, 3, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match=r"seq is on meta but the tokens are on cpu"):
        _model()(torch.tensor([[1, 2, 3]]), seq)
    with pytest.raises(ValueError, match=r"tokens are on meta but the model is on cpu"):
        _model()(torch.zeros(1, 3, dtype=torch.long, device="meta"))


def test_forward_refuses_inputs_embeds_of_another_dtype():
    # float64 embeddings through a float32 model would give float64 logits of float32 math.
    model = _model()
    with pytest.raises(TypeError, match=r"inputs_embeds must have the model's dtype torch.float32, got torch.float64"):
        model(None, inputs_embeds=torch.zeros(1, 3, 32, dtype=torch.float64))
    model64 = _model().double()
    x = torch.randn(1, 3, 32, dtype=torch.float64)
    assert model64(None, inputs_embeds=x).dtype == torch.float64


def test_generate_refuses_an_empty_prompt():
    with pytest.raises(ValueError, match=r"tokens must be a \(B, T\) tensor with T >= 1 \(the prompt\), got \(2, 0\)"):
        _model().generate(torch.zeros(2, 0, dtype=torch.long), 3)


# ---- attention numerics ---------------------------------------------------------------------
class _ThirdOfDistance(posenc.PositionalEncoding):
    """A logit term (i - j) / 3 in the input dtype: not exact in float32."""

    def prepare(self, q_pos, k_pos):
        return q_pos, k_pos

    def terms(self, q, k, state, proj):
        from posenc.terms import DenseTerm

        d = posenc.positions.relative_positions(*state).to(q.dtype) / 3  # (B, Tq, Tk)
        return [DenseTerm(d[:, None].expand(q.shape[0], q.shape[1], -1, -1))]


@pytest.mark.parametrize("with_score", [False, True])
def test_float64_attention_stays_float64(with_score):
    """Eager attention in float64 against a float64 loop: 1e-12, where rounding the logits or
    the score term to float32 (as before) errs by ~1e-7."""
    torch.manual_seed(0)
    pe = _ThirdOfDistance(posenc.config.EncodingConfig(), posenc.Dims(32, 4, 8)) if with_score else None
    attn = Attention(32, 4, pe=pe, impl="eager").double()
    x = torch.randn(2, 6, 32, dtype=torch.float64) * 4  # large logits: float32 rounding shows
    seq = SequenceInfo.from_offset(2, 6, 3)
    B, T, H, D = 2, 6, 4, 8
    q = attn.q_proj(x).view(B, T, H, D)
    k = attn.k_proj(x).view(B, T, H, D)
    v = attn.v_proj(x).view(B, T, H, D)
    out = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = torch.stack([q[b, i, h] @ k[b, j, h] / math.sqrt(D) + (i - j) / 3 * with_score for j in range(i + 1)])
                out[b, i, h] = torch.softmax(logits, -1) @ v[b, : i + 1, h]
    want = attn.o_proj(out.reshape(B, T, H * D))
    torch.testing.assert_close(attn(x, seq), want, atol=1e-12, rtol=1e-12)
