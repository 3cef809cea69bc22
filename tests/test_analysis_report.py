"""``posenc report``: a self-contained page whose images all load in a real headless browser."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from posenc.analysis import report as R
from posenc.analysis.figures import FIGURES, select_figures
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
    """NaN -> null, as posenc.files.write_json writes strict JSON."""
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
    section = text[text.index('<h2 id="benchmark">Benchmark</h2>'):]
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


def loaded_dom(page: Path, tmp_path: Path) -> tuple[str, str]:
    """``page``'s DOM as headless Chromium leaves it after running its script, and its <body> tag."""
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
    return dom, body.group(0)


def test_page_loads_in_headless_browser(page, tmp_path):
    dom, body = loaded_dom(page, tmp_path)
    n = len(KINDS) + 1
    assert f'data-images-loaded="{n}/{n}"' in body
    assert 'data-images-ok="true"' in body
    assert '<table id="checks">' in dom and "<th>none</th>" in dom


# ---- a real model first ------------------------------------------------------------------------
def test_select_figures_by_what_they_concern():
    """A figure is kept when what it explains is in hand; "every encoding" figures whenever any is."""
    kinds = list(FIGURES)
    assert select_figures(kinds, set()) == []
    assert select_figures(kinds, {"cope"}) == ["cope-positions", "randomized-positions"]
    rope = select_figures(kinds, {"rope"})
    assert {"rope-decay", "rope-score", "rope-bands", "rope-scaling"} <= set(rope)
    assert not any(k.startswith(("sinusoidal", "t5", "alibi", "deberta")) for k in rope)
    assert "rope-dropped-frequencies" in select_figures(kinds, {"hope"})


@pytest.fixture(scope="module")
def model_page(tmp_path_factory):
    """A report given a real checkpoint's probe and bench --model folders (a tiny random Llama
    saved with transformers; `posenc probe` and `posenc bench --model` run on it as the demo runs
    them), checking ALiBi only: the page must lead with the model and keep RoPE's figures."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ckpt = tmp_path_factory.mktemp("tiny_llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(ckpt)
    probe_dir, bench_dir = tmp_path_factory.mktemp("probe"), tmp_path_factory.mktemp("mbench")
    assert main(["probe", str(ckpt), "--out", str(probe_dir), "--tokens", "32", "--points", "32", "--extend", "2",
                 "--threads", "1", "--no-progress"]) == 0
    assert main(["bench", "--model", str(ckpt), "--tasks", "lm", "--lm-eval-factors", "1", "2", "--threads", "1",
                 "--out", str(bench_dir), "--overwrite", "--no-progress"]) == 0
    out = tmp_path_factory.mktemp("report_model")
    return R.build_report(out, ["alibi"], None, None, PROBE, probes=[probe_dir], model_bench=bench_dir)


def test_page_leads_with_the_real_model(model_page):
    text = model_page.read_text()
    order = [text.index(s) for s in ('<h2 id="summary">', '<nav id="contents">', "beyond its length</h2>",
                                     "<h2>Checkpoint probe:", '<h2 id="properties">', '<h2 id="figures">')]
    assert order == sorted(order), order
    summary = text[text.index('<ul class="summary">'):text.index("</ul>", text.index('<ul class="summary">'))]
    assert "layer 0" in summary and ("holds" in summary or "does not hold" in summary)
    assert "token perplexity (lower is better) at 128 tokens (2 L" in summary
    assert "1 encodings checked on" in summary
    # the contents link every section, and every link has its anchor
    anchors = re.findall(r'<a href="#([^"]+)">', text)
    assert len(anchors) == 4 and all(f'id="{a}"' in text for a in anchors)
    assert '<pre id="model-bench">' in text and "token perplexity" in text


def test_page_keeps_the_figures_about_its_model(model_page):
    """ALiBi's figure and RoPE's (the real model's encoding, shown first); no sinusoidal one."""
    text = model_page.read_text()
    shown = re.findall(r'<figure id="fig-([a-z0-9-]+)">', text)
    assert shown[:4] == ["rope-decay", "rope-score", "rope-bands", "rope-scaling"]
    assert "alibi" in shown and "randomized-positions" in shown
    assert not any(k.startswith(("sinusoidal", "t5", "deberta", "cope")) for k in shown)
    left = text[text.index("Left out (about nothing on this page)"):]
    assert "sinusoidal-heatmap" in left and "cope-positions" in left
    assert text.index("the real model's encoding</h3>") < text.index('id="fig-rope-decay"') < text.index(
        "<h3>The other encodings</h3>") < text.index('id="fig-alibi"')
    # a figure about every encoding is not about the real model in particular
    assert text.index("<h3>The other encodings</h3>") < text.index('id="fig-randomized-positions"')
    assert ":meth:" not in text and "``" not in text  # captions are plain text


def test_model_page_loads_in_headless_browser(model_page, tmp_path):
    _, body = loaded_dom(model_page, tmp_path)
    assert 'data-images-ok="true"' in body, body
    n = len(re.findall(r"<img ", model_page.read_text()))
    assert n >= 8 and f'data-images-loaded="{n}/{n}"' in body


def test_probe_folder_errors(tmp_path):
    from posenc.analysis.real_model import load_probe

    with pytest.raises(FileNotFoundError, match="holds no probe.json"):
        load_probe(tmp_path)
    (tmp_path / "probe.json").write_text("{}")
    with pytest.raises(ValueError, match="not a posenc probe result"):
        load_probe(tmp_path)


def test_benchmark_log_axes_have_enough_labelled_ticks():
    """The report's perplexity figures (log axes): at least three labelled y ticks in view and
    every evaluated length labelled, on the committed quick run."""
    from pathlib import Path

    from posenc.bench import figures
    from posenc.results import read_results

    results = read_results(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "bench_quick.json")
    fig = figures(results)["task_lm"]
    fig.canvas.draw()
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    shown = [t.get_text() for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi and t.get_text()]
    assert len(shown) >= 3, shown
    lengths = sorted({p["length"] for r in results["runs"] if r["task"] == "lm" for p in r["points"]})
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(n) for n in lengths]


