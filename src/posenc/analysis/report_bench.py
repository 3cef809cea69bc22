"""Benchmark folders on ``posenc report``'s page, read back (nothing is recomputed).

* a ``posenc bench --out`` folder (:func:`load_bench`, read once): its settings, the summary
  table (units in the headers, no ``nan``), the mean reciprocal rank with its interval, which
  ranking differences are significant, and its PNGs with their captions;
* a ``posenc bench --model --out`` folder (:func:`load_model_bench`): the command's own table in
  the model's units and one figure against length (:mod:`posenc.analysis.real_model`).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..bench.report import figure_captions, settings_text, significance_lines, table_cells
from ..results import RunLayout, read_results
from .real_model import model_bench_summary, model_name, own_length, plot_model_bench
from .report_page import Section, img

__all__ = ["BenchFolder", "bench_section", "load_bench", "load_model_bench", "model_bench_section"]


@dataclass
class BenchFolder:
    """A ``posenc bench --out`` folder: its results (None when it has no results.json, or one
    that is not posenc bench results: ``problem`` says why) and its PNGs."""

    path: Path
    results: dict | None = None
    problem: str = ""
    pngs: list[Path] = field(default_factory=list)

    def encodings(self) -> set[str]:
        """The registered encodings it ran (variants ``rope:base=5e5`` by their name)."""
        rows = (self.results or {}).get("summary") or []
        return {str(r["encoding"]).split("@")[0].split(":")[0] for r in rows}

    def summary(self) -> list[str]:
        """Its line of the page's summary: what ran, and the best mean reciprocal rank beyond L."""
        if self.results is None:
            return []
        rows = self.results.get("summary") or []
        encodings = {r["encoding"] for r in rows}
        tasks = {r["task"] for r in rows}
        seeds = max((r["seeds"] for r in rows), default=0)
        line = f"Benchmark: {len(encodings)} encodings × {len(tasks)} tasks × {seeds} seed(s)"
        rank = (self.results.get("ranking") or {}).get("intervals") or []
        if rank:
            best = max(rank, key=lambda i: i["mrr"])
            line += (f"; highest mean reciprocal rank beyond L: {best['encoding']} {best['mrr']:.2f} "
                     f"[{best['low']:.2f}, {best['high']:.2f}]")
        return [line]


def load_bench(bench_dir: str | Path) -> BenchFolder:
    """A ``posenc bench --out`` folder; a clear error when it is not a folder or its results.json
    is not JSON."""
    d = Path(bench_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"--bench {str(d)!r} is not a directory (give the --out directory of `posenc bench`)")
    layout = RunLayout(d)
    folder = BenchFolder(d, pngs=sorted(d.glob("*.png")) + sorted(layout.plots.glob("*.png")))
    if layout.results_json.is_file():
        try:
            folder.results = read_results(layout.results_json)
        except json.JSONDecodeError:  # not even JSON: an error, as a missing folder is
            raise
        except ValueError as e:  # JSON, but not posenc bench results: a note on the page
            folder.problem = str(e)
    return folder


def _bench_tables(results: dict) -> list[str]:
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


def _not_read(folder: BenchFolder, why: str) -> str:
    return (f'<p class="note">{html.escape(str(RunLayout(folder.path).results_json))} could not be read as '
            f"posenc bench results: {html.escape(why)}</p>")


def bench_section(folder: BenchFolder) -> str:
    """The benchmark's part of the page: its tables, then its PNGs (each task's curves first,
    then the scalings, then passkey depth), each with its caption."""
    parts = ['<h2 id="benchmark">Benchmark</h2>']
    captions: dict[str, str] = {}
    if folder.problem:
        parts.append(_not_read(folder, folder.problem))
    elif folder.results is not None:
        try:
            parts += _bench_tables(folder.results)
            captions = figure_captions(folder.results)
        except (ValueError, KeyError, TypeError) as e:  # not a posenc bench results file
            parts.append(_not_read(folder, str(e)))
    if folder.results is None and not folder.pngs and len(parts) == 1:
        return parts[0] + f'<p class="note">No results.json or PNGs in {html.escape(str(folder.path))}.</p>'
    kinds = ("task_", "scaling_", "passkey_depth")
    order = lambda p: (next((i for i, k in enumerate(kinds) if p.stem.startswith(k)), len(kinds)), p.name)  # noqa: E731
    for p in sorted(folder.pngs, key=order):
        text = captions.get(p.stem, p.stem.replace("_", " "))
        parts.append(f"<figure>{img(p, text)}<figcaption>{html.escape(text)}</figcaption></figure>")
    return "\n".join(parts)


def load_model_bench(bench_dir: Path) -> dict:
    """results.json of a ``posenc bench --model --out`` folder; a clear error for anything else."""
    layout = RunLayout(bench_dir)
    if not layout.results_json.is_file():
        raise FileNotFoundError(f"--model-bench {str(bench_dir)!r} holds no results.json (give the --out folder of "
                                "`posenc bench --model`)")
    results = read_results(layout.results_json)
    if "trained_length" not in results["settings"]:
        raise ValueError(f"--model-bench {str(bench_dir)!r} holds synthetic bench results (give them to --bench); "
                         "--model-bench reads `posenc bench --model` results")
    return results


def model_bench_section(results: dict, bench_dir: Path, fig_dir: Path) -> tuple[Section, list[str]]:
    """A ``posenc bench --model --out`` folder's results as a section: its table in the model's
    units (the command's own text), one figure against length; and its summary lines."""
    from ..hf.bench_table import format_model_table

    s = results["settings"]
    name = model_name(s)
    png = plot_model_bench(results, fig_dir).path
    scope = (f"L = {s['trained_length']} tokens, the checkpoint's own trained length: every length past it is a "
             "real extension" if own_length(s) else
             f"L is stated as {s['trained_length']} tokens (the checkpoint was trained longer): the procedure at a "
             "small size, not a measurement of length extension")
    note = (f"{scope}. Passkey: {s['passkey_examples']} example(s) per "
            f"depth at depths {', '.join(f'{d:g}' for d in s['passkey_depths'])}. Data in "
            f"{RunLayout(bench_dir).results_json}.")
    body = (f'<section id="model-bench-{html.escape(name)}"><h2>Real model: {html.escape(name)} beyond its length</h2>'
            f'<p class="note">{html.escape(note)}</p><pre id="model-bench">{html.escape(format_model_table(results))}</pre>'
            f"<figure>{img(png, 'model_bench')}<figcaption>Each row against length; rows that coincide are drawn "
            f"once and named together.</figcaption></figure></section>")
    return Section(f"model-bench-{name}", f"Real model: {name} beyond its length", body), model_bench_summary(results)
