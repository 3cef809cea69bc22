"""rope_axial and rope_mixed (Heo et al. 2024): against rotary-embedding-torch's axial
frequencies on the same inputs, against a slow loop over the paper's complex formula (the
authors' ``compute_axial_cis`` / ``compute_mixed_cis`` written out token by token), relative in
2-D (q·k depends on (Δy, Δx) only), raster positions equal to the grid's axes, learned
frequencies that train, grouped-query keys, bad configs refused by name."""

from __future__ import annotations

import cmath
import math

import pytest
import torch

import posenc
from posenc import SequenceInfo
from posenc.model import Transformer
from posenc.model_config import ModelConfig
from posenc.rotary.axial import AxialRope, MixedRope

F64 = torch.float64
ENCODINGS = ["rope_axial", "rope_mixed"]


def _qk(B=1, H=2, T=12, D=16, Hkv=None, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv or H, T, D, generator=g, dtype=dtype))


def _build(name, **config):
    torch.manual_seed(0)
    return posenc.build(name, d_model=32, num_heads=2, **config)


def _logits(enc, q, k, q_axes, k_axes):
    rq, _ = enc.rotate(q, q[:, :, :0], q_axes, q_axes[..., :0])
    rk, _ = enc.rotate(k, k[:, :, :0], k_axes, k_axes[..., :0])
    return torch.einsum("bhid,bhjd->bhij", rq, rk)


