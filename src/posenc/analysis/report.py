"""``posenc report --out DIR``: one self-contained HTML page of checks, figures and benchmarks.

The page embeds every image as base64 and needs no server or network: open
``DIR/report.html`` from disk. It holds

1. the property table of ``posenc check`` (cells coloured by agreement with the literature's
   claim for that encoding, the detail and the source on hover)
   with each check's claim, papers and measurement;
2. every figure of ``posenc plot`` (kinds whose family is missing are listed as skipped);
3. with ``--bench BDIR``: the benchmark's ``results.json`` summary table and its PNGs;
4. with ``--model MODEL_DIR``: ``posenc probe`` run on that Hugging Face checkpoint (layer 0:
   real q·k against distance, its frequency halves, raised base and scalings).

A small inline script marks ``<body data-images-ok="true">`` once every image has decoded
(``naturalWidth > 0``), so a headless browser can verify the page.

Examples::

    posenc report --out report
    posenc report --out report --bench bench_out
    posenc report --out report --encodings none sinusoidal rope --plots rope-score alibi
"""

from __future__ import annotations

import argparse
import base64
import datetime
import html
import json
from pathlib import Path
from typing import Any

from ..cli_args import existing_dir, int_at_least, output_dir
from .checks import CHECKS, claims
from .probes import Probe
from .runner import run_checks
from .plots import PLOTS, make_plot, prepare_out_dir

