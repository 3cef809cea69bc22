"""posenc.progress: a bar on a terminal, one line per finished unit in a log, nothing when off."""

from __future__ import annotations

import io
import re

import pytest

from posenc import progress
from posenc.cli import main


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_log_one_line_when_the_unit_ends():
    log = io.StringIO()
    with progress.bar(5, "copy/rope/seed0", unit="step", stream=log) as bar:
        for _ in range(5):
            bar.update()
            bar.set_postfix(loss="0.1234")
            assert log.getvalue() == ""  # nothing while it runs
    assert re.fullmatch(r"copy/rope/seed0: 5/5 step in \d+\.\d s \(loss=0\.1234\)\n", log.getvalue())


def test_a_bar_closed_early_says_where_it_stopped_and_where_it_resumed_from():
    log = io.StringIO()
    bar = progress.bar(10, "lm/t5/seed2", unit="step", initial=4, stream=log)
    bar.update(2)
    bar.close()
    bar.close()  # a second close writes nothing more
    assert re.fullmatch(r"lm/t5/seed2: stopped at 6/10 step \(from 4\) in \d+\.\d s\n", log.getvalue())


def test_disabled_writes_nothing_anywhere():
    for stream in (io.StringIO(), Terminal()):
        with progress.bar(3, "x", enabled=False, stream=stream) as bar:
            bar.update(3)
        assert stream.getvalue() == ""


def test_on_a_terminal_a_tqdm_bar_that_leaves_nothing():
    tqdm = pytest.importorskip("tqdm")
    term = Terminal()
    with progress.bar(3, "probe", unit="curve", stream=term) as bar:
        assert isinstance(bar, tqdm.tqdm)
        bar.update(3)
    assert "probe" in term.getvalue()  # drawn, then cleared (leave=False)


def test_a_bench_log_has_one_line_per_run(tmp_path, capsys):
    """make demo's background half writes a log: one line per trained run, no bar updates."""
    argv = ["bench", "--preset", "micro", "--tasks", "copy", "--encodings", "none", "learned", "--steps", "8",
            "--out", str(tmp_path / "b")]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    runs = [ln for ln in err if re.match(r"copy/(none|learned)/seed0: 8/8 step in ", ln)]
    assert len(runs) == 2, err
    assert not [ln for ln in err if "\r" in ln or "it/s" in ln]
    assert main([*argv[:-2], "--no-progress", "--out", str(tmp_path / "c")]) == 0
    assert not [ln for ln in capsys.readouterr().err.splitlines() if "step in" in ln]


def test_eta_refines_from_the_measured_rate():
    """Hand-computed: 100 units, a prior of 50 s; after 25 units in 10 s, 75 left at 0.4 s/unit =
    30 s; after 25 more in 30 s (40 s for 50 units), 50 left at 0.8 s/unit = 40 s (a slower
    unit raises it); all done: 0."""
    eta = progress.Eta(100.0, prior_seconds=50.0)
    assert eta.remaining_seconds() == 50.0
    eta.done(25.0, 10.0)
    assert eta.remaining_seconds() == pytest.approx(30.0)
    eta.done(25.0, 30.0)
    assert eta.remaining_seconds() == pytest.approx(40.0)
    eta.done(50.0, 1.0)
    assert eta.remaining_seconds() == 0.0
    assert progress.Eta(10.0).remaining_seconds() is None  # no prior, no measurement: unknown
    assert progress.format_minutes(372.0) == "6.2 min" and progress.format_minutes(None) == "?"
    with pytest.raises(ValueError, match="seconds"):
        eta.done(1.0, -1.0)


def test_write_goes_above_a_terminal_bar_and_at_once_in_a_log():
    log = io.StringIO()
    with progress.bar(2, "x", stream=log) as bar:
        bar.write("[1/2] first")
        assert log.getvalue() == "[1/2] first\n"
    quiet = io.StringIO()
    with progress.bar(2, "x", stream=quiet, enabled=False) as bar:
        bar.write("[1/2] first")
    assert quiet.getvalue() == ""
