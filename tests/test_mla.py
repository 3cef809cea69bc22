"""posenc.mla: multi-head latent attention (DeepSeek-V2 §2.1) with its decoupled RoPE.

Against transformers' own DeepseekV3Attention on the same weights (float64, whole tensors), an
explicit loop over the paper's formula (per head, per pair), and itself: decoding from the
latent cache (naive and absorbed) equals the full forward, across grad modes, with a cache that
holds R + dr numbers per token."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.context import AttentionContext
from posenc.kv_cache import KVCache, LatentCache
from posenc.mla import (
    PATHS,
    MLAConfig,
    MultiHeadLatentAttention,
    deepseek_v3_keys,
    multiply_adds,
    softmax_mscale,
)
from posenc.positions import SequenceInfo

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
ROPES = {
    "none": {"rope_type": "default", "rope_theta": 10000.0},  # DeepSeek-V2-Lite's rope_scaling None
    "yarn_mscale": {**YARN, "mscale": 1.0, "mscale_all_dim": 1.0},  # DeepSeek-V3's published block
    "yarn_mscale_ratio": {**YARN, "mscale": 1.0, "mscale_all_dim": 0.5},  # attention factor != 1 on cos/sin too
}
SIZES = dict(hidden_size=64, num_attention_heads=4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
             v_head_dim=12)  # dv != dn: the value width is its own


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b|: one number for the whole tensor."""
    assert a.shape == b.shape and b.abs().max() > 0
    return ((a - b).abs().max() / b.abs().max()).item()


def hf_config(rope: dict, q_lora_rank: int | None, interleave: bool = True, bias: bool = False):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeepseekV3Config(**SIZES, num_key_value_heads=4, q_lora_rank=q_lora_rank,
                                        max_position_embeddings=256, rope_parameters=dict(rope),
                                        rope_interleave=interleave, attention_bias=bias)
    cfg._attn_implementation = "sdpa"  # float64 throughout (the eager one takes its softmax in float32)
    return cfg


def hf_attention(cfg):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    attn = DeepseekV3Attention(cfg, layer_idx=0).double().eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in attn.parameters():  # the norms' weights too: ones would hide a missing weight
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return attn


def mla_like(hf, cfg, **kw) -> MultiHeadLatentAttention:
    """posenc's layer with the transformers layer's weights (identity key map) and RoPE."""
    mla = MultiHeadLatentAttention(MLAConfig.from_hf(cfg), posenc.rotary.from_hf(cfg), **kw).double()
    mla.load_state_dict(hf.state_dict(), strict=True)
    return mla


def causal_mask(T: int) -> torch.Tensor:
    return torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]  # (1, 1, T, T)