__all__ = ["build_report", "render_html", "load_bench"]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.agrees { background: #e3f6e3; } td.differs { background: #fbe3e3; }
td.untrained, td.noclaim, td.na { background: #f4f4f4; color: #555; } td.error { background: #ffd27f; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 13px; color: #444; } dt { font-weight: bold; margin-top: .6em; }
dd { margin-left: 1.5em; font-size: 14px; } .note { color: #777; font-size: 13px; }
"""

# Sets data-images-ok on <body> when every <img> has decoded: tests read it from the DOM.
_SCRIPT = """
(function () {
  function check() {
    var imgs = Array.prototype.slice.call(document.images);
    var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
    document.body.setAttribute("data-images-loaded", ok + "/" + imgs.length);
    document.body.setAttribute("data-images-ok", String(ok === imgs.length));
    if (ok === imgs.length) { document.title = "[images ok] " + document.title.replace(/^\\[images ok\\] /, ""); }
  }
  check();
  window.addEventListener("load", check);
})();
"""


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _check_table(results: dict) -> str:
    head = "".join(f"<th>{html.escape(title)}</th>" for title, _ in CHECKS.values())
    rows = []
    for name, res in results.items():
        cells = []
        for key in CHECKS:
            r = res.get(key)
            if r is None:
                cells.append("<td></td>")
                continue
            # Coloured by agreement with the literature's claim, not by the property itself:
            # ALiBi has no absolute position by design, and that agrees with its paper.
            cls = {"n/a": "na", "no claim": "noclaim", "": "noclaim"}.get(r.verdict, r.verdict)
            tip = r.detail + (f" | expected {r.expected}: {r.source}" if r.source else "")
            cells.append(f'<td class="{cls}" title="{html.escape(tip)}">{html.escape(r.cell())}</td>')
        rows.append(f"<tr><th>{html.escape(name)}</th>{''.join(cells)}</tr>")
    return f'<table id="checks"><tr><th>encoding</th>{head}</tr>{"".join(rows)}</table>'


def _legend() -> str:
    items = []
    for _, title, claim, papers, measured in claims():
        items.append(
            f"<dt>{html.escape(title)}</dt><dd>{html.escape(claim)}<br><i>{html.escape(papers)}</i>"
            f"<br>Measured: {html.escape(measured)}</dd>"
        )
    return f"<dl>{''.join(items)}</dl>"


def _rows_table(rows: list[dict], table_id: str) -> str:
    """A list of flat dicts as an HTML table (columns: the union of keys, in first-seen order)."""
    cols = list(dict.fromkeys(k for r in rows for k in r))

    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(r.get(c, '')))}</td>" for c in cols) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>'


def load_bench(bench_dir: str | Path) -> tuple[dict | None, list[Path]]:
    """(results.json content or None, PNG paths) of a ``posenc bench --out`` directory."""
    d = Path(bench_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"--bench {str(d)!r} is not a directory (give the --out directory of `posenc bench`)")
    results = None
    if (d / "results.json").is_file():
        try:
            results = json.loads((d / "results.json").read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{d / 'results.json'} is not valid JSON: {e}") from None
    pngs = sorted(d.glob("*.png")) + sorted(d.glob("plots/*.png"))
    return results, pngs


def _bench_tables(results: dict) -> list[str]:
    """Settings, the summary table (units in the headers, no ``nan``), the MRR with its
    interval, and which ranking differences are significant."""
    from ..bench.report import settings_text, significance_lines, table_cells

    head, rows = table_cells(results)
    seeds = max((r["seeds"] for r in results["summary"]), default=1)
    parts = [f'<p class="note">Settings: {html.escape(settings_text(results))}.</p>']
    th = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    parts.append(f'<table id="bench"><tr>{th}</tr>{body}</table>')
    spread = f"mean ± std over {seeds} seeds" if seeds > 1 else "one seed, so no spread"
    parts.append(f'<p class="note">Each cell: within the training length (≤L) | beyond it (>L), {spread}. '
                 "Accuracy is exact match in %; perplexity is per byte (lower is better). "
                 "“as rope”: a training-free RoPE scaling changes the model beyond L only.</p>")
    rank = results.get("ranking")
    if rank and rank.get("intervals"):
        level = round(100 * rank["method"]["confidence"])
        parts.append("<h3>Ranking beyond the training length (mean reciprocal rank)</h3>")
        mrr_rows = "".join(f"<tr><td>{html.escape(i['encoding'])}</td><td>{i['mrr']:.2f}</td>"
                           f"<td>[{i['low']:.2f}, {i['high']:.2f}]</td></tr>" for i in rank["intervals"])
        parts.append(f'<table id="bench-mrr"><tr><th>encoding</th><th>MRR (1 = best on every task)</th>'
                     f"<th>{level} % CI</th></tr>{mrr_rows}</table>")
        parts.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in significance_lines(results)) + "</ul>")
    return parts


def _bench_section(bench_dir: Path) -> str:
    from ..bench.report import figure_captions
    from ..bench.summary import load_results

    _, pngs = load_bench(bench_dir)
    parts = ["<h2>Benchmark</h2>"]
    results, captions = None, {}
    if (bench_dir / "results.json").is_file():
        try:
            results = load_results(bench_dir)
            parts += _bench_tables(results)
            captions = figure_captions(results)
        except (ValueError, KeyError, TypeError) as e:  # not a posenc bench results file
            parts.append(f'<p class="note">{html.escape(str(bench_dir / "results.json"))} could not be read as '
                         f"posenc bench results: {html.escape(str(e))}</p>")
    if results is None and not pngs and len(parts) == 1:
        return parts[0] + f'<p class="note">No results.json or PNGs in {html.escape(str(bench_dir))}.</p>'
    kinds = ("task_", "scaling_", "passkey_depth")  # each task's curves first, then scalings, then depth
    order = lambda p: (next((i for i, k in enumerate(kinds) if p.stem.startswith(k)), len(kinds)), p.name)  # noqa: E731
    for p in sorted(pngs, key=order):
        text = captions.get(p.stem, p.stem.replace("_", " "))
        parts.append(f"<figure>{_img(p, text)}<figcaption>{html.escape(text)}</figcaption></figure>")
    return "\n".join(parts)


def render_html(results: dict, figures: list, skipped: dict[str, str], bench_html: str, probe: Probe) -> str:
    """The page: check table and legend, figures, skipped kinds, benchmark section."""
    from .. import __version__

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    figs = "\n".join(
        f'<figure id="fig-{f.kind}">{_img(f.path, f.kind)}<figcaption><b>{html.escape(f.kind)}</b>: '
        f"{html.escape(f.title)}. {html.escape(' '.join((PLOTS[f.kind].__doc__ or '').split()))}</figcaption></figure>"
        for f in figures
    )
    skip = "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in skipped.items())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>posenc report</title><style>{_CSS}</style></head>
<body>
<h1>posenc report</h1>
<p class="note">posenc {__version__}, {when}. Probe: d_model {probe.d_model}, {probe.num_heads} heads,
training length L = {probe.train_len}, curves to {probe.far_len}, positions tried up to {probe.max_probe_position}.
Every cell is measured by running the encoding's hooks; hover a cell for its detail.</p>
<h2>Properties</h2>
{_check_table(results)}
{_legend()}
<h2>Figures</h2>
{figs}
{f"<p class='note'>Figures skipped:</p><ul>{skip}</ul>" if skip else ""}
{bench_html}
<script>{_SCRIPT}</script>
</body></html>
"""


def build_report(
    out: str | Path,
    names: list[str] | None = None,
    kinds: list[str] | None = None,
    bench: str | Path | None = None,
    probe: Probe | None = None,
    model: str | Path | None = None,
) -> Path:
    """Run the checks and plots, write ``out/report.html`` (figures also under ``out/figures``)."""
    out_dir = prepare_out_dir(out)
    probe = Probe() if probe is None else probe
    kinds = list(PLOTS) if not kinds else list(kinds)
    for k in kinds:
        if k not in PLOTS:
            raise ValueError(f"unknown plot kind {k!r}; valid kinds: {', '.join(PLOTS)}")
    bench_html = _bench_section(Path(bench)) if bench is not None else ""
    if model is not None:  # a checkpoint's probe, written under out/probe
        from ..hf.probe import report_section

        bench_html += report_section(model, out_dir / "probe")
    results = run_checks(names, probe)
    figures, skipped = [], {}
    for k in kinds:
        try:
            figures.append(make_plot(k, out_dir / "figures"))
        except ValueError as e:  # a family this figure needs is not in this build
            skipped[k] = str(e)
    path = out_dir / "report.html"
    path.write_text(render_html(results, figures, skipped, bench_html, probe), encoding="utf-8")
    return path


def _cmd_report(args: argparse.Namespace) -> int:
    for k in args.plots or []:  # before anything is written
        if k not in PLOTS:
            raise ValueError(f"--plots: unknown plot kind {k!r}; valid kinds: {', '.join(PLOTS)}")
    probe = Probe(train_len=args.train_len)
    path = build_report(args.out, args.encodings, args.plots, args.bench, probe, model=args.model)
    print(f"wrote {path}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="write one self-contained HTML page: checks, figures, benchmark")
    p.add_argument("--out", type=output_dir, required=True, help="directory for report.html (and figures/)")
    p.add_argument("--bench", type=existing_dir, default=None, help="output directory of `posenc bench` to embed (results.json, PNGs)")
    p.add_argument("--model", type=existing_dir, default=None, metavar="MODEL_DIR",
                   help="a local Hugging Face checkpoint to probe (posenc probe: layer 0, q·k against distance)")
    p.add_argument("--encodings", nargs="+", default=None, metavar="NAME", help="encodings to check (default: all)")
    p.add_argument("--plots", nargs="+", default=None, metavar="KIND", help="plot kinds to include (default: all)")
    p.add_argument("--train-len", type=int_at_least(8), default=128, help="training length L of the checks (default 128)")
    p.set_defaults(func=_cmd_report)
