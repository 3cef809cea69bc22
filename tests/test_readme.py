"""The README's Python examples run as written, and every measured table in README.md and
docs/*.md is what benchmarks/tables.py renders from its committed results file (the docs build
in benchmarks/docsbuild/: a manifest of tables and one renderer per kind)."""

from __future__ import annotations

import copy
import importlib.util
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    for code in blocks:
        if 'from_pretrained("path/to/checkpoint")' in code:
            continue  # the HF path needs a checkpoint: tests/test_hf_patch.py runs it on a saved one
        exec(compile(code, str(README), "exec"), {})


@pytest.fixture
def tables(monkeypatch):
    """benchmarks/tables.py, imported fresh (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("_tables_under_test", ROOT / "benchmarks" / "tables.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_committed_tables_equal_their_results_files(tables):
    """A results file and the table quoting it cannot drift apart (fix: python benchmarks/tables.py)."""
    names = []
    for page in tables.PAGES:
        text = (ROOT / page).read_text()
        names += tables.tables_in(text)
        assert tables.render_page(page, text) == text, f"{page} is out of date: run python benchmarks/tables.py"
    assert {"bench_quick", "rope_cpu", "relative_scores", "model_cpu", "check_cpu"} <= set(names), names


def test_every_table_is_where_the_manifest_places_it_and_every_results_file_has_a_command(tables):
    placed = {(n, page) for page in tables.PAGES for n in tables.tables_in((ROOT / page).read_text())}
    declared = {(n, page) for n, t in tables.TABLES.items() for page in t.pages}
    assert placed == declared, f"marked but not declared: {placed - declared}; declared but not marked: {declared - placed}"
    read = {r for t in tables.TABLES.values() for r in t.results}
    assert read == set(tables.RESULTS), f"results files no table reads: {set(tables.RESULTS) - read}"
    committed = {p.name for p in tables.RESULTS_DIR.glob("*.json")}
    assert committed, "no results files"
    known = {r.file for r in tables.RESULTS.values()}
    assert not committed - known, (f"results files with no entry in RESULTS (benchmarks/tables.py): {committed - known}; "
                                   "add one naming the command that writes the file")
    assert not known - committed, f"RESULTS names files that do not exist: {known - committed}"


def test_tables_render_a_hand_made_file(tables, monkeypatch):
    """Cells derived by hand from made-up numbers: ratios to the baseline, 3 significant digits."""
    rows = {
        "plain q·k^T": {"time_ms": 80.0, "peak_mib": 128.0},
        "einsum (T,T,D) rkq": {"time_ms": 1800.0, "peak_mib": 1408.0},
        "score shaw": {"time_ms": 100.0, "peak_mib": 140.0},  # 1.25x; 18x faster; 1408/140 = 10.06
        "sdpa causal": {"time_ms": 50.0, "peak_mib": 4.0},
        "bias t5 (per forward)": {"time_ms": 150.0, "peak_mib": 260.0},  # 3x
        "sdpa + bias t5 (per layer)": {"time_ms": 51.0, "peak_mib": 8.0},  # 1.02x
    }
    data = {"machine": "M", "batch": 1, "heads": 8, "head_dim": 64, "dtype": "float32",
            "results": [{"length": 2048, "rows": rows}]}
    monkeypatch.setattr(tables, "load", lambda name: copy.deepcopy(data))
    scores = tables.render("relative_scores", "docs/relative.md")
    assert scores.splitlines()[2] == "| shaw | 1.25x | 18.0x | 10.1x |"
    assert "Machine: M. Command: `posenc speed relative --device cpu --lengths 512 1024 2048 4096" in scores
    assert "[relative_cpu.json](../benchmarks/results/relative_cpu.json)" in scores  # links relative to the page
    bias = tables.render("relative_bias", "docs/speed.md")
    assert bias.splitlines()[2] == "| t5 | 1.02x | 3.00x |"


def test_a_table_reads_only_its_declared_files_and_lives_only_on_its_pages(tables):
    with pytest.raises(ValueError, match="table 'rope_cpu' belongs in docs/speed.md, docs/rotary.md"):
        tables.render_page("README.md", "<!-- table: rope_cpu -->\n<!-- /table -->")
    entry = tables.TABLES["rope_cpu"]
    tables.TABLES["rope_cpu"] = type(entry)(entry.render, entry.pages, ("check_cpu",))
    try:
        with pytest.raises(ValueError, match="table 'rope_cpu' reads 'rope_cpu', which its manifest entry does not"):
            tables.render("rope_cpu", "docs/rotary.md")
    finally:
        tables.TABLES["rope_cpu"] = entry


def test_a_changed_results_file_fails_the_check(tables, monkeypatch):
    """Change one number in a results file: its README table no longer matches."""
    real = tables.load
    data = real("relative_cpu")
    for res in data["results"]:
        res["rows"]["score shaw"]["time_ms"] *= 2
    monkeypatch.setattr(tables, "load", lambda name: data if name == "relative_cpu" else real(name))
    text = (ROOT / "docs" / "speed.md").read_text()
    assert tables.render_page("docs/speed.md", text) != text


def test_unknown_table_name_is_an_error(tables):
    with pytest.raises(ValueError, match="unknown table 'nope'; known: .*rope_cpu"):
        tables.render_page("README.md", "<!-- table: nope -->\n<!-- /table -->")


def test_ratio_and_duration_formats(tables):
    from docsbuild.captions import duration, ratio  # on sys.path once tables.py is loaded

    assert [ratio(x) for x in (0.894, 2.186, 9.996, 17.18, 100.06, 153.4)] == \
        ["0.89x", "2.19x", "10.0x", "17.2x", "100x", "153x"]
    assert [duration(s) for s in (35.2, 380.0, 547.4)] == ["35 s", "6 min 20 s", "9 min 07 s"]


def test_a_table_from_several_files_states_a_shared_machine_once(tables):
    from docsbuild.captions import captions

    one = {"machine": "M", "command": "posenc a"}
    text = captions("docs/x.md", [("probe_smollm2", one, "first"), ("probe_gemma3", dict(one, command="posenc b"), "")])
    assert text.count(": M.") == 1 and text.startswith("Machine, for each file below: M.")
    assert "Command: `posenc a`; results: [probe_smollm2.json](../benchmarks/results/probe_smollm2.json). First." in text
    mixed = captions("README.md", [("probe_smollm2", one, ""), ("probe_gemma3", dict(one, machine="N"), "")])
    assert mixed.count("Machine: ") == 2


@pytest.mark.slow
def test_rerun_records_machine_command_and_wall_time(tables, tmp_path, monkeypatch):
    """--rerun runs the command in a fresh process and writes what the tables need."""
    monkeypatch.setattr(tables, "RESULTS_DIR", tmp_path)
    res = tables.Result("check_tiny.json", ("check", "none", "--json"), stdout="json")
    monkeypatch.setattr(tables, "RESULTS", {"check_tiny": res})
    wall = tables.rerun("check_tiny")
    data = json.loads((tmp_path / "check_tiny.json").read_text())
    assert data["command"] == "posenc check none --json > benchmarks/results/check_tiny.json"
    assert data["wall_s"] == wall > 0
    assert data["machine"] and list(data["results"]) == ["none"]
    # NoPE has nothing position-dependent to bound; it has no absolute position, as claimed.
    assert data["results"]["none"]["bounded"]["status"] == "n/a"
    assert data["results"]["none"]["absolute"]["verdict"] == "agrees"


# Prose may state goals, sizes and arithmetic, not measurements: a measured number belongs in a
# results file and a rendered table. What the pattern finds outside tables and code blocks must
# be one of these (page, text) pairs, each a goal, a size or a derived quantity, not a timing.
NOT_MEASUREMENTS = {
    ("docs/speed.md", "1.2x"),  # the RoPE goal
    ("docs/analysis.md", "× 500"),  # figure size in px
    ("docs/analysis.md", "5 %"),  # a check's threshold
    ("docs/bench.md", "10 %"),  # a learning-rate schedule setting
    ("docs/bench.md", "× 64"),  # batch shape
    ("docs/bench.md", "× 5"),  # passkey depths
    ("docs/bench.md", "95 %"),  # the confidence level of the intervals
    ("docs/choosing_an_extension.md", "95 %"),
    ("README.md", "95 %"),  # the confidence level of the intervals  # the confidence level of the intervals
    ("docs/real_models.md", "95 %"),  # the confidence level of the intervals
    ("docs/bench.md", "× 3"),  # tasks x seeds, depths: counts
    ("docs/bench.md", "× 32"),  # batch shape, examples per length
    ("docs/bench.md", "× 8"),  # encodings x tasks: a count
    ("docs/hf.md", "× 16"),  # the probe's raised-base factor, a setting
    ("docs/relative_bias.md", "1 GiB"),  # T*T*width*4 bytes, arithmetic
    ("docs/rotary.md", "4x"),  # an example factor
    ("docs/rotary.md", "3x"),  # memory traffic counted from the kernel, not timed
    ("docs/rotary.md", "1.2x"),  # the RoPE goal
}
_MEASURED = re.compile(r"\b\d+(?:\.\d+)?\s?(?:x|ms|s|min|GiB|MiB|tokens/s|tok/s|%)(?!\w)|×\s?\d[\d.]*")


def test_prose_quotes_no_measurement_outside_rendered_tables(tables):
    found = set()
    for page in tables.PAGES:
        if page == "docs/reliability.md":  # generated from error messages, not measurements
            continue
        text = re.sub(r"<!-- table: .*?<!-- /table -->", "", (ROOT / page).read_text(), flags=re.S)
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        found |= {(page, m.group(0)) for m in _MEASURED.finditer(text)}
    assert found, "the pattern finds nothing: it is broken"
    extra = found - NOT_MEASUREMENTS
    assert not extra, (f"numbers that look measured, outside a rendered table: {sorted(extra)}; put them in a "
                       "results file and a table (benchmarks/tables.py), or list them in NOT_MEASUREMENTS if not measured")


def test_the_encodings_table_names_every_registered_encoding():
    """The README's encodings table is hand-written (a sentence per encoding), so it is checked
    against the registry: a new encoding gets its row, a removed one loses it."""
    import posenc

    text = README.read_text()
    table = text[text.index("## Encodings"):text.index("## Results")]
    rows = re.findall(r"^\| `([a-z_0-9]+)`(?:, `([a-z_0-9]+)`)?", table, re.M)
    named = {n for row in rows for n in row if n}
    assert named == set(posenc.list_encodings()), (set(posenc.list_encodings()) ^ named)
