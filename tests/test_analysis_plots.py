"""``posenc plot``: every kind writes a valid PNG of the known size, and its data is right.

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

from posenc.analysis import plots as P
from posenc.cli import main

W, H = int(P.FIGSIZE[0] * P.DPI), int(P.FIGSIZE[1] * P.DPI)


def png_size(path) -> tuple[int, int]:
    """Width and height from the PNG header (signature, then the IHDR chunk)."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def draw(kind, tmp_path, **opts):
    try:
        res = P.make_plot(kind, tmp_path, **opts)
    except ValueError as e:
        if "lacks" in str(e):
            pytest.skip(str(e))  # the family this plot needs has not landed on this branch
        raise
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


def test_unknown_kind_lists_kinds(tmp_path, capsys):
    with pytest.raises(ValueError, match="valid kinds: .*sinusoidal-heatmap"):
        P.make_plot("nope", tmp_path)
    assert main(["plot", "nope", "--out", str(tmp_path)]) == 2
    assert "rope-score" in capsys.readouterr().err


def test_out_not_writable(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["plot", "sinusoidal-dot", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot be created" in err
    assert main(["plot", "sinusoidal-dot", "--out", str(blocker)]) == 2


def test_cli_writes_png(tmp_path, capsys):
    assert main(["plot", "sinusoidal-heatmap", "--out", str(tmp_path / "figs")]) == 0
    assert png_size(tmp_path / "figs" / "sinusoidal-heatmap.png") == (W, H)
    assert "sinusoidal-heatmap.png" in capsys.readouterr().out


def test_cli_set_options(tmp_path, capsys):
    assert P.parse_options("rope-score", ["bases=1e4,1e6", "train_len=8192"]) == {"bases": (1e4, 1e6), "train_len": 8192}
    assert main(["plot", "sinusoidal-dot", "--set", "dim=16", "--set", "max_distance=8", "--out", str(tmp_path)]) == 0
    assert png_size(tmp_path / "sinusoidal-dot.png") == (W, H)
    assert main(["plot", "sinusoidal-dot", "--set", "colour=red", "--out", str(tmp_path)]) == 2
    assert "takes max_distance=256" in capsys.readouterr().err
    assert main(["plot", "sinusoidal-dot", "--set", "dim=big", "--out", str(tmp_path)]) == 2
    assert "dim must be like 64" in capsys.readouterr().err
