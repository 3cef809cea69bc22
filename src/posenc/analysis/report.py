"""``posenc report --out DIR``: one self-contained HTML page of checks, figures and benchmarks.

The page embeds every image as base64 and needs no server or network: open
``DIR/report.html`` from disk. It leads with what the reader came for: a summary (one line per
result) and a table of contents, then

1. a real model's results, when given: ``--probe PDIR`` (a ``posenc probe --out`` folder: the
   three claims' verdicts with their numbers, the curves' window means, the figures) and
   ``--model-bench MDIR`` (a ``posenc bench --model --out`` folder: token perplexity and passkey
   beyond the stated L, per scaling, as a table and a figure); ``--model MODEL_DIR`` runs the
   probe on that checkpoint first;
2. with ``--bench BDIR``: the benchmark's ``results.json`` summary table and its PNGs;
3. the property table of ``posenc check`` (cells coloured by agreement with the literature's
   claim for that encoding, the detail and the source on hover) with each check's claim,
   papers and measurement;
4. the figures that concern what the page is about (:data:`posenc.analysis.plots.CONCERNS`: the
   checked and benchmarked encodings, the real model's RoPE and the scalings it was measured
   with), the real model's first; the others are listed as left out.

A small inline script marks ``<body data-images-ok="true">`` once every image has decoded
(``naturalWidth > 0``), so a headless browser can verify the page.

Examples::

    posenc report --out report
    posenc report --out report --bench bench_out
    posenc report --out report --probe out/probe_smollm2 --model-bench out/bench_smollm2
    posenc report --out report --encodings none sinusoidal rope --plots rope-score alibi
"""

from __future__ import annotations

import argparse
import base64
import datetime
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cli.args import existing_dir, int_at_least, output_dir
from ..rotary.scaling import SCALINGS
from .checks import CHECKS, claims
from .probes import Probe
from .runner import run_checks
from .family_figures import ANY_ENCODING
from .plots import CONCERNS, PLOTS, make_plot, prepare_out_dir
from .real_model import (load_probe, model_bench_summary, model_concerns, model_name, plot_model_bench,
                         probe_summary)