def x_of(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(B, T, SIZES["hidden_size"], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---- (a) transformers' DeepseekV3Attention on the same weights ---------------------------------
@pytest.mark.parametrize("interleave", (True, False))
@pytest.mark.parametrize("q_lora_rank", (None, 24))
@pytest.mark.parametrize("rope", ROPES)
def test_equals_transformers_deepseek_v3_attention(rope, q_lora_rank, interleave):
    """As transformers runs it: its rotary module's float32 angles and its RMSNorm in float32 (also
    for float64 inputs) bound the agreement at ~1e-7; 40 positions reach past YaRN's original 16."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    cfg = hf_config(ROPES[rope], q_lora_rank, interleave)
    hf = hf_attention(cfg)
    B, T = 2, 40
    x = x_of(B, T)
    cos, sin = DeepseekV3RotaryEmbedding(cfg)(x, torch.arange(T)[None].expand(B, T))
    with torch.no_grad():
        want, _ = hf(x, (cos, sin), causal_mask(T))
        for path in PATHS:
            mla = mla_like(hf, cfg, path=path)
            assert mla.pe.config.layout == ("interleaved" if interleave else "half")
            assert rel(mla(x, SequenceInfo.from_offset(B, T)), want) <= 1e-6, path
    # the softmax scale is transformers' (mscale_all_dim's square under YaRN), not just 1/sqrt(dn + dr)
    assert hf.scaling == pytest.approx(mla.config.qk_head_dim**-0.5 * softmax_mscale(mla.pe), rel=1e-15)
    assert (softmax_mscale(mla.pe) > 1.01) == (rope != "none")


class Float64RMSNorm(torch.nn.Module):
    """transformers' DeepseekV3RMSNorm without its float32 cast: the same formula in float64."""

    def __init__(self, norm) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


@pytest.mark.parametrize("bias", (False, True))
@pytest.mark.parametrize("q_lora_rank", (None, 24))
@pytest.mark.parametrize("rope", ROPES)
def test_equals_transformers_at_float64_rounding(rope, q_lora_rank, bias):
    """The same comparison with transformers' two float32 steps taken out: its norms in float64
    and posenc's own cos/sin tables handed to it (cat(freqs, freqs), as its rotary module makes
    them). What is left is the structure: projections, split, rotation, scale, softmax, values."""
    cfg = hf_config(ROPES[rope], q_lora_rank, bias=bias)  # attention_bias: q_a_proj, kv_a_proj_with_mqa, o_proj
    hf = hf_attention(cfg)
    assert (hf.o_proj.bias is not None) == bias
    for name in ("q_a_layernorm", "kv_a_layernorm"):
        if getattr(hf, name) is not None:
            setattr(hf, name, Float64RMSNorm(getattr(hf, name)))
    B, T = 2, 40
    x = x_of(B, T)
    mla = mla_like(hf, cfg)
    cos, sin = mla.pe.cos_sin(torch.arange(T)[None])  # (1, T, dr/2) float32, the attention factor in
    tables = (torch.cat([cos, cos], -1).double(), torch.cat([sin, sin], -1).double())
    with torch.no_grad():
        want, _ = hf(x, tables, causal_mask(T))
        for path in ("naive", "absorbed"):
            mla.path = path
            assert rel(mla(x, SequenceInfo.from_offset(B, T)), want) <= 1e-13, path


def test_a_checkpoint_s_keys_map_onto_the_layer():
    cfg = hf_config(ROPES["yarn_mscale"], 24)
    hf = hf_attention(cfg)
    full = {f"model.layers.3.self_attn.{k}": v for k, v in hf.state_dict().items()}
    full["model.layers.3.mlp.up_proj.weight"] = torch.zeros(1)
    mla = MultiHeadLatentAttention(MLAConfig.from_hf(cfg), posenc.rotary.from_hf(cfg)).double()
    mla.load_state_dict(deepseek_v3_keys(full, 3), strict=True)
    assert sorted(mla.state_dict()) == sorted(hf.state_dict())
    with pytest.raises(ValueError, match=r"no key starts with 'model.layers.4.self_attn.'"):
        deepseek_v3_keys(full, 4)


# ---- (e) the paper's formula, one head, one pair at a time -------------------------------------
def slow_attention(mla: MultiHeadLatentAttention, x: torch.Tensor):
    """Logits and output of causal MLA by explicit loops (DeepSeek-V2 eqs. 9-19): per head, the
    nope dot plus, per pair j, the rotated pair of q at m against k's at n, rotated by angles
    m·theta_j and n·theta_j (interleaved pairs (2j, 2j + 1); cos/sin times YaRN's factor, angles
    in float64 and cos/sin rounded to float32 as posenc's tables are), times 1/sqrt(dn + dr) and
    DeepSeek's mscale(s, mscale_all_dim)^2."""
    c = mla.config
    H, dn, dr, dv, R = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
    B, T, _ = x.shape
    inv_freq, factor = mla.pe.frequencies()
    scaling = mla.pe.config.scaling_config
    m_all = getattr(scaling, "mscale_all_dim", None)
    mscale = 0.1 * m_all * math.log(scaling.factor) + 1.0 if m_all else 1.0
    scale = mscale**2 / math.sqrt(dn + dr)
    W = {k: v for k, v in mla.state_dict().items()}

    def rms(v, w):
        return w * v / torch.sqrt((v * v).mean() + c.norm_eps)

    def f32(v: float) -> float:  # posenc's cos/sin tables are float32 (rope.py: "Numerics")
        return torch.tensor(v, dtype=torch.float32).item()

    def rotate(v, pos):  # v (dr,): pair j turned by pos * theta_j
        out = torch.empty_like(v)
        for j in range(dr // 2):
            a, b = v[2 * j], v[2 * j + 1]
            angle = pos * inv_freq[j].item()
            cs, sn = f32(math.cos(angle) * factor), f32(math.sin(angle) * factor)
            out[2 * j], out[2 * j + 1] = a * cs - b * sn, b * cs + a * sn
        return out

    logits = torch.full((B, H, T, T), float("nan"), dtype=torch.float64)
    out = torch.zeros(B, T, c.d_model, dtype=torch.float64)
    for b in range(B):
        ckv, kpe, q = [], [], []
        for t in range(T):
            kv = W["kv_a_proj_with_mqa.weight"] @ x[b, t]
            ckv.append(rms(kv[:R], W["kv_a_layernorm.weight"]))
            kpe.append(rotate(kv[R:], t))
            qt = W["q_b_proj.weight"] @ rms(W["q_a_proj.weight"] @ x[b, t], W["q_a_layernorm.weight"])
            q.append(qt.view(H, dn + dr))
        for h in range(H):
            wk = W["kv_b_proj.weight"].view(H, dn + dv, R)[h, :dn]  # (dn, R)
            wv = W["kv_b_proj.weight"].view(H, dn + dv, R)[h, dn:]  # (dv, R)
            for m in range(T):
                q_pe = rotate(q[m][h, dn:], m)
                for n in range(T):
                    nope = sum(q[m][h, i] * (wk[i] @ ckv[n]) for i in range(dn))
                    rope = sum(q_pe[2 * j] * kpe[n][2 * j] + q_pe[2 * j + 1] * kpe[n][2 * j + 1] for j in range(dr // 2))
                    logits[b, h, m, n] = (nope + rope) * scale
                p = torch.softmax(logits[b, h, m, : m + 1], dim=0)
                o = sum(p[n] * (wv @ ckv[n]) for n in range(m + 1))  # (dv,)
                out[b, m] += W["o_proj.weight"][:, h * dv:(h + 1) * dv] @ o
    return logits, out


@pytest.mark.parametrize("rope", ("none", "yarn_mscale_ratio"))
def test_logits_and_output_equal_a_slow_loop(rope):
    scaling = {} if rope == "none" else dict(scaling="yarn", factor=4.0, original_max_position_embeddings=16,
                                             mscale=1.0, mscale_all_dim=0.5)
    cfg = MLAConfig(d_model=16, num_heads=2, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=3,
                    q_lora_rank=5)
    mla = MultiHeadLatentAttention(cfg, cfg.build_encoding("rope", layout="interleaved", **scaling)).double()
    with torch.no_grad():
        for p in mla.parameters():
            p.normal_(0.0, 0.5)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    seq = SequenceInfo.from_offset(2, 7)
    want_logits, want_out = slow_attention(mla, x)
    with torch.no_grad():
        got = mla.logits(x, seq)
        assert torch.allclose(torch.tril(got), torch.tril(want_logits.nan_to_num()), rtol=1e-12, atol=1e-12)
        assert torch.allclose(got, want_logits, rtol=1e-12, atol=1e-12)  # the upper triangle too: before the mask
        for path in ("naive", "absorbed"):
            mla.path = path
            torch.testing.assert_close(mla(x, seq), want_out, rtol=1e-12, atol=1e-12)


# ---- (b) decoding from the latent cache ----------------------------------------------------------
def small_mla(path: str, impl: str = "sdpa", scaling: str = "yarn", encoding: str = "rope", **cfg_kw):
    cfg = MLAConfig(d_model=32, num_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                    **cfg_kw)
    kw = dict(layout="interleaved", scaling="yarn", factor=4.0, original_max_position_embeddings=8, mscale=1.0,
              mscale_all_dim=1.0) if encoding == "rope" and scaling == "yarn" else {}
    return MultiHeadLatentAttention(cfg, cfg.build_encoding(encoding, **kw), impl=impl, path=path).double().eval()


def columns(seq: SequenceInfo, a: int, b: int) -> SequenceInfo:
    cut = lambda t: None if t is None else t[:, a:b]  # noqa: E731
    return SequenceInfo(seq.positions[:, a:b], cut(seq.segment_ids), cut(seq.valid))


def decode(mla, x: torch.Tensor, steps: list[int], cache: KVCache | None = None, seq: SequenceInfo | None = None):
    """x in chunks of ``steps`` tokens through one latent cache (standalone: commit after each)."""
    cache = KVCache(1, latent_layers=[0]) if cache is None else cache
    outs, t = [], 0
    for n in steps:
        part = SequenceInfo.from_offset(x.shape[0], n, offset=t) if seq is None else columns(seq, t, t + n)
        ctx = AttentionContext.build(part, causal=True, cache=cache)
        outs.append(mla(x[:, t:t + n], ctx, cache=cache))
        cache.commit(ctx.k_seq, n)
        t += n
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("impl", ("eager", "sdpa"))
@pytest.mark.parametrize("path", PATHS)
def test_decoding_from_the_latent_cache_equals_the_full_forward(path, impl):
    mla = small_mla(path, impl, q_lora_rank=12)
    x = x_of(2, 20)[..., :32]
    with torch.no_grad():
        want = mla(x, SequenceInfo.from_offset(2, 20))
        for steps in ([1] * 20, [5, 1, 1, 3, 10]):
            got, cache = decode(mla, x, steps)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert cache.length == 20 and cache.layers[0].n == 20


def test_auto_takes_naive_for_a_prefill_and_absorbed_for_a_decoding_step(spy):
    mla = small_mla("auto")
    naive, absorbed = spy(mla, "_naive"), spy(mla, "_absorbed")
    with torch.no_grad():
        decode(mla, x_of(1, 12)[..., :32], [10, 1, 1])
    assert (len(naive), len(absorbed)) == (1, 2)
    assert multiply_adds(mla.config, "absorbed", 1, 11) < multiply_adds(mla.config, "naive", 1, 11)
    assert multiply_adds(mla.config, "naive", 10, 10) <= multiply_adds(mla.config, "absorbed", 10, 10)


def test_absorbed_trains_as_naive_does():
    """Both paths are differentiable and give the same gradients (the absorbed one folds kv_b_proj's
    weight into q and the output, so its gradient reaches kv_b_proj by another route)."""
    x = x_of(2, 9)[..., :32]
    grads = {}
    for path in ("naive", "absorbed"):
        torch.manual_seed(0)  # the same weights
        mla = small_mla(path, q_lora_rank=12)
        mla(x, SequenceInfo.from_offset(2, 9)).square().sum().backward()
        grads[path] = {k: p.grad for k, p in mla.named_parameters()}
    assert grads["naive"].keys() == grads["absorbed"].keys() and len(grads["naive"]) == 7
    for k, g in grads["naive"].items():
        torch.testing.assert_close(grads["absorbed"][k], g, rtol=1e-10, atol=1e-12, msg=k)


def test_a_bias_encoding_runs_on_both_paths():
    """ALiBi's content-independent bias goes to the backend as the layer's shared bias: the same on
    both paths and in decoding."""
    torch.manual_seed(0)
    naive = small_mla("naive", encoding="alibi")
    torch.manual_seed(0)
    absorbed = small_mla("absorbed", encoding="alibi")
    x = x_of(2, 12)[..., :32]
    with torch.no_grad():
        want = naive(x, SequenceInfo.from_offset(2, 12))
        nobias = MultiHeadLatentAttention(naive.config, path="naive").double()
        nobias.load_state_dict(naive.state_dict(), strict=False)
        assert rel(nobias(x, SequenceInfo.from_offset(2, 12)), want) > 1e-3  # the bias does something
        torch.testing.assert_close(absorbed(x, SequenceInfo.from_offset(2, 12)), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(decode(absorbed, x, [4, 1, 1, 6])[0], want, rtol=1e-12, atol=1e-12)


def test_a_left_padded_batch_decodes_as_its_rows_alone():
    mla = small_mla("auto")
    x = x_of(2, 10)[..., :32]
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[0, :3] = False
    seq = SequenceInfo.from_padding_mask(valid)
    with torch.no_grad():
        got, _ = decode(mla, x, [6, 1, 1, 1, 1], seq=seq)
        alone = mla(x[:1, 3:], SequenceInfo.from_offset(1, 7))
    torch.testing.assert_close(got[:1, 3:], alone, rtol=1e-12, atol=1e-12)


# ---- (c) what the cache holds ----------------------------------------------------------------------
def test_the_cache_holds_the_latent_and_one_key_slice_per_token():
    mla = small_mla("absorbed")
    c = mla.config
    with torch.no_grad():
        _, cache = decode(mla, x_of(3, 17)[..., :32], [16, 1])
    slot = cache.layers[0]
    assert isinstance(slot, LatentCache)
    assert slot.latent.shape == (3, 17, c.kv_lora_rank) and slot.k_pe.shape == (3, 17, c.qk_rope_head_dim)
    assert slot.kbuf.shape == (3, 32, c.kv_lora_rank) and slot.vbuf.shape == (3, 32, c.qk_rope_head_dim)  # doubled once
    per_token = slot.kbuf.shape[-1] + slot.vbuf.shape[-1]
    assert per_token == c.cached_per_token == 24
    assert per_token < c.num_heads * (c.qk_head_dim + c.v_head_dim) == 96  # what expanded k and v would hold
    # the cached latent is the normalised one, and the key slice the rotated one
    x = x_of(3, 17)[..., :32]
    with torch.no_grad():
        latent, k_pe = mla.latents(x)
        ctx = AttentionContext.build(SequenceInfo.from_offset(3, 17), causal=True)
        _, k_rot = ctx.prepare(mla.pe).rotate(torch.zeros(3, 4, 17, 8, dtype=torch.float64), k_pe[:, None])
    torch.testing.assert_close(slot.latent, latent, rtol=1e-13, atol=1e-14)  # 16 + 1 rows against 17: matmul rounding
    torch.testing.assert_close(slot.k_pe, k_rot[:, 0], rtol=1e-13, atol=1e-14)


def test_a_sliding_memory_keeps_the_last_latents():
    mla = small_mla("absorbed", scaling="none")
    with torch.no_grad():
        _, cache = decode(mla, x_of(1, 12)[..., :32], [8, 1, 1, 1, 1], cache=KVCache(1, max_length=6, latent_layers=[0]))
    assert cache.layers[0].latent.shape == (1, 6, 16) and cache.length == 6


# ---- (d) one cache across grad modes ---------------------------------------------------------------
def test_inference_mode_then_no_grad_then_autograd_on_one_cache():
    mla = small_mla("auto", q_lora_rank=12)
    x = x_of(2, 12)[..., :32]
    with torch.no_grad():
        want = mla(x, SequenceInfo.from_offset(2, 12))
    cache = KVCache(1, latent_layers=[0])
    with torch.inference_mode():
        first, cache = decode(mla, x[:, :6], [5, 1], cache=cache)
    assert cache.layers[0].kbuf.is_inference()
    outs = [first.clone()]
    with torch.no_grad():
        for t in (6, 7):
            ctx = AttentionContext.build(SequenceInfo.from_offset(2, 1, offset=t), causal=True, cache=cache)
            outs.append(mla(x[:, t:t + 1], ctx, cache=cache))
            cache.commit(ctx.k_seq, 1)
    assert not cache.layers[0].kbuf.is_inference()
    ctx = AttentionContext.build(SequenceInfo.from_offset(2, 4, offset=8), causal=True, cache=cache)
    last = mla(x[:, 8:], ctx, cache=cache)  # autograd: the cached latents are concatenated, not written
    cache.commit(ctx.k_seq, 4)
    assert last.requires_grad
    torch.testing.assert_close(torch.cat([*outs, last.detach()], dim=1), want, rtol=1e-12, atol=1e-12)


# ---- refusals (their messages: tests/reliability/cases_mla.py) -------------------------------------
def test_a_cache_without_a_latent_slot_is_refused():
    mla = small_mla("auto")
    x = x_of(1, 4)[..., :32]
    with pytest.raises(ValueError, match=r"cache layer 0 is not a LatentCache"):
        mla(x, SequenceInfo.from_offset(1, 4), cache=KVCache(1))
    attn = posenc.Attention(32, 4)
    with pytest.raises(ValueError, match=r"cache layer 0 holds latents \(B, T, R\)"):
        attn(x.float(), SequenceInfo.from_offset(1, 4), cache=KVCache(1, latent_layers=[0]))


# ---- in posenc's Transformer -------------------------------------------------------------------------
MLA_SIZES = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, q_lora_rank=12)


def mla_model(**kw) -> posenc.Transformer:
    torch.manual_seed(0)
    cfg = posenc.ModelConfig(vocab_size=50, d_model=32, n_head=4, n_layer=3, mla=MLA_SIZES, **kw)
    return posenc.Transformer(cfg).double().eval()


def full_and_decoded(model: posenc.Transformer, ids: torch.Tensor, prompt: int):
    """The model's logits for ``ids`` in one forward, and through its cache (the first ``prompt``
    tokens, then one token a step), and the cache."""
    with torch.no_grad():
        want = model(ids)
        cache = model.new_cache()
        got = [model(ids[:, :prompt], cache=cache)]
        got += [model(ids[:, t:t + 1], cache=cache) for t in range(prompt, ids.shape[1])]
    return want, torch.cat(got, 1), cache


def test_a_model_of_mla_layers_decodes_as_its_full_forward():
    model = mla_model(encoding={"name": "rope", "layout": "interleaved", "scaling": "yarn", "factor": 4.0,
                                "original_max_position_embeddings": 8, "mscale": 1.0, "mscale_all_dim": 1.0})
    assert all(isinstance(b.attn, MultiHeadLatentAttention) for b in model.blocks)
    assert model.encodings[0].rotary_dim == 8 and softmax_mscale(model.encodings[0]) > 1
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    want, got, cache = full_and_decoded(model, ids, 9)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert all(isinstance(s, LatentCache) and s.latent.shape == (2, 16, 16) and s.k_pe.shape == (2, 16, 8)
               for s in cache.layers)


def test_generate_with_the_latent_cache_is_greedy_decoding_of_the_full_forward():
    model = mla_model()
    prompt = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    out = model.generate(prompt, max_new_tokens=6)
    with torch.no_grad():
        want = prompt
        for _ in range(6):
            want = torch.cat([want, model(want)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, want)


def test_a_hybrid_of_mla_layers_decodes_as_its_full_forward():
    """NoPE and RoPE layers, one of them a sliding window, all of them latent attention."""
    from posenc.model_config import LayerSpec

    model = mla_model(layer_pattern=(LayerSpec("rope", "sliding", 4), LayerSpec(None)))
    ids = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(3))
    want, got, _ = full_and_decoded(model, ids, 5)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_model_config_round_trips_its_mla_sizes():
    cfg = posenc.ModelConfig(d_model=32, n_head=4, mla=MLA_SIZES)
    assert cfg.mla == MLAConfig(d_model=32, num_heads=4, **MLA_SIZES)
    assert posenc.ModelConfig(**cfg.to_dict()) == cfg