# ---- the peer: rotary-embedding-torch -----------------------------------------------------
@pytest.mark.parametrize("grid", [(3, 4), (5, 2)])
def test_axial_equals_rotary_embedding_torch_get_axial_freqs(grid):
    """rotary-embedding-torch's ``RotaryEmbedding(dim=D/2, theta=base).get_axial_freqs(H, W)``
    with its ``apply_rotary_emb`` (interleaved pairs, rows first) on an (H, W, D) patch grid.
    Its ``freqs_for='pixel'`` (linear bands at positions in [-1, 1]) is another construction,
    not RoPE-Axial: positions here are integers."""
    ret = pytest.importorskip("rotary_embedding_torch")
    Hg, Wg = grid
    D, base = 16, 100.0
    peer = ret.RotaryEmbedding(dim=D // 2, theta=base)
    freqs = peer.get_axial_freqs(Hg, Wg)  # (Hg, Wg, D)
    x = torch.randn(Hg, Wg, D, generator=torch.Generator().manual_seed(0))
    want = ret.apply_rotary_emb(freqs, x[None])[0]  # (Hg, Wg, D); a 4-D input: a 3-D one is read as (.., seq, D)
    enc = posenc.build("rope_axial", d_model=2 * D, num_heads=2, base=base)
    seq = SequenceInfo.from_grid(Hg, Wg)
    got, _ = enc.rotate(x.reshape(1, 1, Hg * Wg, D), x.new_empty(1, 1, 0, D), seq.axes, seq.axes[..., :0])
    torch.testing.assert_close(got.reshape(Hg, Wg, D), want, atol=1e-5, rtol=1e-5)


# ---- the formula: the authors' complex form, token by token --------------------------------
def _slow_rotate(x: torch.Tensor, axes: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs as complex numbers z_j = x_2j + i x_2j+1, each times
    e^{i (F[0, h, j] y + F[1, h, j] x)} (``compute_mixed_cis``; the axial F is 0 across axes)."""
    B, H, T, D = x.shape
    out = torch.empty_like(x)
    for b in range(B):
        for h in range(H):
            f = freqs[:, h if freqs.dim() == 3 else None].reshape(2, -1)
            for t in range(T):
                y, xx = int(axes[0, b, t]), int(axes[1, b, t])
                for j in range(D // 2):
                    z = complex(x[b, h, t, 2 * j], x[b, h, t, 2 * j + 1])
                    z *= cmath.exp(1j * (float(f[0, j]) * y + float(f[1, j]) * xx))
                    out[b, h, t, 2 * j], out[b, h, t, 2 * j + 1] = z.real, z.imag
    return out


def test_axial_frequencies_are_the_papers():
    """compute_axial_cis: theta_k = 100^(-4k/D) for k < D/4, rows on the first D/4 pairs."""
    enc = _build("rope_axial")
    D = 16
    theta = [100.0 ** (-4 * k / D) for k in range(D // 4)]
    assert enc.freqs.tolist() == [theta + [0.0] * 4, [0.0] * 4 + theta]


@pytest.mark.parametrize("name", ENCODINGS)
def test_rotation_equals_slow_loop(name):
    enc = _build(name).to(F64)
    seq = SequenceInfo.from_grid(3, 5, batch=2)
    axes = seq.axes.clone()
    axes[:, 1] += torch.tensor([2, 7])[:, None]  # another grid offset in row 1
    q, k = _qk(B=2, T=15)
    got_q, got_k = enc.rotate(q, k, axes, axes)
    freqs = enc.freqs.detach().double()
    torch.testing.assert_close(got_q, _slow_rotate(q, axes, freqs), atol=1e-6, rtol=0)  # float32 cos/sin
    torch.testing.assert_close(got_k, _slow_rotate(k, axes, freqs), atol=1e-6, rtol=0)


def test_mixed_initialisation_is_init_random_2d_freqs():
    """Per head: |F[:, h, j]| = 10^(-4k/D) (j = k and k + D/4), the first D/4 pairs along one
    direction phi_h and the others along phi_h + pi/2 (the paper's ``init_random_2d_freqs``)."""
    enc = posenc.build("rope_mixed", d_model=64, num_heads=4)
    F = enc.freqs.detach().double()  # (2, H, P)
    q = 16 // 4
    mag = torch.tensor([10.0 ** (-4 * k / 16) for k in range(q)], dtype=F64)
    torch.testing.assert_close(F.norm(dim=0), torch.cat([mag, mag]).expand(4, -1), atol=1e-6, rtol=1e-6)
    direction = torch.atan2(F[0], F[1])  # (H, P): angle of (x, y) = (cos, sin)
    first, second = direction[:, :q], direction[:, q:]
    assert torch.allclose(first, first[:, :1].expand_as(first), atol=1e-5)
    turn = torch.remainder(second - first, 2 * math.pi)
    torch.testing.assert_close(turn, torch.full_like(turn, math.pi / 2), atol=1e-5, rtol=0)
    assert direction[:, 0].unique().numel() == 4  # a direction of its own per head


# ---- relativity in 2-D -------------------------------------------------------------------
@pytest.mark.parametrize("name", ENCODINGS)
def test_logits_depend_on_the_2d_offset_only(name):
    enc = _build(name).to(F64)
    seq = SequenceInfo.from_grid(4, 4)
    q, k = _qk(T=16)
    base = _logits(enc, q, k, seq.axes, seq.axes)
    for shift in ([3, 0], [0, 5], [7, 2]):
        moved = seq.axes + torch.tensor(shift)[:, None, None]
        torch.testing.assert_close(_logits(enc, q, k, moved, moved), base, atol=1e-5, rtol=1e-5)
    # Not a function of the raster distance: swapping rows and columns changes the logits.
    assert (_logits(enc, q, k, seq.axes.flip(0), seq.axes.flip(0)) - base).abs().max() > 1e-3


@pytest.mark.parametrize("name", ENCODINGS)
def test_raster_positions_equal_the_grids_axes(name):
    enc = _build(name, grid_width=5)
    seq = SequenceInfo.from_grid(3, 5)
    q, k = _qk(T=15, dtype=torch.float32)
    from_axes = enc.rotate(q, k, enc.position_ids(seq), enc.position_ids(seq))
    from_raster = enc.rotate(q, k, seq.positions, seq.positions)
    assert all(torch.equal(a, b) for a, b in zip(from_axes, from_raster))
    with pytest.raises(ValueError, match="reads 2 position axes"):
        enc.position_ids(seq.with_axes(torch.zeros(3, 1, 15, dtype=torch.long)))


# ---- learned frequencies, grouped-query keys, the model ------------------------------------
def test_mixed_frequencies_get_gradients_and_fixed_ones_do_not():
    enc = _build("rope_mixed")
    seq = SequenceInfo.from_grid(2, 3)
    q, k = _qk(T=6, dtype=torch.float32)
    rq, rk = enc.rotate(q, k, seq.axes, seq.axes)
    (rq * rk).sum().backward()
    assert enc.freqs.grad is not None and enc.freqs.grad.abs().sum() > 0
    fixed = _build("rope_mixed", learned=False)
    assert not any(True for _ in fixed.parameters()) and "freqs" in fixed.state_dict()


def test_mixed_grouped_query_keys_share_their_groups_frequencies():
    """k with 2 heads for 4 query heads: query heads 0, 1 and key head 0 turn by head 0's F;
    the logits stay relative in 2-D."""
    torch.manual_seed(0)
    enc = posenc.build("rope_mixed", d_model=64, num_heads=4).to(F64)
    seq = SequenceInfo.from_grid(3, 3)
    q, k = _qk(H=4, Hkv=2, T=9)
    rq, rk = enc.rotate(q, k, seq.axes, seq.axes)
    F0 = enc.freqs.detach()[:, :1]
    torch.testing.assert_close(rq[:, 1:2], _slow_rotate(q[:, 1:2], seq.axes, F0), atol=1e-6, rtol=0)
    torch.testing.assert_close(rk[:, 0:1], _slow_rotate(k[:, 0:1], seq.axes, F0), atol=1e-6, rtol=0)
    moved = seq.axes + torch.tensor([4, 1])[:, None, None]
    rq2, rk2 = enc.rotate(q, k, moved, moved)
    logits = lambda a, b: torch.einsum("bhid,bhjd->bhij", a, b.repeat_interleave(2, dim=1))  # noqa: E731
    torch.testing.assert_close(logits(rq2, rk2), logits(rq, rk), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ENCODINGS)
def test_model_on_a_patch_grid_with_axes(name):
    """A bidirectional encoder over 2 images of 3 x 4 patches: axes given, or raster positions
    folded on grid_width = 4, give the same output; cross-image packing equals separate."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=2, causal=False, encoding=name,
                      encoding_config={"grid_width": 4})
    model = Transformer(cfg).to(F64).eval()
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with_axes = model(tokens, SequenceInfo.from_grid(3, 4, batch=2))
        raster = model(tokens)
        packed = model(tokens.reshape(1, 24), SequenceInfo.from_cu_seqlens([0, 12, 24]).with_axes(
            SequenceInfo.from_grid(3, 4, batch=2).axes.reshape(2, 1, 24)))
    torch.testing.assert_close(with_axes, raster, atol=1e-12, rtol=0)
    torch.testing.assert_close(packed.reshape(2, 12, -1), with_axes, atol=1e-10, rtol=1e-10)


# ---- bad configs -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize(
    "config, error, match",
    [
        ({"base": 1.0}, ValueError, "base must be != 1"),
        ({"base": -2.0}, ValueError, "base must be > 0"),
        ({"layout": "halves"}, ValueError, "layout must be one of"),
        ({"grid_width": 0}, ValueError, r"grid_width must be in \[1, 1048576\]"),
        ({"grid_width": 2.0}, TypeError, "grid_width must be an int"),
    ],
)
def test_config_refuses_bad_values_by_name(name, config, error, match):
    with pytest.raises(error, match=match):
        posenc.build(name, d_model=32, num_heads=2, **config)


@pytest.mark.parametrize("name", ENCODINGS)
def test_head_dim_must_split_into_rows_and_columns(name):
    with pytest.raises(ValueError, match="head_dim divisible by 4"):
        posenc.build(name, d_model=12, num_heads=2)
    assert isinstance(posenc.build(name, d_model=16, num_heads=2), (AxialRope, MixedRope))


# ---- the figure ----------------------------------------------------------------------------
def test_figure_axial_logits_separate_into_rows_and_columns_mixed_do_not(tmp_path):
    """Axial: the centre patch's logit is a row profile plus a column profile (each pair turns
    with one axis), z[y, x] - z[y, cx] - z[cy, x] + z[cy, cx] = 0, and the same along rows and
    columns; mixed (oblique directions at init) has an interaction term."""
    from posenc.analysis.fig_rope_2d import centre_logits_2d, plot_rope_2d

    def interaction(z):
        cy, cx = z.shape[-2] // 2, z.shape[-1] // 2
        return (z - z[..., :, cx : cx + 1] - z[..., cy : cy + 1, :] + z[..., cy : cy + 1, cx : cx + 1]).abs().max()

    axial = centre_logits_2d("rope_axial", 9, 9)
    mixed = centre_logits_2d("rope_mixed", 9, 9)
    assert interaction(axial) < 1e-9 * axial.abs().max()
    torch.testing.assert_close(axial, axial.transpose(-1, -2), atol=1e-9, rtol=0)
    assert interaction(mixed) > 1e-2 * mixed.abs().max()
    pytest.importorskip("matplotlib")
    result = plot_rope_2d(tmp_path, height=6, width=6, head_dim=16)
    assert result.path.exists() and result.data["mixed"].shape == (2, 6, 6)


@pytest.mark.parametrize("name", ENCODINGS)
def test_positions_past_float64_integers_are_refused_as_ropes(name):
    """2**53 - 1 turns as the loop says; 2**53 (float64 no longer holds every integer) is refused,
    as raster positions and as axes, with RoPE's message."""
    enc = _build(name)
    q, k = _qk(T=1, D=16)
    last = torch.tensor([[2**53 - 1]])
    raster, _ = enc.rotate(q, k[:, :, :0], last, last[:, :0])
    axes = torch.stack([last // enc.config.grid_width, last % enc.config.grid_width])  # (2, 1, 1)
    assert torch.equal(raster, enc.rotate(q, k[:, :, :0], axes, axes[..., :0])[0])
    for far in (torch.tensor([[2**53]]), torch.tensor([[[2**53]], [[0]]]), torch.tensor([[[0]], [[2**53]]])):
        with pytest.raises(ValueError, match=r"^positions must be <= 9007199254740991 \(2\*\*53 - 1.*got 9007199254740992$"):
            enc.rotate(q, k, far, far)


def test_decoding_tables_are_looked_up_and_equal_prepares(monkeypatch):
    """prepare_cached (a KV-cache step) reads a table of raster positions kept in the cache's
    memo, grown past the largest position; its tables equal prepare's bit for bit, a later step
    reuses the table, axes take prepare's way, and decoding equals the full forward."""
    enc = _build("rope_axial", grid_width=5)
    memo = {}
    for pos in ([[3]], [[63]], [[64]], [[130], [7]], [[8, 9, 10]]):
        p = torch.tensor(pos)
        want, got = enc.prepare(p, p), enc.prepare_cached(p, p, memo)
        for a, b in ((want.cos_q, got.cos_q), (want.sin_q, got.sin_q), (want.cos_k, got.cos_k)):
            assert torch.equal(a, b)
    (table,) = memo.values()
    assert table.positions == 256  # grown to the power of two past 130
    enc.prepare_cached(torch.tensor([[200]]), torch.tensor([[200]]), memo)
    assert next(iter(memo.values())) is table  # within the table: no rebuild
    axes = torch.tensor([[[1]], [[2]]])  # (2, B, T): computed, not looked up
    assert torch.equal(enc.prepare_cached(axes, axes, memo).cos_q, enc.prepare(axes, axes).cos_q)

    calls = []
    real = AxialRope.prepare_cached
    monkeypatch.setattr(AxialRope, "prepare_cached", lambda self, *a: calls.append(1) or real(self, *a))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=2, encoding="rope_axial")).eval()
    tokens = torch.randint(0, 50, (2, 70))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :60], cache=cache)] + [model(tokens[:, t:t + 1], cache=cache) for t in range(60, 70)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert len(calls) >= 10  # every decoding step took the table


def test_dinov3_decoding_looks_up_without_augmentation_and_draws_with_it():
    enc = posenc.build("rope_dinov3", d_model=32, num_heads=2, grid_height=4, grid_width=5, rescale=2.0).eval()
    memo, p = {}, torch.tensor([[3, 17, 40]])
    want, got = enc.prepare(p, p), enc.prepare_cached(p, p, memo)
    assert torch.equal(want.cos_q, got.cos_q) and torch.equal(want.sin_q, got.sin_q) and len(memo) == 1
    enc.train()  # a forward in training draws its augmentation, as prepare does
    memo = {}
    torch.manual_seed(1)
    want = enc.prepare(p, p)
    torch.manual_seed(1)
    got = enc.prepare_cached(p, p, memo)
    assert torch.equal(want.cos_q, got.cos_q) and not memo
    torch.manual_seed(2)
    assert not torch.equal(enc.prepare_cached(p, p, memo).cos_q, want.cos_q)  # a new draw
