"""``posenc report``: a self-contained page whose images all load in a real headless browser."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest

from posenc.analysis import report as R
from posenc.analysis.checks import Probe
from posenc.cli import main

# A tiny 1x1 PNG (a valid file, written by hand: signature, IHDR, IDAT, IEND).
PNG_1x1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PROBE = Probe(d_model=32, num_heads=2, train_len=16, far_len=64, max_probe_position=256)
KINDS = ["sinusoidal-heatmap", "sinusoidal-dot"]


def browser() -> str | None:
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    bench = tmp_path_factory.mktemp("bench")
    (bench / "plots").mkdir()
    (bench / "plots" / "accuracy.png").write_bytes(PNG_1x1)
    results = {
        "format": "posenc-bench-results-1",
        "summary": [{"task": "copy", "encoding": "rope", "variant": "base", "in_mean": 0.98, "beyond_mean": 0.12}],
        "mrr": {"rope": 1.0},
    }
    (bench / "results.json").write_text(json.dumps(results))
    out = tmp_path_factory.mktemp("report")
    path = R.build_report(out, ["none", "sinusoidal"], KINDS, bench, PROBE)
    return path


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
