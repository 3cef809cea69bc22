"""The figures: every kind writes a valid PNG of the known size, and its data is right.

Expected values are written from the papers' formulas in the tests (loops, not the code
under test): sinusoidal PE(p)·PE(p + k) = sum_i cos(k w_i) (Vaswani et al. 2017); the RoPE
score of all-ones q, k at distance 0 is the number of pairs; RoFormer's bound at 0 is the
mean of 1..d/2; ALiBi slopes 2^(-8h/H) (Press et al. 2022); T5 and DeBERTa buckets from
the papers' definitions.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch

from posenc.analysis import canvas
from posenc.analysis import figures as F

W, H = int(canvas.FIGSIZE[0] * canvas.DPI), int(canvas.FIGSIZE[1] * canvas.DPI)


def png_size(path) -> tuple[int, int]:
    """Width and height from the PNG header (signature, then the IHDR chunk)."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def draw(kind, tmp_path, **opts):
    res = F.make_plot(kind, tmp_path, **opts)
    assert res.path == tmp_path / f"{kind}.png"
    assert png_size(res.path) == (W, H)
    return res.data


def theta(dim, base):
    return [base ** (-2 * i / dim) for i in range(dim // 2)]


def test_sinusoidal_heatmap(tmp_path):
    t = draw("sinusoidal-heatmap", tmp_path, length=16, dim=8)["table"]
    assert t.shape == (16, 8)
    for p in (0, 5, 15):
        for i in range(4):
            w = 10000.0 ** (-2 * i / 8)
            assert t[p, i] == pytest.approx(math.sin(p * w), abs=1e-6)  # halves: [sin | cos]
            assert t[p, 4 + i] == pytest.approx(math.cos(p * w), abs=1e-6)


def test_sinusoidal_waves_period_grows(tmp_path):
    d = draw("sinusoidal-waves", tmp_path, length=64, dims=(0, 4, 8))
    periods = [d["periods"][i] for i in (0, 4, 8)]
    assert periods == sorted(periods) and periods[0] == pytest.approx(2 * math.pi)
    assert periods[1] == pytest.approx(2 * math.pi * 10000 ** (4 / 64))
    assert d["waves"][4][10] == pytest.approx(math.sin(10 * 10000 ** (-4 / 64)), abs=1e-6)


def test_sinusoidal_base(tmp_path):
    d = draw("sinusoidal-base", tmp_path, length=50, index=16)
    assert set(d["waves"]) == {100.0, 1000.0, 10000.0}
    for b, wave in d["waves"].items():
        assert wave[37] == pytest.approx(math.sin(37 * b ** (-16 / 64)), abs=1e-6)


def test_sinusoidal_dot(tmp_path):
    d = draw("sinusoidal-dot", tmp_path, max_distance=20, dim=16)
    dist, dot = d["distance"].tolist(), d["dot"]
    for k in (-20, -3, 0, 7, 20):
        want = sum(math.cos(k * w) for w in theta(16, 10000.0))
        assert dot[dist.index(k)] == pytest.approx(want, abs=1e-5)
    assert dot[dist.index(0)] == pytest.approx(8)  # d / 2 pairs of sin^2 + cos^2


def test_rope_decay(tmp_path):
    d = draw("rope-decay", tmp_path, max_distance=64, dim=16, bases=(100.0, 10000.0))
    for b in (100.0, 10000.0):
        assert d["score"][b][0] == pytest.approx(8)  # the sum over 8 frequencies of cos(0)
        assert d["bound"][b][0] == pytest.approx(sum(range(1, 9)) / 8)  # |S_j| = j at r = 0
        r = 37
        s, acc = 0.0, complex(0)
        for w in theta(16, b):
            acc += complex(math.cos(r * w), math.sin(r * w))
            s += abs(acc)
        assert d["bound"][b][r] == pytest.approx(s / 8)
        assert d["score"][b][r] == pytest.approx(sum(math.cos(r * w) for w in theta(16, b)))


def test_rope_score_base_restores_decay(tmp_path):
    d = draw("rope-score", tmp_path, max_distance=2**15, dim=64, bases=(1e4, 5e5), train_len=4096, samples=8)
    lost = d["decay_lost_at"]
    # First m with sum_i cos(m theta_i) < 0, searched here by a plain loop.
    for b in (1e4,):
        m = next(m for m in range(1, 2**15) if sum(math.cos(m * w) for w in theta(64, b)) < 0)
        assert lost[b] == m
    assert lost[1e4] < 4096 < (lost[5e5] or math.inf)  # raising the base restores decay at L
    i = d["distance"].tolist().index(0)
    assert d["ones"][1e4][i] == pytest.approx(64)  # q = k = 1: 2 cos(0) per pair


def test_rope_bands(tmp_path):
    d = draw("rope-bands", tmp_path, max_distance=100, dim=16)
    w = theta(16, 10000.0)
    assert d["high"][50] == pytest.approx(sum(math.cos(50 * x) for x in w[:4]))
    assert d["low"][50] == pytest.approx(sum(math.cos(50 * x) for x in w[4:]))


def test_rope_scaling(tmp_path):
    d = draw("rope-scaling", tmp_path, dim=32, factor=4.0)
    from posenc.rotary import ROPE_SCALINGS

    assert set(d["inv_freq"]) | set(d["skipped"]) == set(ROPE_SCALINGS)
    assert not d["skipped"], d["skipped"]
    base = torch.tensor(theta(32, 10000.0), dtype=torch.float64)
    torch.testing.assert_close(d["inv_freq"]["default"], base)
    torch.testing.assert_close(d["inv_freq"]["linear"], base / 4.0)
    # Every type at 4x the trained length, each scaled for it: dynamic NTK at n = 4L is NTK
    # with alpha = 4 (not the 13x that factor 4 at 4L would give).
    assert d["seq_len"] == 4 * 4096
    torch.testing.assert_close(d["inv_freq"]["dynamic"], d["inv_freq"]["ntk"])


def t5_bucket(rel, bidirectional, num_buckets=32, max_distance=128):
    """T5's bucket, from the paper's description (Raffel et al. 2020, §2.1), one value at a time."""
    ret = 0
    if bidirectional:
        num_buckets //= 2
        if rel > 0:
            ret += num_buckets
        n = abs(rel)
    else:
        n = max(-rel, 0)
    exact = num_buckets // 2
    if n < exact:
        return ret + n
    v = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return ret + min(v, num_buckets - 1)


def test_t5_buckets(tmp_path):
    d = draw("t5-buckets", tmp_path, max_distance=300)
    rel = d["relative_position"].tolist()
    for r in (-300, -129, -128, -40, -8, -7, 0, 3, 8, 100, 127, 300):
        assert d["bidirectional"][rel.index(r)] == t5_bucket(r, True)
        assert d["unidirectional"][rel.index(r)] == t5_bucket(r, False)


def test_alibi(tmp_path):
    d = draw("alibi", tmp_path, num_heads=8, max_distance=10)
    torch.testing.assert_close(d["slopes"], torch.tensor([2.0 ** -(h + 1) for h in range(8)], dtype=torch.float64))
    assert d["bias"][2, 10] == pytest.approx(-10 * 2.0**-3)


def test_deberta_buckets(tmp_path):
    d = draw("deberta-buckets", tmp_path, max_distance=600, bucket_size=256, max_position=512)
    rel, b = d["relative_position"].tolist(), d["buckets"].tolist()
    mid = 128
    for r in (-128, -5, 0, 100, 128):
        assert b[rel.index(r)] == r  # |r| <= mid: identity
    for r in (129, 300, 511):
        want = mid + math.ceil(math.log(r / mid) / math.log(511 / mid) * (mid - 1))
        assert b[rel.index(r)] == want and b[rel.index(-r)] == -want
    assert b[rel.index(511)] == 255  # max_position - 1 lands on the last bucket
    c = d["clamped"].tolist()  # what DeBERTa reads: its table has rows for [-256, 255]
    assert max(c) == 255 and min(c) == -256 and c[rel.index(600)] == 255 and c[rel.index(-600)] == -256
    assert b[rel.index(600)] > 255  # the raw bucket keeps growing; the figure shows all of it


def test_unknown_kind_lists_kinds(tmp_path):
    with pytest.raises(ValueError, match="valid kinds: .*sinusoidal-heatmap"):
        F.make_plot("nope", tmp_path)


# ---- what each figure explains ----------------------------------------------------------------
def test_every_kind_says_what_it_concerns():
    """Each kind names what it explains, and each name is a registered encoding, a registered
    RoPE scaling type or "every encoding": the report selects figures by these names."""
    from posenc.registry import list_encodings
    from posenc.rotary import SCALINGS

    known = set(list_encodings()) | set(SCALINGS) | {F.ANY_ENCODING}
    for kind, f in F.FIGURES.items():
        assert f.concerns and set(f.concerns) <= known, (kind, set(f.concerns) - known)
        assert f.summary and f.caption.startswith(f.summary), kind
    assert set(SCALINGS) <= set(F.FIGURES["rope-scaling"].concerns)  # it draws every scaling type


def test_cope_positions_count_sentences(tmp_path):
    """p_ij = sum_{t=j}^{i} sigmoid(q_i·k_t / sqrt(D)) (Golovneva et al. 2024, eq. 3), a loop over
    the gates of the figure's q and k; gates open on "." count the sentences between j and i."""
    from posenc.analysis.fig_cope import gate_qk

    d = draw("cope-positions", tmp_path, text="a b . c . d e .", margin=12.0, head_dim=8)
    words = d["words"]
    T = len(words)
    for key, opens in (("sentence_positions", [w == "." for w in words]), ("token_positions", [True] * T)):
        q, k = gate_qk(torch.tensor(opens), 8, 12.0)
        want = torch.zeros(T, T, dtype=torch.float64)
        for i in range(T):
            for j in range(i + 1):
                want[i, j] = sum(torch.sigmoid(q[0, 0, i] @ k[0, 0, t] / math.sqrt(8)) for t in range(j, i + 1))
        got = d[key].double()
        torch.testing.assert_close(torch.tril(got), want)
    last = d["sentence_positions"][-1]
    assert [round(float(x)) for x in last] == [3, 3, 3, 2, 2, 1, 1, 1]
    assert [round(float(x)) for x in d["token_positions"][-1]] == list(range(T, 0, -1))


def test_pope_polar_against_the_formula(tmp_path):
    """PoPE: sum_c softplus(q_c) softplus(k_c) cos(m theta_c), theta_c = base^(-c/D), phase bias
    0 (Gopalakrishnan et al. 2025); RoPE (half layout): sum_i (q_i k_i + q_i' k_i') cos(m theta_i)
    + (q_i k_i' - q_i' k_i) sin(m theta_i), i' = i + D/2; loops over channels."""
    D, base = 8, 100.0
    d = draw("pope-polar", tmp_path, head_dim=D, pairs=2, max_distance=12, base=base)
    q, k = d["q"], d["k"]
    sp = torch.nn.functional.softplus
    for p in range(2):
        for m in range(13):
            pope = sum(float(sp(q[p, c]) * sp(k[p, c])) * math.cos(m * base ** (-c / D)) for c in range(D))
            h = D // 2
            rope = 0.0
            for i in range(h):
                t = m * base ** (-2 * i / D)
                a, b, c_, e = (float(x) for x in (q[p, i], q[p, i + h], k[p, i], k[p, i + h]))
                rope += (a * c_ + b * e) * math.cos(t) + (a * e - b * c_) * math.sin(t)
            assert float(d["pope"][p, m]) == pytest.approx(pope, rel=1e-6)
            assert float(d["rope"][p, m]) == pytest.approx(rope, rel=1e-6, abs=1e-9)
    assert (d["pope"].argmax(-1) == 0).all()  # positive magnitudes: the peak is at distance 0


def test_dynamic_bias_is_the_mlp(tmp_path):
    """The bias at distance r is Linear(w, H)(SiLU(Linear(w, w)(SiLU(Linear(1, w)(x))))), x = r or
    sign(r) log(1 + |r|) (Wang et al. 2021; x-transformers dynamic_pos_bias), from the weights of
    the encoding the figure builds, one distance at a time."""
    from posenc import build

    d = draw("dynamic-bias", tmp_path, num_heads=2, train_len=8, extend=2, seed=3)
    for key, log in (("linear", False), ("log", True)):
        torch.manual_seed(3)
        enc = build("dynamic_bias", d_model=64, num_heads=2, log_distance=log)
        l0, l1, out = enc.linears[0], enc.linears[1], enc.out
        for r in range(17):
            x = torch.tensor([math.copysign(math.log1p(r), r) if log else float(r)])
            hid = torch.nn.functional.silu(l1(torch.nn.functional.silu(l0(x))))
            want = out(hid).detach().double()
            torch.testing.assert_close(d[key][:, r], want, rtol=1e-5, atol=1e-6)


def test_dropped_frequencies(tmp_path):
    """p-RoPE keeps theta_i for the first int(p d/2) pairs (Barbero et al. 2025); HoPE where the
    wavelength 2 pi / theta_i <= L (Chen et al. 2025); the rest 0; the score is 2 sum cos(m theta)."""
    d = draw("rope-dropped-frequencies", tmp_path, dim=32, base=10000.0, train_len=64, proportion=0.5, extend=2)
    full = theta(32, 10000.0)
    want = {"no scaling": full, "p-RoPE": [t if i < 8 else 0.0 for i, t in enumerate(full)],
            "HoPE": [t if 2 * math.pi / t <= 64 else 0.0 for t in full]}
    assert set(d["inv_freq"]) == set(want)
    for name, w in want.items():
        torch.testing.assert_close(d["inv_freq"][name], torch.tensor(w, dtype=torch.float64))
        assert d["kept"][name] == sum(1 for x in w if x > 0)
        assert float(d["score"][name][50]) == pytest.approx(2 * sum(math.cos(50 * x) for x in w))
    assert 0 < d["kept"]["HoPE"] < 16


def test_randomized_positions_cover_the_range(tmp_path):
    """Ruoss et al. 2023: each sequence's n positions are distinct, sorted, in [0, L); over many
    sequences every position of [0, L) is equally likely (n / L each): a chi-square test."""
    d = draw("randomized-positions", tmp_path, length=8, max_length=32, rows=4, draws=4000, seed=0)
    pos = d["positions"]
    assert pos.shape == (4, 8)
    assert ((pos[:, 1:] - pos[:, :-1]) > 0).all() and pos.min() >= 0 and pos.max() < 32
    counts = d["counts"].double()
    assert counts.sum() == 4000 * 8 and counts.numel() == 32
    expected = 4000 * 8 / 32
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 80, chi2  # 31 degrees of freedom: 80 is beyond p = 1e-5


def test_hybrid_layers(tmp_path):
    """Every 4th layer global NoPE (Llama 4 with the temperature, SmolLM3 and Cohere2 without),
    the others RoPE with chunk 8192 / all keys / a 4096 window; the query factor is
    1 + 0.1 log1p(floor((p + 1) / 8192)) (transformers' Llama 4 defaults), one position at a time."""
    d = draw("hybrid-layers", tmp_path, n_layer=8, max_position=2**16)
    local = {"llama4": ("rope", "chunked", 8192), "smollm3": ("rope", "global", None),
             "cohere2": ("rope", "sliding", 4096), "gemma3": ("rope", "sliding", 512)}
    glob = {"llama4": ("nope_temperature", "global", None), "smollm3": (None, "global", None),
            "cohere2": (None, "global", None), "gemma3": ("rope", "global", None)}
    every = {"gemma3": 6}  # Gemma 3: five sliding layers, then a global one; the others: every 4th
    assert set(d["layers"]) == set(local)
    for name, layers in d["layers"].items():
        k = every.get(name, 4)
        assert layers == [glob[name] if (i + 1) % k == 0 else local[name] for i in range(8)], name
    for p, f in zip(d["positions"].tolist(), d["factor"].tolist()):
        assert f == pytest.approx(1 + 0.1 * math.log1p((p + 1) // 8192), rel=1e-12)
    assert d["factor"][0] == 1.0 and d["factor"][-1] > 1.0


def test_stick_breaking_weights(tmp_path):
    """A_ij = sigmoid(z_j) prod over the nearer keys of (1 - sigmoid(z_t)) (Tan et al. 2024),
    written as a loop from the query backwards; the leftover is 1 - the sum."""
    d = draw("stick-breaking", tmp_path, n_keys=12, strong_at=4)
    for name, z in d["logits"].items():
        w, rest = d["weights"][name].tolist(), 1.0
        for j in range(len(z) - 1, -1, -1):
            b = 1 / (1 + math.exp(-float(z[j])))
            assert w[j] == pytest.approx(b * rest, rel=1e-5, abs=1e-9), (name, j)
            rest *= 1 - b
        assert d["left"][name] == pytest.approx(rest, abs=1e-6)
    uniform = d["weights"]["z = 0 everywhere (β = ½)"].tolist()
    assert uniform[-1] == pytest.approx(0.5) and uniform[-2] == pytest.approx(0.25)


def test_path_householder_products(tmp_path):
    """logit_ij = s qᵀ H_i ⋯ H_{j+1} q with H_t = I - β_t w_t w_tᵀ (Yang et al. 2025), the
    product written as a loop here; the norm |P_ijᵀ q| <= |q|, kept by reflections (β → 2)."""
    d = draw("path-householder", tmp_path, T=12, head_dim=8)
    w, beta, s = d["w"].double(), d["beta"].double(), d["scale"]
    H, T, D = w.shape
    q = torch.eye(D, dtype=torch.float64)[0]
    for h in range(H):
        P = torch.eye(D, dtype=torch.float64)
        for j in range(T - 1, -1, -1):  # key j; P = H_{T-1} ⋯ H_{j+1}
            if j < T - 1:
                P = P @ (torch.eye(D, dtype=torch.float64) - beta[h, j + 1] * torch.outer(w[h, j + 1], w[h, j + 1]))
            assert float(d["logit"][h, j]) == pytest.approx(s * float(q @ P @ q), abs=1e-9)
            assert float(d["norm"][h, j]) == pytest.approx(float((P.T @ q).norm()), abs=1e-9)
    assert (d["norm"] <= 1 + 1e-9).all() and (d["logit"].abs() <= s + 1e-9).all()
    assert d["norm"][-1].min() > 0.95  # β = 1.999: nearly orthogonal


def test_sandwich_heads(tmp_path):
    """(sum_{i=1}^{d'/2} cos(r 10000^(-2i/d')) - d'/2) / (8h/H) (Chi et al. 2023; NeMo's i = 1..d'/2)."""
    d = draw("sandwich", tmp_path, num_heads=4, head_dim=16, max_distance=5000)
    dim, H = d["dim"], 4
    for r_idx in (0, 1, 7, len(d["distance"]) - 1):
        r = int(d["distance"][r_idx])
        s = sum(math.cos(r * 10000 ** (-2 * i / dim)) for i in range(1, dim // 2 + 1)) - dim / 2
        for h in range(H):
            assert float(d["bias"][h, r_idx]) == pytest.approx(s / (8 * (h + 1) / H), abs=1e-9)


def test_per_row_alibi_rows(tmp_path):
    """b_ij = sum_{l=j}^{i-1} log sigmoid(u_i·v_l/√d) (x-transformers' PerRowDataDependentAlibi),
    u and v from the gate map laid out (qk h d)."""
    d = draw("per-row-alibi", tmp_path, T=10, num_heads=2)
    x, W, bias = d["x"][0], d["gate"], d["bias"]
    dh = W.shape[0] // 4
    uv = (x @ W.T).view(10, 2, 2, dh)  # (t, qk, h, d)
    for h in range(2):
        for i in range(10):
            for j in range(i + 1):
                want = sum(math.log(1 / (1 + math.exp(-float(uv[i, 0, h] @ uv[l, 1, h]) / math.sqrt(dh))))
                           for l in range(j, i))
                assert float(bias[h, i, j]) == pytest.approx(want, abs=1e-9)


def test_multimodal_ids(tmp_path):
    """VideoRoPE: frame f's patch (y, x) at time s + 2f, height time + y - 1, width time + x - 1
    (Wei et al. 2025's centring, (h - 1) // 2 = 1, (w - 1) // 2 = 1); XD-RoPE: the grid tokens
    take column, row and image 0, the rest the token index (HunYuan-VL)."""
    d = draw("multimodal-ids", tmp_path)
    v = d["video"]
    assert v[:, :4].tolist() == [[0, 1, 2, 3]] * 3
    for f in range(3):
        for y in range(3):
            for x in range(4):
                n = 4 + f * 12 + y * 4 + x
                t = 4 + 2 * f
                assert v[:, n].tolist() == [t, t + y - 1, t + x - 1]
    assert v[:, 40:].tolist() == [[9, 10, 11, 12]] * 3  # after the last frame's time 8
    xd = d["xdrope"]
    assert xd[0].tolist() == list(range(25))
    for n in range(25):
        g = n - 5  # grid tokens 5 .. 19: 3 rows of 4 patches + newline
        if 0 <= g < 15:
            assert xd[1:, n].tolist() == [g % 5, g // 5, 0]
        else:
            assert xd[1:, n].tolist() == [n, n, n]


def test_rope_2d_draws_dinov3(tmp_path):
    """DINOv3's panel is axial (a row profile plus a column profile about the centre), peaks at
    the centre with all-ones q·k = d, and on a square grid is symmetric in rows and columns."""
    d = draw("rope-2d", tmp_path, height=6, width=6, head_dim=16)
    z = d["dinov3"]
    c = 3
    assert float(z[c, c]) == pytest.approx(16.0)
    assert (z - z[:, c : c + 1] - z[c : c + 1, :] + z[c, c]).abs().max() < 1e-9
    torch.testing.assert_close(z, z.T, atol=1e-9, rtol=0)


def test_fope_frequencies_against_the_formula(tmp_path):
    """FoPE with its coefficients at the identity (Hua et al. 2025, as vLLM): RoPE on the kept
    pairs (theta_i > 2 pi / L) plus, for each dropped pair, twice its q·k at every position (its
    C = S = 1 map); RoPE (half layout) on every pair; loops over pairs."""
    D, L, base = 8, 16, 100.0
    d = draw("fope-frequencies", tmp_path, head_dim=D, trained_length=L, factor=3, base=base)
    q, k = d["q"][0], d["k"][0]
    h = D // 2
    theta = [base ** (-2 * i / D) for i in range(h)]
    kept = [t > 2 * math.pi / L for t in theta]
    assert kept[0] and not all(kept)  # the figure shows a cut
    for m in range(3 * L + 1):
        rope = fope = 0.0
        for i in range(h):
            a, b, c_, e = (float(x) for x in (q[i], q[i + h], k[i], k[i + h]))
            rotated = (a * c_ + b * e) * math.cos(m * theta[i]) + (a * e - b * c_) * math.sin(m * theta[i])
            rope += rotated
            fope += rotated if kept[i] else 2 * (a * c_ + b * e)
        assert float(d["rope"][m]) == pytest.approx(rope, rel=1e-6, abs=1e-9)
        # FoPE sums its series in its coefficients' dtype, float32: a float32 rounding
        assert float(d["fope_identity"][m]) == pytest.approx(fope, rel=1e-5, abs=1e-6)
    assert not torch.allclose(d["fope"], d["fope_identity"])  # the initialised coefficients move it