def test_model_bench_cells_rows_and_lines(tmp_path):
    """A bench --model results file read back in the model's units: passkey % as the mean over
    depths, a scaling row by its registry label, the raised base by its factor; rows equal at
    every length drawn as one line (a scaling is the model itself up to L)."""
    from posenc.analysis.real_model import model_bench_cells, model_bench_summary, plot_model_bench

    def pt(v, n, x, d=None):
        return dict(variant=v, length=n, depth=d, value=x)

    results = {"settings": {"label": "m", "trained_length": 4, "raised_base": 16.0, "scalings": ["ntk", "dynamic"]},
               "runs": [{"task": "lm", "points": [pt("base", 4, 10.0), pt("base", 8, 12.0), pt("ntk", 8, 11.0),
                                                   pt("dynamic", 8, 11.0), pt("raised_base", 8, 13.0)]},
                        {"task": "passkey", "points": [pt("base", 4, 1.0, 0.0), pt("base", 4, 0.0, 1.0),
                                                        pt("base", 8, 0.0, 0.0), pt("base", 8, 0.0, 1.0),
                                                        pt("ntk", 8, 1.0, 0.0), pt("ntk", 8, 1.0, 1.0)]}]}
    cells = model_bench_cells(results)
    assert cells["lm"] == {"m": {4: 10.0, 8: 12.0}, "+ NTK-aware": {8: 11.0}, "+ dynamic NTK": {8: 11.0},
                           "+ base x16": {8: 13.0}}
    assert cells["passkey"] == {"m": {4: 50.0, 8: 0.0}, "+ NTK-aware": {8: 100.0}}
    lm, pk = model_bench_summary(results)
    assert "at 8 tokens (2 L, L stated as 4): + NTK-aware 11.00, + dynamic NTK 11.00, m 12.00, + base x16 13.00" in lm
    assert pk.endswith("+ NTK-aware 100 %, m 0 %")
    res = plot_model_bench(results, tmp_path)
    assert res.path.is_file()
    assert res.data["lines"]["lm"] == [["m"], ["+ NTK-aware", "+ dynamic NTK"], ["+ base x16"]]
