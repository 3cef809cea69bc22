"""A fresh benchmark table against a committed one: do they agree within the seeds' spread?

Training is bitwise reproducible only on the same CPU kind with the same thread count
(docs/bench.md "Determinism: what holds"); elsewhere the runs follow other rounding and end at
other numbers, as another seed would. So a fresh table is compared with a committed one the
way two samples are:

* each cell of the table, one (task, encoding, variant) and ``≤L`` or ``>L``, is the mean over
  seeds; its difference ``d`` is scaled by the standard error of a difference of two means,
  ``se = sqrt((sd_fresh² + sd_committed²) / n)`` (sample std over the n seeds; log perplexity for
  ppl cells, whose spread is multiplicative), giving ``z = d / se``;
* the table agrees when the pooled ratio ``sum(d²) / sum(se²)`` over the cells is at most
  :data:`RATIO_LIMIT`. Two tables drawn alike give a ratio near 1 (the same numerics give 0);
  a cell moved by many standard errors lifts it above the limit. Pooling keeps the test stable
  with 3 seeds, where one cell's own spread is too noisy to judge it alone;
* ``train_loss`` of every run is compared bitwise, which says whether the numerics were the
  same at all;
* the training time of the runs in both files is summed on each side and printed as a ratio:
  not a verdict (another machine, thread count or load moves it), but a code change that makes
  training several times slower shows at once;
* the corpus each file records (:class:`posenc.results.CorpusRecord`, its sha256): where the
  digests differ the tables read other text (another Python's standard library, another
  ``--data``), so the cells of the tasks that read it are listed but not judged, and the verdict
  rests on the other tasks; where a file records none (written before posenc recorded it), the
  comparison says it cannot tell and judges every cell.

``python benchmarks/compare_bench.py FRESH COMMITTED`` prints it (``make demo`` runs it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..results import CorpusRecord, ResultsFile, read_results
from .stats import mean_std
from .tasks import get_task, task_names

__all__ = ["RATIO_LIMIT", "CellDiff", "Comparison", "compare_files", "compare_results", "format_comparison"]

# The pooled ratio above which two tables disagree. Drawn alike, sum(d²) / sum(se²) is near 1
# with a spread of about sqrt(2 / cells) (about 0.2 for the quick table's 60 cells, more with
# the noise of 3-seed stds): 2 leaves room for that, while one cell 10 standard errors off in a
# table of 60 adds about 1.7.
RATIO_LIMIT = 2.0


@dataclass(frozen=True)
class CellDiff:
    """One cell of the table in both files; ``z`` is None where a seed has no value (diverged)."""

    task: str
    encoding: str
    variant: str
    where: str  # "≤L" or ">L"
    metric: str  # "accuracy" or "ppl" (compared as log ppl)
    fresh: float
    committed: float
    se: float | None
    z: float | None

    @property
    def label(self) -> str:
        name = self.encoding if self.variant == "base" else f"{self.encoding}+{self.variant}"
        return f"{self.task}/{name} {self.where}"


@dataclass(frozen=True)
class Comparison:
    cells: list[CellDiff]
    runs: int  # runs present in both files
    runs_bitwise: int  # of them, with the same train_loss to the last bit
    ratio: float  # sum(d²) / sum(se²) over the judged cells with a value (0 when every d is 0)
    train_seconds: tuple[float, float] | None = None  # summed over the runs in both files: (fresh, committed)
    corpus: str = ""  # one line: the same corpus, a different one, or cannot tell
    unjudged: tuple[str, ...] = ()  # tasks whose cells read a different corpus: listed, not judged

    @property
    def agrees(self) -> bool:
        return self.ratio <= RATIO_LIMIT

    def judged(self, cell: CellDiff) -> bool:
        return cell.z is not None and cell.task not in self.unjudged


def _corpus_line(fresh: CorpusRecord | None, committed: CorpusRecord | None) -> tuple[str, bool]:
    """One line on the two files' corpora, and whether they differ."""
    def said(c: CorpusRecord) -> str:
        return f"{c['source']} (sha256 {c['sha256'][:12]}..., {c['train_bytes']:,} + {c['val_bytes']:,} bytes)"

    if fresh is None or committed is None:
        which = "neither table records" if fresh is committed else \
            f"the {'committed' if committed is None else 'fresh'} table records none of"
        return f"corpus: cannot tell whether both read the same text ({which} its corpus); every cell is judged", False
    if (fresh["sha256"], fresh["train_bytes"]) == (committed["sha256"], committed["train_bytes"]):
        return f"corpus: the same, {said(fresh)}", False
    return f"different corpus: {said(fresh)} (committed table: {said(committed)})", True


def _reads_corpus(task: str) -> bool:
    """A task that reads the corpus (a name the bench does not register is taken to)."""
    return task not in task_names() or get_task(task).uses_corpus


def _seed_values(row: dict, where: str) -> list[float]:
    """The per-seed values of one cell (null, a diverged seed or no point there: NaN)."""
    vals = [math.nan if v is None else float(v) for v in row["in_seeds" if where == "≤L" else "beyond_seeds"]]
    return [math.log(v) if row["metric"] == "ppl" and v > 0 else v for v in vals]


def _same_loss(a: float | None, b: float | None) -> bool:
    return a == b or (a is None or math.isnan(a)) and (b is None or math.isnan(b))


