"""A benchmark folder on the report's page: read once; results that are not JSON are an error,
JSON that is not bench results a note; a folder without results or PNGs a note; the model
bench's folder must hold `posenc bench --model` results."""

from __future__ import annotations

import json

import pytest

from posenc.analysis.report_bench import bench_section, load_bench, load_model_bench


def test_a_folder_without_results_is_a_note(tmp_path):
    folder = load_bench(tmp_path)
    assert folder.results is None and not folder.problem and folder.pngs == []
    assert "No results.json" in bench_section(folder)
    assert folder.summary() == [] and folder.encodings() == set()


def test_a_missing_folder_or_broken_json_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_bench(tmp_path / "missing")
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_bench(tmp_path)


def test_json_that_is_not_bench_results_is_a_note(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"format": "something else"}))
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "task_copy.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    folder = load_bench(tmp_path)
    assert folder.results is None and "is not posenc bench results" in folder.problem
    assert [p.name for p in folder.pngs] == ["task_copy.png"]
    html = bench_section(folder)
    assert "could not be read as posenc bench results" in html and 'alt="task copy"' in html


def test_a_committed_run_reads_back(tmp_path):
    from pathlib import Path

    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "bench_quick.json"
    (tmp_path / "results.json").write_bytes(committed.read_bytes())
    folder = load_bench(tmp_path)
    assert not folder.problem and {"none", "rope", "alibi"} <= folder.encodings()
    (line,) = folder.summary()
    assert line.startswith("Benchmark: ") and "highest mean reciprocal rank beyond L" in line
    html = bench_section(folder)
    assert '<table id="bench">' in html and "nan" not in html.lower()


def test_model_bench_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="--model-bench .* holds no results.json"):
        load_model_bench(tmp_path)
