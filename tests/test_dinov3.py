"""rope_dinov3 (DINOv3's 2-D RoPE) against transformers' DINOv3ViT (its rope module, its
rotation, its coordinate augmentation under the same generator), and the properties the
normalised coordinates give: relative within one grid, the grid's fraction across grids."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import SequenceInfo
from posenc.rotary.dinov3 import normalized_centres

transformers = pytest.importorskip("transformers")
from transformers.models.dinov3_vit import modeling_dinov3_vit as hf  # noqa: E402


def reference(H: int, W: int, D: int, heads: int = 2, base: float = 100.0, training: bool = False, **aug):
    """transformers' (cos, sin) (H W, D) for an H x W grid of 16-pixel patches."""
    cfg = transformers.DINOv3ViTConfig(hidden_size=D * heads, num_attention_heads=heads, patch_size=16,
                                       image_size=16 * max(H, W), rope_theta=base, pos_embed_shift=aug.get("shift"),
                                       pos_embed_jitter=aug.get("jitter"), pos_embed_rescale=aug.get("rescale"))
    mod = hf.DINOv3ViTRopePositionEmbedding(cfg).train(training)
    return mod(torch.zeros(1, 3, 16 * H, 16 * W))


def ours(H: int, W: int, D: int, heads: int = 2, training: bool = False, **kw):
    enc = posenc.build("rope_dinov3", d_model=D * heads, num_heads=heads, grid_height=H, grid_width=W, **kw)
    return enc.train(training)


@pytest.mark.parametrize("H,W,D", [(14, 14, 64), (5, 9, 32), (1, 7, 16)])
def test_cos_sin_equal_transformers(H, W, D):
    cos_ref, sin_ref = reference(H, W, D)
    cos, sin = ours(H, W, D).cos_sin(SequenceInfo.from_grid(H, W).axes)
    assert torch.allclose(torch.cat([cos, cos], -1)[0], cos_ref, atol=2e-6)  # half layout: the angles tiled
    assert torch.allclose(torch.cat([sin, sin], -1)[0], sin_ref, atol=2e-6)


def test_rotation_equals_transformers_apply_rotary_pos_emb():
    H, W, D = 6, 4, 32
    q, k = torch.randn(2, 2, H * W, D), torch.randn(2, 2, H * W, D)
    cos, sin = reference(H, W, D)
    want = hf.apply_rotary_pos_emb(q, k, cos, sin)
    pos = SequenceInfo.from_grid(H, W, batch=2).axes
    got = ours(H, W, D).rotate(q, k, pos, pos)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-5)


@pytest.mark.parametrize("aug", [dict(shift=0.3), dict(jitter=1.5), dict(rescale=2.0),
                                 dict(shift=0.2, jitter=1.3, rescale=2.0)])
def test_training_augmentation_draws_as_transformers(aug):
    H, W, D = 5, 7, 32
    torch.manual_seed(7)
    cos_ref, sin_ref = reference(H, W, D, training=True, **aug)
    enc = ours(H, W, D, training=True, **aug)
    torch.manual_seed(7)
    tables = enc.prepare(SequenceInfo.from_grid(H, W).axes, SequenceInfo.from_grid(H, W).axes)
    cos, sin = tables.cos_q, tables.sin_q
    assert torch.allclose(torch.cat([cos, cos], -1)[0], cos_ref, atol=2e-6)
    assert torch.allclose(torch.cat([sin, sin], -1)[0], sin_ref, atol=2e-6)
    enc.eval()  # evaluation draws nothing: the plain centres
    torch.manual_seed(7)
    plain = enc.prepare(SequenceInfo.from_grid(H, W).axes, None)
    assert torch.allclose(torch.cat([plain.cos_q] * 2, -1)[0], reference(H, W, D)[0], atol=2e-6)


def test_one_draw_for_q_and_k():
    """In training, q and k of one call turn by the same draw: q·k stays a function of the
    relative offset (a drawn shift cancels, the same scale applies to both)."""
    H, W, D = 4, 4, 16
    enc = ours(H, W, D, training=True, shift=0.5, jitter=2.0, rescale=2.0)
    pos = SequenceInfo.from_grid(H, W).axes
    q = torch.randn(1, 2, 1, D).expand(1, 2, H * W, D).contiguous()  # one vector at every patch
    k = q.clone()
    rq, rk = enc.rotate(q, k, pos, pos)
    logits = rq @ rk.transpose(-1, -2)  # (1, 2, T, T): the diagonal is |q|^2 for any draw
    assert torch.allclose(logits.diagonal(dim1=-2, dim2=-1), (q * q).sum(-1), rtol=1e-5)


def test_logits_depend_on_the_fraction_of_the_grid():
    """One step on a grid of 8 equals two steps on a grid of 16: the normalised coordinate."""
    D = 32
    q, k = torch.randn(1, 1, 1, D), torch.randn(1, 1, 1, D)

    def logit(grid: int, dy: int) -> torch.Tensor:
        enc = ours(grid, grid, D, heads=1)
        qp = torch.tensor([[[dy]], [[0]]])  # (2, B, T): row dy, column 0
        kp = torch.tensor([[[0]], [[0]]])
        rq, rk = enc.rotate(q, k, qp, kp)
        return (rq * rk).sum()

    assert torch.allclose(logit(8, 1), logit(16, 2), atol=1e-5)
    assert not torch.allclose(logit(8, 1), logit(16, 1), atol=1e-3)


def test_centres_and_bad_configs():
    c = normalized_centres(torch.tensor([[[0, 3]], [[0, 1]]]), 4, 2)  # rows of 4, columns of 2
    assert torch.allclose(c[:, 0], torch.tensor([[-0.75, 0.75], [-0.5, 0.5]], dtype=torch.float64))
    for kw, msg in [(dict(shift=0.0), "shift must be a number > 0"), (dict(jitter=1.0), "jitter must be a number > 1"),
                    (dict(rescale=0.5), "rescale must be a number > 1"), (dict(grid_height=0), "grid_height")]:
        with pytest.raises(ValueError, match=msg):
            posenc.build("rope_dinov3", d_model=64, num_heads=2, **kw)
    assert math.isclose(ours(4, 4, 16).freqs[0, 0].item(), 2 * math.pi)  # one turn per unit at the fastest pair
