"""``posenc report``: a self-contained page whose images all load in a real headless browser."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest

from posenc.analysis import report as R
from posenc.analysis.probes import Probe
from posenc.cli import main

# A tiny 1x1 PNG (a valid file, written by hand: signature, IHDR, IDAT, IEND).
PNG_1x1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PROBE = Probe(d_model=32, num_heads=2, train_len=16, far_len=64, max_probe_position=256)
KINDS = ["sinusoidal-heatmap", "sinusoidal-dot"]


def browser() -> str | None:
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def _bench_results() -> dict:
    """A results.json as posenc bench writes it: 2 seeds, copy (L = 2), none and rope (+ YaRN)."""
    from posenc.bench.summary import collect

    def run(enc, seed, values, yarn=None):
        pts = [dict(variant="base", length=n + 1, depth=None, value=v) for n, v in enumerate(values)]
        pts += [dict(variant="yarn", length=n + 3, depth=None, value=v) for n, v in enumerate(yarn or [])]
        return dict(task="copy", encoding=enc, seed=seed, train_length=2, metric="accuracy", train_loss=0.1,
                    train_seconds=1.0, parameters=10, points=pts)

    records = [run("none", 0, [1.0, 1.0, 0.5, 0.25]), run("none", 1, [1.0, 0.5, 0.5, 0.5]),
               run("rope", 0, [1.0, 1.0, 0.0, 0.0], [0.5, 0.0]), run("rope", 1, [1.0, 1.0, 0.25, 0.0], [0.25, 0.0])]
    settings = dict(seeds=2, d_model=16, n_layer=1, n_head=2, steps=10, batch_size=4, lr=0.01)
    return json.loads(json.dumps(collect(settings, records)))  # NaN never reaches the file: null


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    bench = tmp_path_factory.mktemp("bench")
    (bench / "plots").mkdir()
    (bench / "plots" / "task_copy.png").write_bytes(PNG_1x1)
    results = _bench_results()
    (bench / "results.json").write_text(json.dumps({k: _nulls(v) for k, v in results.items()}))
    out = tmp_path_factory.mktemp("report")
    path = R.build_report(out, ["none", "sinusoidal"], KINDS, bench, PROBE)
    return path


def _nulls(obj):
    """NaN -> null, as posenc.bench.files.write_json writes strict JSON."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _nulls(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nulls(v) for v in obj]
    return obj


def test_bench_section_is_readable(page):
    """Settings, units, mean ± std, "as rope" instead of nan, the MRR interval, captions."""
    text = page.read_text()
    section = text[text.index("<h2>Benchmark</h2>"):]
    assert "nan" not in re.sub(r"<img [^>]+>", "", section).lower()
    assert "Settings: 2 seeds; model d_model 16, 1 layers, 2 heads; 10 steps, batch 4, lr 0.01" in section
    assert "<th>copy: accuracy % ≤L | &gt;L</th>" in section
    # none: inside (1.0, 0.75) -> 87.5 ± 17.7; beyond (0.375, 0.5) -> 43.8 ± 8.8
    assert "<td>none</td><td>87.5 ± 17.7 | 43.8 ± 8.8</td>" in section
    # rope + YaRN within L is the unscaled model; beyond (0.25, 0.125) -> 18.8 ± 8.8
    assert "<td>rope + YaRN</td><td>as rope | 18.8 ± 8.8</td>" in section
    # none ahead in both (task, seed) cells: MRR 1.0 [1.0, 1.0], rope 0.5
    assert "<tr><td>none</td><td>1.00</td><td>[1.00, 1.00]</td></tr>" in section
    assert "Significantly ahead (CI of the difference excludes 0): none &gt; rope" in section
    assert "<figcaption>copy: exact-match accuracy (%) against evaluation length" in section
    assert "task_copy.png" not in section


def test_page_is_self_contained(page):
    text = page.read_text()
    imgs = re.findall(r'<img src="([^"]+)"', text)
    assert len(imgs) == len(KINDS) + 1  # the figures and the benchmark PNG
    assert all(src.startswith("data:image/png;base64,") for src in imgs)
    assert not re.search(r'(src|href)="(https?:|file:|/)', text)  # nothing outside the page
    assert '<table id="checks">' in text and "<th>sinusoidal</th>" in text
    assert '<table id="bench">' in text and "copy" in text and '<table id="bench-mrr">' in text


def test_page_loads_in_headless_browser(page, tmp_path):
    exe = browser()
    if exe is None:
        pytest.skip("no chromium installed (apt-get install -y chromium) to open the report")
    cmd = [
        exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=5000", "--dump-dom", page.as_uri(),
    ]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body, f"no <body> in the dumped DOM: {dom[:300]!r}"
    n = len(KINDS) + 1
    assert f'data-images-loaded="{n}/{n}"' in body.group(0)
    assert 'data-images-ok="true"' in body.group(0)
    assert '<table id="checks">' in dom and "<th>none</th>" in dom


def test_bench_dir_without_results_is_a_note(tmp_path):
    (tmp_path / "empty").mkdir()
    html_part = R._bench_section(tmp_path / "empty")
    assert "No results.json" in html_part


def test_bad_inputs(tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path / "r"), "--bench", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["report", "--out", str(tmp_path / "r"), "--plots", "nope"]) == 2
    assert "valid kinds" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["report", "--out", str(blocker)]) == 2
    assert "--out" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        R.load_bench(tmp_path / "bad")
