"""``posenc plot``: one kind or all into a folder, ``--set`` typed like the plot function's
defaults, and one line with exit 2 for a bad kind, option or folder."""

from __future__ import annotations

import struct

from posenc.analysis.canvas import DPI, FIGSIZE
from posenc.cli import main
from posenc.cli.plot import parse_options

W, H = int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG file"
    return struct.unpack(">II", data[16:24])


def test_unknown_kind_lists_kinds_and_exits_2(tmp_path, capsys):
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
    assert parse_options("rope-score", ["bases=1e4,1e6", "train_len=8192"]) == {"bases": (1e4, 1e6), "train_len": 8192}
    assert main(["plot", "sinusoidal-dot", "--set", "dim=16", "--set", "max_distance=8", "--out", str(tmp_path)]) == 0
    assert png_size(tmp_path / "sinusoidal-dot.png") == (W, H)
    assert main(["plot", "sinusoidal-dot", "--set", "colour=red", "--out", str(tmp_path)]) == 2
    assert "takes max_distance=256" in capsys.readouterr().err
    assert main(["plot", "sinusoidal-dot", "--set", "dim=big", "--out", str(tmp_path)]) == 2
    assert "dim must be like 64" in capsys.readouterr().err


def test_set_applies_to_one_kind(tmp_path, capsys):
    assert main(["plot", "all", "--set", "dim=16", "--out", str(tmp_path)]) == 2
    assert "--set applies to one plot kind, not to 'all'" in capsys.readouterr().err
