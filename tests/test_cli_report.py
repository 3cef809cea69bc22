"""``posenc report``: a bad folder, figure kind or output is one line and exit 2, before any
page is written."""

from __future__ import annotations

from posenc.cli import main


def test_bad_inputs(tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path / "r"), "--bench", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["report", "--out", str(tmp_path / "r"), "--plots", "nope"]) == 2
    assert "--plots: unknown plot kind 'nope'; valid kinds" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["report", "--out", str(blocker)]) == 2
    assert "--out" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    assert main(["report", "--out", str(tmp_path / "r"), "--bench", str(tmp_path / "bad")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing written
