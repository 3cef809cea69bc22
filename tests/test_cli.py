"""cli.py: `posenc list`."""

from __future__ import annotations

import posenc
from posenc.cli import main as cli_main


def test_cli_list_prints_every_encoding(capsys):
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    for name in posenc.list_encodings():
        assert name in out
        assert posenc.get_info(name).paper in out
