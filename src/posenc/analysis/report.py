"""``posenc report``: one self-contained HTML page of checks, figures and benchmarks.

The page (:mod:`.report_page`) embeds every image as base64 and needs no server or network:
open ``DIR/report.html`` from disk. It leads with what the reader came for: a summary (one line
per result) and a table of contents, then

1. a real model's results, when given: ``probes`` (``posenc probe --out`` folders: the three
   claims' verdicts with their numbers, the curves' window means, the figures) and
   ``model_bench`` (a ``posenc bench --model --out`` folder: token perplexity and passkey beyond
   the stated L, per scaling, as a table and a figure); ``model`` is a checkpoint probed first;
2. with ``bench``: the benchmark's ``results.json`` summary table and its PNGs
   (:mod:`.report_bench`);
3. the property table of ``posenc check`` (cells coloured by agreement with the literature's
   claim for that encoding, the detail and the source on hover) with each check's claim,
   papers and measurement;
4. the figures that concern what the page is about (each entry's concerns in
   :data:`posenc.analysis.figures.FIGURES`: the checked and benchmarked encodings, the real
   model's RoPE and the scalings it was measured with), the real model's first; the others are
   listed as left out.
"""

from __future__ import annotations

import html
from pathlib import Path

from ..rotary import SCALINGS
from .canvas import PlotResult, prepare_out_dir
from .checks import CHECKS, claims
from .figures import FIGURES, make_plot, select_figures
from .probes import Probe
from .real_model import load_probe, model_concerns, model_name, probe_summary
from .report_bench import bench_section, load_bench, load_model_bench, model_bench_section
from .report_page import Section, img, render_html
from .runner import run_checks

__all__ = ["build_report"]


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


def _probe_section(probe_dir: Path) -> tuple[Section, list[str], dict]:
    """A ``posenc probe --out`` folder as a section, with its summary lines and its data."""
    from ..hf.probe.render import html_section
    data, figures = load_probe(probe_dir)
    name = model_name(data)
    shown = html_section({**data, "model": name}, figures, probe_dir / "probe.json")  # by name, not cache folder
    body = f'<section id="probe-{html.escape(name)}">{shown}</section>'
    return Section(f"probe-{name}", f"Real model: {name}, q·k against distance", body), probe_summary(data), data


def _figure_html(f: PlotResult) -> str:
    entry = FIGURES[f.kind]
    return (f'<figure id="fig-{f.kind}">{img(f.path, f.kind)}<figcaption><b>{html.escape(f.kind)}</b>: '
            f"{html.escape(f.title)}. {html.escape(entry.caption)} <i>About: {html.escape(entry.about)}.</i>"
            "</figcaption></figure>")


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
    left_out = [k for k in FIGURES if k not in chosen]
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
        if k not in FIGURES:
            raise ValueError(f"unknown plot kind {k!r}; valid kinds: {', '.join(FIGURES)}")
    probe_dirs = [Path(p) for p in probes or []]
    for d in probe_dirs:  # every folder given is read before anything is written
        load_probe(d)
    bench_results = load_model_bench(Path(model_bench)) if model_bench is not None else None
    bench_folder = load_bench(bench) if bench is not None else None
    out_dir = prepare_out_dir(out)
    probe = Probe() if probe is None else probe
    if model is not None:  # a checkpoint's probe, written under out/probe
        from ..hf.probe import probe as run_probe

        run_probe(model, out_dir / "probe", None, progress=False)
        probe_dirs.append(out_dir / "probe")
    sections: list[Section] = []
    summary: list[str] = []
    if model_bench is not None:  # the report leads with the real model past its length
        section, lines = model_bench_section(bench_results, Path(model_bench), out_dir / "figures")
        sections.append(section)
        summary += lines
    probe_data = []
    for d in probe_dirs:
        section, lines, data = _probe_section(d)
        sections.append(section)
        summary += lines
        probe_data.append(data)
    if bench_folder is not None:
        sections.append(Section("benchmark", "Benchmark", bench_section(bench_folder)))
        summary += bench_folder.summary()
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
    in_hand = set(results) | (bench_folder.encodings() if bench_folder is not None else set()) | model_in_hand
    if "rope" in in_hand:  # a RoPE on the page is a RoPE with any of the registry's scalings
        in_hand |= set(SCALINGS)
    section, line = _figures_section(list(kinds) if kinds else select_figures(list(FIGURES), in_hand), model_in_hand,
                                     out_dir / "figures")
    sections.append(section)
    summary.append(line)
    path = out_dir / "report.html"
    path.write_text(render_html(summary, sections), encoding="utf-8")
    return path
