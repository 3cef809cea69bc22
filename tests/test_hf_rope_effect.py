"""posenc.hf.rope_effect (``posenc rope --model``): the closed-form logit of a (q, k) pair at a
distance against rotating both and taking the dot product, and the per-engine effect on a tiny
checkpoint's real q/k."""

from __future__ import annotations

import json

import pytest
import torch

from posenc.cli import main
from posenc.engines import EngineRope
from posenc.hf.rope_effect import distance_grid, logit_effects, pair_logits

transformers = pytest.importorskip("transformers")


def rotate_half(x: torch.Tensor, pos: int, inv: torch.Tensor, a: float) -> torch.Tensor:
    """x (n, D) rotated to position ``pos`` (half layout, channels past 2 len(inv) unchanged)."""
    half = inv.numel()
    ang = pos * inv
    c, s = ang.cos() * a, ang.sin() * a
    x1, x2, rest = x[:, :half], x[:, half:2 * half], x[:, 2 * half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


@pytest.mark.parametrize("rotary", [16, 10])  # full and partial rotary
def test_pair_logits_equal_rotating_then_the_dot_product(rotary):
    torch.manual_seed(0)
    q, k = torch.randn(5, 16, dtype=torch.float64), torch.randn(5, 16, dtype=torch.float64)
    inv = 1000.0 ** (-torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
    rope = EngineRope("x", inv, attention_factor=1.3, softmax_scale=0.7)
    distances = torch.tensor([0, 1, 7, 300])
    got = pair_logits(q, k, rope, 1024, distances, scale=0.25)
    for j, d in enumerate(distances.tolist()):
        m = 40 + d  # the query d after the key: only the difference matters
        want = 0.25 * 0.7 * (rotate_half(q, m, inv, 1.3) * rotate_half(k, 40, inv, 1.3)).sum(-1)
        # the pass-through channels carry no attention factor (the reference leaves them unscaled too)
        assert torch.allclose(got[:, j], want, atol=1e-10)


def test_distance_grid_reaches_the_length():
    g = distance_grid(16384)
    assert g[0] == 0 and g[1] == 1 and g[-1] == 16383 and torch.equal(g, torch.unique(g))


def test_an_identical_reading_changes_nothing_and_another_base_does():
    torch.manual_seed(1)
    qk = {0: (torch.randn(4, 12, 16), torch.randn(2, 12, 16))}
    inv = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    ref = [EngineRope("transformers", inv)]
    readings = {"transformers": ref, "same": [EngineRope("same", inv.clone())],
                "base": [EngineRope("base", 500.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16))],
                "scaled": [EngineRope("scaled", inv, softmax_scale=2.0)]}
    effects = {e.engine: e for e in logit_effects(qk, {0: 0.25}, readings, 4096, pairs=64)}
    assert effects["same"].max_abs == 0.0
    assert effects["base"].max_abs > 0.1
    # doubling the softmax scale doubles every logit: the change is the reference's own size
    assert effects["scaled"].mean_abs == pytest.approx(effects["scaled"].reference_mean_abs, rel=1e-12)


def test_cli_model_on_a_checkpoint_and_refused_on_a_bare_config(tmp_path, capsys):
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "ckpt")
    assert main(["rope", str(tmp_path / "ckpt"), "--length", "256", "--model", "--engines", "vllm", "--json"]) == 0
    effects = json.loads(capsys.readouterr().out)["model_effect"]
    (vllm,) = effects  # vLLM's "dynamic" is static: at 256 tokens its logits differ from transformers' dynamic ones
    assert vllm["engine"] == "vllm" and vllm["max_abs"] > 0
    assert main(["rope", str(tmp_path / "ckpt" / "config.json"), "--model"]) == 2
    err = capsys.readouterr().err
    assert "--model:" in err and "holds no weights" in err
