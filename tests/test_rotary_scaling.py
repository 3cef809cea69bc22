"""The scaling registry: properties from each paper, purity, set_scaling, and loud errors.

Properties (derived by hand from the formulas in the entries' docstrings in posenc/rotary/scaling/):
* linear: RoPE with theta/s at position m equals plain RoPE at position m/s;
* NTK: theta_0 unchanged, theta_(d/2-1) divided by s exactly;
* dynamic NTK: equal to default up to the trained length; beyond it equal to static NTK
  with s' = s n / L - (s - 1); a pure function of n;
* YaRN: high-frequency pairs (> beta_fast turns over L) unchanged, low (< beta_slow) divided
  by s; attention factor 0.1 ln s + 1 applied once to each of q and k;
* llama3: short wavelengths kept, long divided by s;
* longrope: short factors up to L, long beyond.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import SequenceInfo
from posenc.rotary import ROPE_SCALINGS, SCALING_CONFIGS, SCALINGS, base_inv_freq, rope_frequencies
from helpers import tiny_model

# Each type as its registry entry sets it for 4x a trained length of 64 (LongRoPE: the ramp its
# entry illustrates with), in a tiny model (head_dim 8, T ~ 16 < 64: length-dependent types
# stay within L, so a cached decode sees the frequencies of the full forward). A newly
# registered scaling is tested here with no edit.
def tiny_params(rope_type: str) -> dict:
    return SCALINGS[rope_type].at_factor(4.0, 64, rotary_dim=8, illustrate=True)


@pytest.mark.parametrize("rope_type", list(ROPE_SCALINGS))
def test_every_type_has_tiny_params_that_change_the_frequencies(rope_type):
    inv, _ = rope_frequencies(rope_type, 8, 10000.0, seq_len=4 * 64, **tiny_params(rope_type))
    if SCALINGS[rope_type].params:
        assert not torch.equal(inv, base_inv_freq(8, 10000.0))


@pytest.mark.parametrize("rope_type", list(ROPE_SCALINGS))
def test_invariances_hold_for_every_scaling(rope_type):
    # The registry's invariances (KV cache, packing, padding, eager == SDPA) per scaling type.
    model = tiny_model("rope", n_kv_head=2, encoding_config={"scaling": rope_type, **tiny_params(rope_type)})
    tokens = torch.randint(0, 64, (2, 13))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        inc = torch.cat([model(tokens[:, :6], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(6, 13)], 1)
        torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)
        seqs = [torch.randint(0, 64, (1, n)) for n in (5, 7)]
        packed = model(torch.cat(seqs, 1), SequenceInfo.from_cu_seqlens([0, 5, 12]))
        torch.testing.assert_close(packed, torch.cat([model(s) for s in seqs], 1), atol=1e-5, rtol=1e-5)
        a, b = torch.randint(0, 64, (1, 9)), torch.randint(0, 64, (1, 5))
        mask = torch.tensor([[1] * 9, [0] * 4 + [1] * 5], dtype=torch.bool)
        out = model(torch.cat([a, torch.cat([torch.zeros(1, 4, dtype=torch.long), b], 1)]), SequenceInfo.from_padding_mask(mask))
        torch.testing.assert_close(out[1:, 4:], model(b), atol=1e-5, rtol=1e-5)
    slow = tiny_model("rope", impl="eager", n_kv_head=2, encoding_config={"scaling": rope_type, **tiny_params(rope_type)})
    with torch.no_grad():
        torch.testing.assert_close(slow(tokens), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rope_type", list(ROPE_SCALINGS))
def test_functions_are_pure(rope_type):
    inv = base_inv_freq(8, 10000.0)
    cfg = SCALING_CONFIGS[rope_type](**tiny_params(rope_type))
    fn = ROPE_SCALINGS[rope_type]
    first = fn(inv, cfg, base=10000.0, seq_len=10)
    fn(inv, cfg, base=10000.0, seq_len=100000)
    again = fn(inv, cfg, base=10000.0, seq_len=10)
    assert torch.equal(first[0], again[0]) and first[1] == again[1]
    assert torch.equal(inv, base_inv_freq(8, 10000.0))  # input untouched
    assert first[0].dtype == torch.float64


def test_linear_equals_default_at_divided_positions():
    s = 4.0
    lin = posenc.build("rope", d_model=32, num_heads=2, scaling="linear", factor=s)
    plain = posenc.build("rope", d_model=32, num_heads=2)
    pos = torch.tensor([[0, 4, 8, 400, 4096]])
    cl, sl = lin.cos_sin(pos)
    # plain RoPE at the real position m / s (computed by hand, float64)
    ang = (pos.double() / s)[..., None] * plain.inv_freq
    torch.testing.assert_close(cl.double(), ang.cos(), atol=1e-7, rtol=0)
    torch.testing.assert_close(sl.double(), ang.sin(), atol=1e-7, rtol=0)


@pytest.mark.parametrize("d", [8, 64, 128])
@pytest.mark.parametrize("s", [2.0, 8.0])
def test_ntk_keeps_highest_frequency_and_divides_lowest(d, s):
    base = 10000.0
    inv, af = rope_frequencies("ntk", d, base, factor=s)
    ref = (base * s ** (d / (d - 2))) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # base' by hand
    torch.testing.assert_close(inv, ref, rtol=1e-12, atol=0)
    assert inv[0] == 1.0 and af == 1.0
    assert float(inv[-1]) == pytest.approx(float(base_inv_freq(d, base)[-1]) / s, rel=1e-12)


def test_dynamic_is_default_up_to_trained_length_and_ntk_beyond():
    L, s, d = 256, 4.0, 32
    plain = base_inv_freq(d, 10000.0)
    for n in (None, 1, 100, L):
        inv, _ = rope_frequencies("dynamic", d, 10000.0, seq_len=n, factor=s, original_max_position_embeddings=L)
        assert torch.equal(inv, plain)
    n = 3 * L
    inv, _ = rope_frequencies("dynamic", d, 10000.0, seq_len=n, factor=s, original_max_position_embeddings=L)
    ntk, _ = rope_frequencies("ntk", d, 10000.0, factor=s * n / L - (s - 1))
    torch.testing.assert_close(inv, ntk, rtol=1e-14, atol=0)


def test_dynamic_module_has_no_hidden_state():
    # A short input after a long one gives bitwise the output it gave before the long one
    # (transformers' dynamic RoPE keeps the long frequencies until a reset).
    rope = posenc.build("rope", d_model=32, num_heads=2, scaling="dynamic", factor=4.0, original_max_position_embeddings=16)
    q, k = torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16)
    short = torch.arange(10)[None]
    before = rope.rotate(q, k, short, short)
    rope.rotate(q, k, short + 500, short + 500)
    after = rope.rotate(q, k, short, short)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    plain = posenc.build("rope", d_model=32, num_heads=2).rotate(q, k, short, short)
    assert torch.equal(before[0], plain[0])


def test_yarn_ramp_and_attention_factor():
    d, base, L, s = 64, 10000.0, 2048, 8.0
    inv, af = rope_frequencies("yarn", d, base, factor=s, original_max_position_embeddings=L)
    plain = base_inv_freq(d, base)
    turns = L * plain / (2 * math.pi)  # rotations of each pair over the trained length
    fast, slow = turns > 32 * 1.5, turns < 1 / 1.5  # margin: the ramp is truncated to whole pairs
    torch.testing.assert_close(inv[fast], plain[fast], rtol=1e-15, atol=0)
    torch.testing.assert_close(inv[slow], plain[slow] / s, rtol=1e-15, atol=0)
    assert bool((inv <= plain).all() and (inv >= plain / s - 1e-18).all())
    assert af == pytest.approx(0.1 * math.log(s) + 1)


def test_yarn_attention_factor_applied_once_to_q_and_k():
    # Logits scale by af^2 = (0.1 ln s + 1)^2 = 1/t (YaRN eq. 22): once on q, once on k.
    rope = posenc.build("rope", d_model=16, num_heads=1, scaling="yarn", factor=16.0, original_max_position_embeddings=8)
    af = 0.1 * math.log(16.0) + 1
    q = torch.randn(1, 1, 5, 16, dtype=torch.float64)
    pos = torch.zeros(1, 5, dtype=torch.long)  # angle 0: rotation is the identity
    rq, rk = rope.rotate(q, q, pos, pos)
    torch.testing.assert_close(rq, q * af, rtol=1e-6, atol=0)
    torch.testing.assert_close(rk, q * af, rtol=1e-6, atol=0)


def test_llama3_keeps_short_and_divides_long_wavelengths():
    d, L, s = 128, 8192, 8.0
    inv, af = rope_frequencies("llama3", d, 500000.0, factor=s, low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_position_embeddings=L)
    plain = base_inv_freq(d, 500000.0)
    wavelen = 2 * math.pi / plain
    assert torch.equal(inv[wavelen < L / 4], plain[wavelen < L / 4])
    torch.testing.assert_close(inv[wavelen > L], plain[wavelen > L] / s, rtol=1e-15, atol=0)
    mid = (wavelen >= L / 4) & (wavelen <= L)
    assert bool(((inv[mid] <= plain[mid]) & (inv[mid] >= plain[mid] / s)).all())
    assert af == 1.0


def test_longrope_picks_factors_by_length():
    p = {"short_factor": (1.0, 1.5, 2.0, 3.0), "long_factor": (1.0, 2.0, 4.0, 8.0),
         "original_max_position_embeddings": 64, "factor": 4.0}
    plain = base_inv_freq(8, 10000.0)
    short, af = rope_frequencies("longrope", 8, 10000.0, seq_len=64, **p)
    long, _ = rope_frequencies("longrope", 8, 10000.0, seq_len=65, **p)
    torch.testing.assert_close(short, plain / torch.tensor(p["short_factor"], dtype=torch.float64))
    torch.testing.assert_close(long, plain / torch.tensor(p["long_factor"], dtype=torch.float64))
    assert af == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(64)))


def test_set_scaling_swaps_in_place():
    torch.manual_seed(0)
    model = tiny_model("rope")
    tokens = torch.randint(0, 64, (1, 20))
    with torch.no_grad():
        plain = model(tokens)
        rope = model.encodings[0] if hasattr(model, "encodings") else None
        for enc in {id(m): m for m in model.modules() if isinstance(m, posenc.rotary.RotaryEmbedding)}.values():
            enc.set_scaling("linear", factor=2.0)
        scaled = model(tokens)
        fresh = tiny_model("rope", encoding_config={"scaling": "linear", "factor": 2.0})
        torch.testing.assert_close(scaled, fresh(tokens))
        assert not torch.allclose(scaled, plain)
        for enc in {id(m): m for m in model.modules() if isinstance(m, posenc.rotary.RotaryEmbedding)}.values():
            enc.set_scaling("default")
        assert torch.equal(model(tokens), plain)
    assert rope is not None
    with pytest.raises(ValueError, match="factor must be"):
        rope.set_scaling("linear", factor=0.5)
    with pytest.raises(ValueError, match="not a parameter of rope type 'linear'"):
        rope.set_scaling("linear", factor=2.0, beta_fast=3.0)


# ---- bad inputs -------------------------------------------------------------------------
BAD = [
    (dict(rotary_dim=7), ValueError, "rotary_dim must be even"),
    (dict(rotary_dim=16), ValueError, r"rotary_dim must be <= head_dim \(8\)"),
    (dict(base=0.0), ValueError, "base must be > 0"),
    (dict(base=-10000.0), ValueError, "base must be > 0"),
    (dict(base=1.0), ValueError, "base must be != 1"),
    (dict(layout="neox"), ValueError, "layout must be one of"),
    (dict(scaling="rope2"), ValueError, "scaling must be one of"),
    (dict(scaling="linear", factor=0.5), ValueError, r"factor must be in \[1.0, inf\), got 0.5"),
    (dict(scaling="ntk", factor=0.9), ValueError, "factor must be in"),
    (dict(scaling="linear"), ValueError, "factor is required"),
    (dict(scaling="longrope", short_factor=(1.0,) * 4, long_factor=(1.0,) * 4, original_max_position_embeddings=64),
     ValueError, "factor is required"),
    (dict(scaling="default", factor=2.0), ValueError, "factor not a parameter of rope type 'default'"),
    (dict(scaling="yarn", factor=2.0), ValueError, "original_max_position_embeddings is required"),
    (dict(scaling="dynamic", factor=2.0), ValueError, "original_max_position_embeddings is required"),
    (dict(scaling="llama3", factor=8.0), ValueError, "original_max_position_embeddings is required"),
    (dict(scaling="yarn", factor=2.0, original_max_position_embeddings=64, beta_fast=1.0, beta_slow=2.0),
     ValueError, "beta_fast must be > beta_slow"),
    (dict(scaling="llama3", factor=8.0, low_freq_factor=5.0, high_freq_factor=4.0, original_max_position_embeddings=64),
     ValueError, "low_freq_factor must be <= high_freq_factor"),
    (dict(scaling="longrope", short_factor=(1.0,) * 3, long_factor=(1.0,) * 4, original_max_position_embeddings=64,
          factor=2.0),
     ValueError, r"short_factor must have rotary_dim/2 = 4 entries .*got 3"),
    (dict(scaling="longrope", short_factor=(1.0,) * 4, long_factor=(1.0,) * 5, original_max_position_embeddings=64,
          factor=2.0),
     ValueError, r"long_factor must have rotary_dim/2 = 4 entries .*got 5"),
    (dict(scaling="longrope", short_factor=(1.0, 0.0, 1.0, 1.0), long_factor=(1.0,) * 4, original_max_position_embeddings=64),
     ValueError, r"short_factor\[1\] must be > 0"),
    (dict(scaling="longrope", long_factor=(1.0,) * 4, original_max_position_embeddings=64),
     ValueError, "short_factor must be a non-empty list"),
    (dict(scaling="yarn", factor=2.0, original_max_position_embeddings=0), ValueError,
     "original_max_position_embeddings must be >= 1"),
    (dict(kernel="cuda"), ValueError, "kernel must be one of"),
]


@pytest.mark.parametrize("name", ["rope", "xpos"])
@pytest.mark.parametrize("config,exc,match", BAD)
def test_bad_inputs_are_clear_errors(name, config, exc, match):
    with pytest.raises(exc, match=match):
        posenc.build(name, d_model=32, num_heads=4, **config)


def test_bad_positions_are_clear_errors():
    rope = posenc.build("rope", d_model=32, num_heads=4)
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        rope.rotate(q, q, torch.tensor([[0, -1, 2]]), torch.tensor([[0, -1, 2]]))
    with pytest.raises(TypeError, match="integers"):
        rope.cos_sin(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="NTK scaling needs rotary_dim >= 4"):
        rope_frequencies("ntk", 2, 10000.0, factor=2.0)
    with pytest.raises(ValueError, match=r"low_freq_factor not a parameter of rope type 'linear' \(it takes: factor\)"):
        rope_frequencies("linear", 8, 10000.0, factor=2.0, low_freq_factor=1.0)


def test_cos_sin_memo_is_keyed_on_positions_versions_and_scaling():
    """The per-forward memo must never serve stale tables: a new positions tensor, an in-place
    edit of the positions, or a new scaling all recompute (checked against a fresh module)."""
    import posenc

    enc = posenc.build("rope", d_model=32, num_heads=2)
    fresh = lambda: posenc.build("rope", d_model=32, num_heads=2)  # noqa: E731
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    pos = torch.arange(5)[None]
    a = enc.rotate(q, k, pos, pos)
    assert enc.rotate(q, k, pos, pos)[0] is not None
    pos.add_(3)  # in place: the version changes
    torch.testing.assert_close(enc.rotate(q, k, pos, pos)[0], fresh().rotate(q, k, pos, pos)[0], rtol=0, atol=0)
    assert not torch.equal(enc.rotate(q, k, pos, pos)[0], a[0])
    enc.set_scaling("linear", factor=2.0)
    ref = fresh()
    ref.set_scaling("linear", factor=2.0)
    torch.testing.assert_close(enc.rotate(q, k, pos, pos)[0], ref.rotate(q, k, pos, pos)[0], rtol=0, atol=0)


def test_llama3_with_equal_factors_is_a_step_as_transformers_reads_llama4_scout():
    """Llama 4 Scout publishes low_freq_factor == high_freq_factor == 1 (factor 16, L 8192):
    transformers reads it (no smooth band); so does posenc, with transformers' frequencies."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from posenc.rotary import from_hf

    scaling = {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
               "original_max_position_embeddings": 8192}
    cfg = dict(model_type="llama", hidden_size=1024, num_attention_heads=8, rope_theta=500000.0,
               max_position_embeddings=10485760, rope_scaling=scaling)
    ours = from_hf(cfg)
    theirs, factor = ROPE_INIT_FUNCTIONS["llama3"](LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}),
                                                   "cpu")
    assert torch.allclose(ours.inv_freq.float(), theirs.float(), rtol=1e-6, atol=0) and factor == 1.0
    step = 2 * math.pi / ours._base_inv_freq > 8192  # wavelengths past L are divided by 16, the rest kept
    assert torch.allclose(ours.inv_freq, torch.where(step, ours._base_inv_freq / 16, ours._base_inv_freq))
