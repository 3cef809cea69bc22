"""p-RoPE (``scaling="proportional"``): frequencies and rotation equal transformers'
``rope_type="proportional"``; a slow pair-by-pair loop; the rotated part stays relative."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.rotary import SCALINGS, rope_frequencies

F64 = torch.float64
CASES = [(32, 0.25, 1.0, 10000.0), (64, 0.3, 1.0, 1e6), (256, 0.25, 1.0, 1e6), (16, 1.0, 4.0, 10000.0),
         (16, 0.0, 1.0, 10000.0), (48, 0.5, 2.0, 500000.0)]


def _hf_config(head_dim: int, p: float, factor: float, base: float):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                    rope_parameters={"rope_type": "proportional", "partial_rotary_factor": p,
                                                     "rope_theta": base, "factor": factor})


@pytest.mark.parametrize("head_dim,p,factor,base", CASES)
def test_frequencies_equal_transformers(head_dim, p, factor, base):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    want, want_af = ROPE_INIT_FUNCTIONS["proportional"](_hf_config(head_dim, p, factor, base), "cpu")
    got, af = rope_frequencies("proportional", head_dim, base, proportion=p, factor=factor)
    assert af == want_af == 1.0
    assert torch.equal(got == 0, want == 0)  # the same pairs stop rotating
    torch.testing.assert_close(got, want.to(F64), atol=0, rtol=1e-6)  # transformers: float32


@pytest.mark.parametrize("head_dim,p,factor,base", CASES[:3])
def test_rotation_equals_transformers(head_dim, p, factor, base):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inv, _ = ROPE_INIT_FUNCTIONS["proportional"](_hf_config(head_dim, p, factor, base), "cpu")
    pos = torch.tensor([[0, 1, 5, 77, 1000]])
    freqs = pos[..., None].float() * inv  # (1, T, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 5, head_dim), torch.randn(1, 2, 5, head_dim)
    want_q, want_k = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    rope = posenc.build("rope", d_model=2 * head_dim, num_heads=2, base=base, scaling="proportional", proportion=p,
                        factor=factor)
    got_q, got_k = rope.rotate(q, k, pos, pos)
    torch.testing.assert_close(got_q, want_q, atol=2e-4, rtol=1e-4)  # float32 angles at position 1000
    torch.testing.assert_close(got_k, want_k, atol=2e-4, rtol=1e-4)


def test_rotation_equals_slow_pairwise_loop():
    d, p, base = 16, 0.5, 10000.0
    rope = posenc.build("rope", d_model=32, num_heads=2, scaling="proportional", proportion=p)
    torch.manual_seed(1)
    x = torch.randn(1, 1, 3, d, dtype=F64)
    pos = torch.tensor([[0, 3, 250]])
    got, _ = rope.rotate(x, x[:, :, :1], pos, pos[:, :1])
    want = x.clone()
    for i in range(int(p * d // 2)):  # the kept pairs; the rest stay
        theta = base ** (-2 * i / d)
        for t in range(3):
            a = float(pos[0, t]) * theta
            x1, x2 = x[0, 0, t, i], x[0, 0, t, i + d // 2]
            want[0, 0, t, i] = x1 * math.cos(a) - x2 * math.sin(a)
            want[0, 0, t, i + d // 2] = x1 * math.sin(a) + x2 * math.cos(a)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_logits_stay_relative_and_the_unrotated_part_ignores_position():
    rope = posenc.build("rope", d_model=32, num_heads=1, scaling="proportional", proportion=0.25)
    torch.manual_seed(2)
    q, k = torch.randn(1, 1, 1, 32, dtype=F64), torch.randn(1, 1, 1, 32, dtype=F64)
    kept = int(0.25 * 32 // 2)
    nope = [c for c in range(32) if c % 16 >= kept]

    def logit(m: int, n: int) -> tuple[float, float]:
        rq, rk = rope.rotate(q, k, torch.tensor([[m]]), torch.tensor([[n]]))
        prod = (rq * rk)[0, 0, 0]
        return float(prod.sum()), float(prod[nope].sum())

    (a, na), (b, nb), (_, nc) = logit(7, 2), logit(4007, 4002), logit(9000, 0)
    assert a == pytest.approx(b, abs=1e-4)
    assert na == pytest.approx(nb, abs=1e-12) and na == pytest.approx(nc, abs=1e-12)


def test_entry_is_labelled_and_has_no_training_free_rule():
    entry = SCALINGS["proportional"]
    assert entry.label == "p-RoPE" and "Barbero" in entry.source and entry.extension is None
    # transformers' spelling: p is its rope dict's partial_rotary_factor (tests/test_rotary_hf_proportional.py)
    rope = posenc.build("rope", d_model=32, num_heads=2, scaling="proportional", proportion=0.25)
    assert rope.to_hf()["rope_parameters"] == {"rope_type": "proportional", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.25, "factor": 1.0}


@pytest.mark.parametrize("key,value,match", [
    ("proportion", 1.5, r"^proportion must be in \[0.0, 1.0\], got 1.5$"),
    ("proportion", -0.1, r"^proportion must be in \[0.0, 1.0\], got -0.1$"),
    ("factor", 0.5, r"^factor must be in \[1.0, inf\), got 0.5$"),
    ("factor", float("nan"), r"^factor must be finite"),
])
def test_config_refuses_bad_values_by_name(key, value, match):
    with pytest.raises(ValueError, match=match):
        posenc.build("rope", d_model=32, num_heads=2, scaling="proportional", **{key: value})
