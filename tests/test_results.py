"""posenc.results: the one reader, validator and writer of benchmark results, and the folder layout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from posenc.results import (
    RESULTS_FORMAT, RunLayout, check_out_dir, check_run_dir, read_points, read_results, read_run, run_record,
    settings_hash, write_points, write_results, write_run,
)

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("bench*.json")), ids=lambda p: p.name)
def test_every_committed_results_file_reads(path):
    results = read_results(path)
    assert results["format"] == RESULTS_FORMAT and results["runs"] and results["summary"]


def _record(**kw):
    base = dict(task="copy", encoding="rope", seed=0, train_length=4, metric="accuracy", train_loss=float("nan"),
                train_seconds=1.5, parameters=10,
                points=[dict(variant="base", length=4, depth=None, value=1.0),
                        dict(variant="base", length=8, depth=None, value=float("nan"))])
    base.update(kw)
    return run_record(**base)


def test_a_run_round_trips_with_nan_for_null(tmp_path):
    p = tmp_path / "result.json"
    write_run(p, _record())
    stored = json.loads(p.read_text())  # strict JSON: non-finite numbers as null
    assert stored["train_loss"] is None and stored["points"][1]["value"] is None
    assert list(stored) == ["task", "encoding", "seed", "train_length", "metric", "train_loss", "train_seconds",
                            "parameters", "points"]
    back = read_run(p)
    assert math.isnan(back["train_loss"]) and math.isnan(back["points"][1]["value"]) and back["seed"] == 0


def test_bad_records_are_named():
    with pytest.raises(ValueError, match="metric must be one of accuracy, ppl, got 'acc'"):
        _record(metric="acc")
    with pytest.raises(ValueError, match="a point must hold variant, length, depth, value"):
        _record(points=[dict(variant="base", length=4, value=1.0)])


def test_results_are_written_and_read_once(tmp_path):
    from posenc.bench.summary import collect

    results = collect({"steps": 1}, [_record(), _record(seed=1)])
    paths = write_results(tmp_path, results)
    assert paths == [tmp_path / "results.json", tmp_path / "results.csv"]
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert rows[0] == ("task,encoding,variant,seed,train_length,length,depth,metric,value,"
                       "low,high,count,beyond,beyond_low,beyond_high") and len(rows) == 5
    back = read_results(tmp_path)  # a folder or the file
    assert back["settings"] == {"steps": 1} and len(back["runs"]) == 2
    (tmp_path / "results.json").write_text("{oops")
    with pytest.raises(json.JSONDecodeError, match="results.json is not valid JSON"):
        read_results(tmp_path)
    with pytest.raises(FileNotFoundError, match="no benchmark results at .*; run `posenc bench --out DIR` first"):
        read_results(tmp_path / "nothing")
    bad = dict(results, runs=[dict(task="copy")])
    (tmp_path / "results.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"runs\[0\] is not a run record: it lacks encoding, seed"):
        read_results(tmp_path)


def test_variant_points(tmp_path):
    p = RunLayout(tmp_path).run("lm", "model", 0).variant("yarn")
    p.parent.mkdir(parents=True)
    write_points(p, [dict(variant="yarn", length=8, depth=None, value=float("nan"))])
    assert math.isnan(read_points(p)[0]["value"])


class _Settings:
    def __init__(self, **kw):
        self.kw = kw

    def comparable(self):
        return self.kw


def test_layout_and_resume_checks(tmp_path):
    layout = RunLayout(tmp_path)
    run = layout.run("copy", "rope", 2)
    assert run.path == tmp_path / "runs" / "copy" / "rope" / "seed2"
    assert [p.name for p in layout.owned] == ["bench.json", "runs", "results.json", "results.csv", "plots"]
    assert check_out_dir(tmp_path, _Settings(steps=1), resume=False, overwrite=False) is False
    run.path.mkdir(parents=True)
    (tmp_path / "keep.txt").write_text("mine")
    layout.settings.write_text(json.dumps({"steps": 1, "seeds": 3}))
    with pytest.raises(ValueError, match="holds an earlier benchmark run; pass --resume"):
        check_out_dir(tmp_path, _Settings(steps=1), resume=False, overwrite=False)
    assert check_out_dir(tmp_path, _Settings(steps=1), resume=True, overwrite=False) is True
    with pytest.raises(ValueError, match=r"settings differ .*\{'steps': \(1, 2\)\}"):
        check_out_dir(tmp_path, _Settings(steps=2), resume=True, overwrite=False)
    check_run_dir(run.path, {"steps": 1}, trust_unrecorded=False)
    assert json.loads(run.settings.read_text())["hash"] == settings_hash({"steps": 1})
    with pytest.raises(ValueError, match=r"was trained with other settings \(earlier, now\): \{'steps': \(1, 2\)\}"):
        check_run_dir(run.path, {"steps": 2}, trust_unrecorded=False)
    other = layout.run("copy", "alibi", 0)
    other.path.mkdir(parents=True)
    other.result.write_text("{}")
    with pytest.raises(ValueError, match="holds result.json but no run.json"):
        check_run_dir(other.path, {"steps": 1}, trust_unrecorded=False)
    assert check_out_dir(tmp_path, _Settings(steps=1), resume=False, overwrite=True) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_the_corpus_record_is_optional_and_checked(tmp_path):
    """results.json may carry what text its runs read (a new field): it is written and read back
    as given, files without it (every committed one) still read, and a malformed one is named."""
    from posenc.bench.summary import collect

    results = collect({"steps": 1}, [_record()])
    assert "corpus" not in results and "corpus" not in read_results(RESULTS / "bench_quick.json")
    record = dict(source="Python 3.11.7 standard library", sha256="ab" * 32, train_bytes=20_000, val_bytes=2222)
    write_results(tmp_path, dict(results, corpus=record))
    assert read_results(tmp_path)["corpus"] == record
    for bad, message in ((dict(record, sha256="AB" * 32), "corpus sha256 must be 64 lowercase hex digits, got 'ABAB"),
                         (dict(record, train_bytes=-1), "corpus train_bytes must be an integer >= 0, got -1"),
                         (dict(record, val_bytes=True), "corpus val_bytes must be an integer >= 0, got True"),
                         ({"sha256": "ab" * 32}, "corpus must hold source, sha256, train_bytes, val_bytes"),
                         ("stdlib", "corpus must hold source, sha256, train_bytes, val_bytes, got 'stdlib'")):
        (tmp_path / "results.json").write_text(json.dumps(dict(results, corpus=bad)))
        with pytest.raises(ValueError, match=rf"results.json: {message}"):
            read_results(tmp_path)