def compare_results(fresh: ResultsFile, committed: ResultsFile) -> Comparison:
    """Compare two results files (:func:`posenc.results.read_results`) cell by cell.

    Raises ValueError when they cannot be compared: other settings, or other (task, encoding,
    variant) rows or seeds.
    """
    skip = ("encodings", "tasks")
    a = {k: v for k, v in fresh["settings"].items() if k not in skip}
    b = {k: v for k, v in committed["settings"].items() if k not in skip}
    if a != b:
        diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
        raise ValueError(f"the tables were made with other settings (fresh, committed): {diff}")
    rows_a = {(r["task"], r["encoding"], r["variant"]): r for r in fresh["summary"]}
    rows_b = {(r["task"], r["encoding"], r["variant"]): r for r in committed["summary"]}
    if set(rows_a) != set(rows_b):
        only = sorted(set(rows_a) ^ set(rows_b))
        raise ValueError(f"the tables hold other rows: {', '.join('/'.join(k) for k in only[:6])}"
                         f"{' ...' if len(only) > 6 else ''} in one file only")
    cells: list[CellDiff] = []
    for key in sorted(rows_a):
        ra, rb = rows_a[key], rows_b[key]
        if ra["seed_ids"] != rb["seed_ids"]:
            raise ValueError(f"{'/'.join(key)}: seeds {ra['seed_ids']} (fresh) against {rb['seed_ids']} (committed)")
        for where in ("≤L", ">L"):
            va, vb = _seed_values(ra, where), _seed_values(rb, where)
            (ma, sa), (mb, sb) = mean_std(va), mean_std(vb)
            if any(math.isnan(v) for v in va + vb):  # a diverged seed, or no point beyond L
                se = z = None
            else:
                se = math.sqrt((sa**2 + sb**2) / len(va)) if len(va) > 1 else 0.0
                d = ma - mb
                z = 0.0 if d == 0 else (math.copysign(math.inf, d) if se == 0 else d / se)
            cells.append(CellDiff(*key, where, ra["metric"], ma, mb, se, z))
    losses_a = {(r["task"], r["encoding"], r["seed"]): r["train_loss"] for r in fresh["runs"]}
    losses_b = {(r["task"], r["encoding"], r["seed"]): r["train_loss"] for r in committed["runs"]}
    both = set(losses_a) & set(losses_b)
    bitwise = sum(1 for k in both if _same_loss(losses_a[k], losses_b[k]))
    line, differs = _corpus_line(fresh.get("corpus"), committed.get("corpus"))
    unjudged = tuple(sorted({c.task for c in cells if _reads_corpus(c.task)})) if differs else ()
    judged = [c for c in cells if c.z is not None and c.task not in unjudged]
    num = sum((c.fresh - c.committed) ** 2 for c in judged)
    den = sum(c.se**2 for c in judged)  # type: ignore[operator]  # se is set wherever z is
    ratio = 0.0 if num == 0 else (math.inf if den == 0 else num / den)
    return Comparison(cells, len(both), bitwise, ratio, _train_seconds(fresh, committed, both), line, unjudged)


def _train_seconds(fresh: ResultsFile, committed: ResultsFile, both: set) -> tuple[float, float] | None:
    """Training seconds summed over the runs both files hold, or None where a run lacks them."""
    sides = []
    for results in (fresh, committed):
        times = {(r["task"], r["encoding"], r["seed"]): r.get("train_seconds") for r in results["runs"]}
        values = [times[k] for k in both]
        if not values or any(not isinstance(v, (int, float)) or not v > 0 for v in values):
            return None
        sides.append(float(sum(values)))
    return sides[0], sides[1]


def compare_files(fresh: str | Path, committed: str | Path) -> Comparison:
    """:func:`compare_results` of two ``results.json`` files (or benchmark output folders)."""
    return compare_results(read_results(fresh), read_results(committed))


def format_comparison(c: Comparison, *, show: int = 8) -> str:
    """The corpus line, the verdict, the bitwise count, and the ``show`` cells furthest apart."""
    valued = [x for x in c.cells if c.judged(x)]
    within = sum(1 for x in valued if abs(x.z) <= 2)  # type: ignore[arg-type]  # judged: z is set
    lines = [c.corpus] if c.corpus else []
    if c.unjudged:
        n = sum(1 for x in c.cells if x.task in c.unjudged)
        lines.append(f"  the {n} cells of {', '.join(c.unjudged)} read that corpus: listed, not judged")
    lines += [
        f"train_loss bitwise equal in {c.runs_bitwise} of {c.runs} runs"
        + (" (same numerics: same CPU kind and thread count)" if c.runs and c.runs_bitwise == c.runs else ""),
        f"{within} of {len(valued)} cells within 2 standard errors of the seeds' spread"
        f" ({sum(1 for x in c.cells if x.z is None)} n/a); pooled ratio sum(d²)/sum(se²) = {c.ratio:.2f}"
        f" (limit {RATIO_LIMIT:g}): {'agrees' if c.agrees else 'DISAGREES'}",
    ]
    if c.train_seconds is not None:
        here, there = c.train_seconds
        lines.append(f"training took {_seconds(here)} here against {_seconds(there)} in the committed run "
                     f"({here / there:.2f}x; another machine, thread count or load moves this)")
    shown = valued + [x for x in c.cells if x.task in c.unjudged and x.z is not None]
    furthest = sorted((x for x in shown if x.z != 0), key=lambda x: -abs(x.z))[:show]  # type: ignore[arg-type]
    for x in furthest:
        unit = "log ppl" if x.metric == "ppl" else "acc"
        note = "  (not judged)" if x.task in c.unjudged else ""
        lines.append(f"  {x.label:<28} {unit} {x.fresh:9.4f} vs {x.committed:9.4f}  z {x.z:+.2f}{note}")
    return "\n".join(lines)


def _seconds(v: float) -> str:
    return f"{v:.0f} s" if v >= 10 else f"{v:.2f} s"  # a micro run trains in under a second
