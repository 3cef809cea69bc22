"""``posenc check``: the table (or JSON) of every cell, and one line with exit 2 for an unknown
encoding."""

from __future__ import annotations

import json

from posenc.analysis.checks import CHECKS
from posenc.cli import main


def test_cli_json_and_table(capsys):
    assert main(["check", "none", "--json", "--d-model", "32", "--heads", "2", "--train-len", "32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["none"]) == set(CHECKS)
    assert out["none"]["relative"]["status"] == "n/a"
    assert main(["check", "sinusoidal", "--d-model", "32", "--heads", "2", "--train-len", "32"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split()[0] == "encoding"
    assert "sinusoidal" in text and "Vaswani" in text


def test_cli_unknown_encoding_lists_valid_ones(capsys):
    assert main(["check", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown encoding 'nope'" in err and "sinusoidal" in err