__all__ = ["Section", "bench_encodings", "build_report", "load_bench", "render_html", "select_figures"]

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
td.ok { background: #e3f6e3; } td.bad { background: #fbe3e3; } pre { font-size: 13px; background: #f7f7f7; padding: .6em; }
ul.summary li { margin: .3em 0; } nav ol { columns: 2; font-size: 14px; }
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
    parts = ['<h2 id="benchmark">Benchmark</h2>']
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


@dataclass
class Section:
    """A part of the page: its anchor, its title in the contents, its HTML (headed by itself)."""

    anchor: str
    title: str
    body: str


def _probe_section(probe_dir: Path) -> tuple[Section, list[str], dict]:
    """A ``posenc probe --out`` folder as a section, with its summary lines and its data."""
    from ..hf.probe.render import html_section
    data, figures = load_probe(probe_dir)
    name = model_name(data)
    shown = html_section({**data, "model": name}, figures, probe_dir / "probe.json")  # by name, not cache folder
    body = f'<section id="probe-{html.escape(name)}">{shown}</section>'
    return Section(f"probe-{name}", f"Real model: {name}, q·k against distance", body), probe_summary(data), data


def load_model_bench(bench_dir: Path) -> dict:
    """results.json of a ``posenc bench --model --out`` folder; a clear error for anything else."""
    from ..bench.summary import load_results

    if not (bench_dir / "results.json").is_file():
        raise FileNotFoundError(f"--model-bench {str(bench_dir)!r} holds no results.json (give the --out folder of "
                                "`posenc bench --model`)")
    results = load_results(bench_dir)
    if "trained_length" not in results["settings"]:
        raise ValueError(f"--model-bench {str(bench_dir)!r} holds synthetic bench results (give them to --bench); "
                         "--model-bench reads `posenc bench --model` results")
    return results


def _model_bench_section(bench_dir: Path, fig_dir: Path) -> tuple[Section, list[str], dict]:
    """A ``posenc bench --model --out`` folder as a section: its table in the model's units (the
    command's own text), one figure against length, its summary lines, and its results."""
    from ..hf.bench_model import format_model_table
    results = load_model_bench(bench_dir)
    s = results["settings"]
    name = model_name(s)
    png = plot_model_bench(results, fig_dir).path
    note = (f"L is stated as {s['trained_length']} tokens (the checkpoint was trained longer): the procedure at a "
            f"small size, not a measurement of length extension. Passkey: {s['passkey_examples']} example(s) per "
            f"depth at depths {', '.join(f'{d:g}' for d in s['passkey_depths'])}. Data in "
            f"{bench_dir / 'results.json'}.")
    body = (f'<section id="model-bench-{html.escape(name)}"><h2>Real model: {html.escape(name)} beyond its length</h2>'
            f'<p class="note">{html.escape(note)}</p><pre id="model-bench">{html.escape(format_model_table(results))}</pre>'
            f"<figure>{_img(png, 'model_bench')}<figcaption>Each row against length; rows that coincide are drawn "
            f"once and named together.</figcaption></figure></section>")
    return Section(f"model-bench-{name}", f"Real model: {name} beyond its length", body), model_bench_summary(results), results


def _check_summary(results: dict) -> str:
    """How many check cells agree with the literature, differ, or have no claim."""
    counts: dict[str, int] = {}
    for res in results.values():
        for r in res.values():
            key = {"agrees": "agree", "differs": "differ", "error": "failed to run"}.get(r.verdict, "other")
            counts[key] = counts.get(key, 0) + 1
    parts = [f"{counts[k]} {k}" for k in ("agree", "differ", "failed to run") if counts.get(k)]
    return (f"{len(results)} encodings checked on {len(CHECKS)} properties: {', '.join(parts) or 'no cell'} with "
            f"the literature's claim ({counts.get('other', 0)} cells untrained, without a claim or not applicable)")


def _bench_summary(bench_dir: Path) -> list[str]:
    from ..bench.summary import load_results

    try:
        results = load_results(bench_dir)
    except (OSError, ValueError, KeyError):
        return []
    rows = results.get("summary") or []
    encodings = {r["encoding"] for r in rows}
    tasks = {r["task"] for r in rows}
    seeds = max((r["seeds"] for r in rows), default=0)
    line = f"Benchmark: {len(encodings)} encodings × {len(tasks)} tasks × {seeds} seed(s)"
    rank = (results.get("ranking") or {}).get("intervals") or []
    if rank:
        best = max(rank, key=lambda i: i["mrr"])
        line += (f"; highest mean reciprocal rank beyond L: {best['encoding']} {best['mrr']:.2f} "
                 f"[{best['low']:.2f}, {best['high']:.2f}]")
    return [line]


def bench_encodings(bench_dir: Path) -> set[str]:
    """The registered encodings a bench folder ran (variants ``rope:base=5e5`` by their name)."""
    from ..bench.summary import load_results

    try:
        rows = load_results(bench_dir).get("summary") or []
    except (OSError, ValueError, KeyError):
        return set()
    return {str(r["encoding"]).split("@")[0].split(":")[0] for r in rows}


def select_figures(kinds: list[str], in_hand: set[str], *, any_encoding: bool = True) -> list[str]:
    """The kinds whose figure concerns something in hand (CONCERNS), in PLOTS order; with
    ``any_encoding``, also those about every encoding whenever something is in hand."""
    return [k for k in kinds
            if (set(CONCERNS[k]) & in_hand) or (any_encoding and ANY_ENCODING in CONCERNS[k] and in_hand)]


def _plain(doc: str) -> str:
    """A docstring as caption text: one line, Sphinx roles and literals without their markup."""
    text = re.sub(r":\w+:`~?([^`]*)`", r"\1", " ".join(doc.split()))
    return text.replace("``", "")


def _figure_html(f) -> str:
    about = ", ".join("every encoding" if c == ANY_ENCODING else c for c in CONCERNS[f.kind])
    doc = _plain(PLOTS[f.kind].__doc__ or "")
    return (f'<figure id="fig-{f.kind}">{_img(f.path, f.kind)}<figcaption><b>{html.escape(f.kind)}</b>: '
            f"{html.escape(f.title)}. {html.escape(doc)} <i>About: {html.escape(about)}.</i></figcaption></figure>")


def _figures_section(chosen: list[str], model_in_hand: set[str], fig_dir: Path) -> tuple[Section, str]:
    """The chosen figures, those about the real model's RoPE and scalings first under their own
    heading, the kinds left out named; and the summary's line about them."""
    model_kinds = set(select_figures(chosen, model_in_hand, any_encoding=False))
    chosen = [k for k in chosen if k in model_kinds] + [k for k in chosen if k not in model_kinds]
    figures, skipped = [], {}
    for k in chosen:
        try:
            figures.append(make_plot(k, fig_dir))
        except ValueError as e:  # a family this figure needs is not in this build
            skipped[k] = str(e)
    left_out = [k for k in PLOTS if k not in chosen]
    parts = ['<h2 id="figures">Figures</h2>']
    if model_kinds:
        parts.append("<h3>RoPE and its scalings: the real model's encoding</h3>")
        parts += [_figure_html(f) for f in figures if f.kind in model_kinds]
        parts.append("<h3>The other encodings</h3>")
    parts += [_figure_html(f) for f in figures if f.kind not in model_kinds]
    if skipped:
        parts.append("<p class='note'>Figures skipped:</p><ul>"
                     + "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in skipped.items()) + "</ul>")
    if left_out:
        parts.append(f"<p class='note'>Left out (about nothing on this page): {html.escape(', '.join(left_out))}; "
                     "`posenc plot KIND` draws any of them.</p>")
    line = (f"{len(figures)} figures about what this page covers"
            + (f" ({len(model_kinds)} about the real model's RoPE and scalings, shown first)" if model_kinds else "")
            + (f"; {len(left_out)} left out" if left_out else ""))
    return Section("figures", "Figures", "\n".join(parts)), line


def render_html(summary: list[str], sections: list[Section]) -> str:
    """The page: title, summary, contents, then each section in order."""
    from .. import __version__

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    items = "".join(f"<li>{html.escape(x)}</li>" for x in summary)
    toc = "".join(f'<li><a href="#{html.escape(s.anchor)}">{html.escape(s.title)}</a></li>' for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>posenc report</title><style>{_CSS}</style></head>
<body>
<h1>posenc report</h1>
<p class="note">posenc {__version__}, {when}.</p>
<h2 id="summary">Summary</h2>
<ul class="summary">{items}</ul>
<nav id="contents"><h2>Contents</h2><ol>{toc}</ol></nav>
{"".join(s.body for s in sections)}
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
    *,
    probes: list[str | Path] | None = None,
    model_bench: str | Path | None = None,
) -> Path:
    """Run the checks and plots, write ``out/report.html`` (figures also under ``out/figures``).

    ``probes``: ``posenc probe --out`` folders and ``model_bench``: a ``posenc bench --model
    --out`` folder, shown first; ``model``: a checkpoint probed into ``out/probe`` first.
    ``kinds``: the figures (default: those that concern the checked and benchmarked encodings
    and the real model)."""
    for k in kinds or []:
        if k not in PLOTS:
            raise ValueError(f"unknown plot kind {k!r}; valid kinds: {', '.join(PLOTS)}")
    probe_dirs = [Path(p) for p in probes or []]
    for d in probe_dirs:  # every folder given is read before anything is written
        load_probe(d)
    if model_bench is not None:
        load_model_bench(Path(model_bench))
    out_dir = prepare_out_dir(out)
    probe = Probe() if probe is None else probe
    if model is not None:  # a checkpoint's probe, written under out/probe
        from ..hf.probe import probe as run_probe

        run_probe(model, out_dir / "probe", None, progress=False)
        probe_dirs.append(out_dir / "probe")
    sections: list[Section] = []
    summary: list[str] = []
    probe_data, bench_results = [], None
    for d in probe_dirs:
        section, lines, data = _probe_section(d)
        sections.append(section)
        summary += lines
        probe_data.append(data)
    if model_bench is not None:
        section, lines, bench_results = _model_bench_section(Path(model_bench), out_dir / "figures")
        sections.append(section)
        summary += lines
    if bench is not None:
        sections.append(Section("benchmark", "Benchmark", _bench_section(Path(bench))))
        summary += _bench_summary(Path(bench))
    results = run_checks(names, probe)
    summary.append(_check_summary(results))
    sections.append(Section("properties", "Properties", f'<h2 id="properties">Properties</h2>'
                            f'<p class="note">Probe: d_model {probe.d_model}, {probe.num_heads} heads, training length '
                            f"L = {probe.train_len}, curves to {probe.far_len}, positions tried up to "
                            f"{probe.max_probe_position}. Every cell is measured by running the encoding's hooks; "
                            f"hover a cell for its detail.</p>{_check_table(results)}{_legend()}"))
    # the figures about what the page is about: the real model's (RoPE, its scalings) first
    model_in_hand = set()
    if probe_data or bench_results is not None:
        model_in_hand = model_concerns(bench_results, probe_data[0] if probe_data else None)
    in_hand = set(results) | (bench_encodings(Path(bench)) if bench is not None else set()) | model_in_hand
    if "rope" in in_hand:  # a RoPE on the page is a RoPE with any of the registry's scalings
        in_hand |= set(SCALINGS)
    section, line = _figures_section(list(kinds) if kinds else select_figures(list(PLOTS), in_hand), model_in_hand,
                                     out_dir / "figures")
    sections.append(section)
    summary.append(line)
    path = out_dir / "report.html"
    path.write_text(render_html(summary, sections), encoding="utf-8")
    return path


def _cmd_report(args: argparse.Namespace) -> int:
    for k in args.plots or []:  # before anything is written
        if k not in PLOTS:
            raise ValueError(f"--plots: unknown plot kind {k!r}; valid kinds: {', '.join(PLOTS)}")
    probe = Probe(train_len=args.train_len)
    path = build_report(args.out, args.encodings, args.plots, args.bench, probe, model=args.model,
                        probes=args.probe, model_bench=args.model_bench)
    print(f"wrote {path}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="write one self-contained HTML page: real model, benchmark, checks, figures")
    p.add_argument("--out", type=output_dir, required=True, help="directory for report.html (and figures/)")
    p.add_argument("--probe", type=existing_dir, nargs="+", default=None, metavar="PROBE_DIR",
                   help="output folder(s) of `posenc probe` to show first (probe.json and its figures)")
    p.add_argument("--model-bench", type=existing_dir, default=None, metavar="MODEL_BENCH_DIR",
                   help="output folder of `posenc bench --model` to show first (the checkpoint beyond its length)")
    p.add_argument("--bench", type=existing_dir, default=None, help="output directory of `posenc bench` to embed (results.json, PNGs)")
    p.add_argument("--model", type=existing_dir, default=None, metavar="MODEL_DIR",
                   help="a local Hugging Face checkpoint to probe first (posenc probe: layer 0, q·k against distance)")
    p.add_argument("--encodings", nargs="+", default=None, metavar="NAME", help="encodings to check (default: all)")
    p.add_argument("--plots", nargs="+", default=None, metavar="KIND",
                   help="plot kinds to include (default: those about the encodings and the model on the page)")
    p.add_argument("--train-len", type=int_at_least(8), default=128, help="training length L of the checks (default 128)")
    p.set_defaults(func=_cmd_report)
