"""Benchmark results: the records, their one reader, validator and writer, and the output folder.

Both benchmarks (small models trained per encoding, ``posenc bench``; a real checkpoint
evaluated beyond its length, ``posenc bench --model``) write the same records into the same
folder layout, and every reader (the comparison, the tables, the HTML report) reads them here.

Records are plain JSON objects, typed below:

* :class:`Point`: one evaluation, ``{variant, length, depth, value}`` (``depth`` None where the
  task has none; ``value`` an accuracy in [0, 1] or a perplexity).
* :class:`RunRecord`: one (task, encoding, seed): its points and how it was trained
  (``OUT/runs/TASK/NAME/seedK/result.json``); made by :func:`run_record`.
* :class:`Cell`: one summary row, a (task, encoding, variant) over seeds.
* :class:`CorpusRecord`: the text the runs read (its description, sha256 and byte counts), kept
  under ``corpus`` so that a comparison can tell a data difference from a disagreement; optional
  (files written before it was recorded have none, and runs that read no corpus record none).
* :class:`ResultsFile`: ``results.json``: the format tag, settings, runs, summary, MRR and
  ranking, and ``corpus`` (a committed copy may carry ``command``, ``machine`` and ``note`` as well).

Every file is strict JSON (NaN/inf written as null, :func:`posenc.files.write_json`); the
readers give the numeric fields back as NaN, so sums and plots compute as before writing.

Layout of an output folder (:class:`RunLayout`)::

    OUT/.lock                                   held (flock) by the process writing OUT
    OUT/bench.json                              the settings (checked on --resume)
    OUT/runs/TASK/NAME/seedK/run.json                 the settings this run was made with
    OUT/runs/TASK/NAME/seedK/checkpoint.safetensors   while training
    OUT/runs/TASK/NAME/seedK/model.safetensors        final weights
    OUT/runs/TASK/NAME/seedK/result.json              its record (a finished run)
    OUT/runs/TASK/NAME/seedK/variants/VARIANT.json    one variant's points (real-model bench)
    OUT/results.json, OUT/results.csv, OUT/plots/*.png    the collected results

``NAME`` is a folder name for the encoding (or checkpoint) that the caller chooses.
:func:`check_out_dir` and :func:`check_run_dir` keep ``--resume`` from mixing runs made with
other settings: nothing is deleted except by ``--overwrite``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict

from .files import write_json

__all__ = [
    "RESULTS_FORMAT", "POINT_EXTRAS", "Point", "RunRecord", "Cell", "CorpusRecord", "ResultsFile", "RunLayout", "RunFolder",
    "run_record", "check_run", "check_corpus", "check_results", "read_results", "read_run", "read_points", "write_run",
    "write_points", "write_results", "check_out_dir", "check_run_dir", "settings_hash",
]

RESULTS_FORMAT = "posenc-bench-results-1"


class Point(TypedDict):
    """One evaluated value of a run: a variant at one length (and depth)."""

    variant: str  # "base", or a RoPE scaling's name
    length: int  # the evaluation length, in the task's units
    depth: float | None  # where a passkey sits (0: start, 1: end); None for tasks without one
    value: float  # accuracy in [0, 1], or perplexity (NaN: diverged)
    # optional (real-model bench): a 95 % interval of value, the count it rests on (prompts, or
    # tokens scored), and for a perplexity the same over the tokens past the trained length alone
    low: NotRequired[float]
    high: NotRequired[float]
    count: NotRequired[int]
    beyond: NotRequired[float]
    beyond_low: NotRequired[float]
    beyond_high: NotRequired[float]


class RunRecord(TypedDict):
    """One trained run (task, encoding, seed) and its points: a run folder's result.json."""

    task: str
    encoding: str
    seed: int
    train_length: int  # L, in the task's units
    metric: str  # "accuracy" or "ppl"
    train_loss: float | None  # None: not trained here (a real checkpoint)
    train_seconds: float
    parameters: int
    points: list[Point]


class Cell(TypedDict):
    """One cell of the summary: a (task, encoding, variant, length, depth) over the seeds."""

    task: str
    encoding: str
    variant: str
    metric: str
    seeds: int
    in_mean: float  # within L ("≤L")
    in_std: float
    beyond_mean: float  # beyond L (">L")
    beyond_std: float
    seed_ids: list[int]
    in_seeds: list[float]
    beyond_seeds: list[float]


class CorpusRecord(TypedDict):
    """The text a run read, so that two tables can say whether they read the same one."""

    source: str  # what the text is, in words (a path, or the pinned snapshot's name)
    sha256: str  # of the training bytes followed by the validation bytes read
    train_bytes: int
    val_bytes: int


class ResultsFile(TypedDict, total=False):
    """results.json: the settings, every run and the summary (and the corpus, when recorded)."""

    format: str
    settings: dict[str, Any]
    runs: list[RunRecord]
    summary: list[Cell]
    mrr: dict[str, float]
    ranking: dict[str, Any]
    corpus: CorpusRecord  # absent: no corpus read, or written before it was recorded


_RUN_FIELDS = ("task", "encoding", "seed", "train_length", "metric", "points")
_POINT_FIELDS = ("variant", "length", "depth", "value")
#: the optional fields of a point (Point's NotRequired keys), kept in this order
POINT_EXTRAS = ("low", "high", "count", "beyond", "beyond_low", "beyond_high")
_CELL_FIELDS = ("task", "encoding", "variant", "metric", "in_mean", "beyond_mean")
METRICS = ("accuracy", "ppl")

# the numeric fields written as null where not finite, read back as NaN
_NUMBERS = ("value", "low", "high", "beyond", "beyond_low", "beyond_high", "train_loss", "in_mean", "in_std", "beyond_mean", "beyond_std")
_NUMBER_LISTS = ("in_seeds", "beyond_seeds")


def run_record(*, task: str, encoding: str, seed: int, train_length: int, metric: str, points: list[Point],
               train_loss: float | None = None, train_seconds: float = 0.0, parameters: int = 0) -> RunRecord:
    """One run's record, checked (:func:`check_run`); its key order is the file's."""
    where = f"the run {task}/{encoding}/seed{seed}"
    _check_points(points, where)
    record = RunRecord(task=task, encoding=encoding, seed=seed, train_length=train_length, metric=metric,
                       train_loss=train_loss, train_seconds=train_seconds, parameters=parameters,
                       points=[Point(variant=p["variant"], length=p["length"], depth=p["depth"], value=p["value"],
                                     **{k: p[k] for k in POINT_EXTRAS if k in p}) for p in points])
    return check_run(record, where)


def check_run(record: Any, where: str) -> RunRecord:
    """``record`` if it is a run record, else a ValueError naming ``where`` and what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"{where} is not a run record (a JSON object), got {type(record).__name__}")
    missing = [k for k in _RUN_FIELDS if k not in record]
    if missing:
        raise ValueError(f"{where} is not a run record: it lacks {', '.join(missing)}")
    if record["metric"] not in METRICS:
        raise ValueError(f"{where}: metric must be one of {', '.join(METRICS)}, got {record['metric']!r}")
    _check_points(record["points"], where)
    return record


def _check_points(points: Any, where: str) -> list[Point]:
    if not isinstance(points, list):
        raise ValueError(f"{where}: points must be a list, got {type(points).__name__}")
    for p in points:
        if not isinstance(p, dict) or any(k not in p for k in _POINT_FIELDS):
            raise ValueError(f"{where}: a point must hold {', '.join(_POINT_FIELDS)}, got {p!r}")
    return points


def check_corpus(record: Any, where: str) -> CorpusRecord:
    """``record`` if it is a :class:`CorpusRecord`, else a ValueError naming ``where``."""
    if not isinstance(record, dict) or any(k not in record for k in CorpusRecord.__annotations__):
        raise ValueError(f"{where}: corpus must hold {', '.join(CorpusRecord.__annotations__)}, got {record!r}")
    digest = record["sha256"]
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise ValueError(f"{where}: corpus sha256 must be 64 lowercase hex digits, got {digest!r}")
    for k in ("train_bytes", "val_bytes"):
        if not isinstance(record[k], int) or isinstance(record[k], bool) or record[k] < 0:
            raise ValueError(f"{where}: corpus {k} must be an integer >= 0, got {record[k]!r}")
    if not isinstance(record["source"], str):
        raise ValueError(f"{where}: corpus source must be a string, got {record['source']!r}")
    return record


def check_results(results: Any, where: str) -> ResultsFile:
    """``results`` if it is a results file's content (format tag, settings, runs, summary, and
    every run and summary row well formed), else a ValueError naming ``where``."""
    if not isinstance(results, dict) or results.get("format") != RESULTS_FORMAT:
        found = results.get("format") if isinstance(results, dict) else type(results).__name__
        raise ValueError(f"{where} is not posenc bench results (format {found!r})")
    if not {"settings", "summary", "runs"} <= set(results):
        raise ValueError(f"{where} is not posenc bench results (it needs settings, summary and runs)")
    if not isinstance(results["runs"], list) or not isinstance(results["summary"], list):
        raise ValueError(f"{where}: runs and summary must be lists")
    for i, run in enumerate(results["runs"]):
        check_run(run, f"{where}: runs[{i}]")
    for i, row in enumerate(results["summary"]):
        if not isinstance(row, dict) or any(k not in row for k in _CELL_FIELDS):
            raise ValueError(f"{where}: summary[{i}] must hold {', '.join(_CELL_FIELDS)}")
    if "corpus" in results:
        check_corpus(results["corpus"], where)
    return results


def _nan_for_null(obj: Any) -> Any:
    """Undo :func:`~posenc.files.finite_or_none` for the numeric fields: null -> NaN."""
    if isinstance(obj, dict):
        return {k: (math.nan if v is None and k in _NUMBERS
                    else [math.nan if x is None else x for x in v] if k in _NUMBER_LISTS and isinstance(v, list)
                    else _nan_for_null(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_for_null(v) for v in obj]
    return obj


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:  # still a JSONDecodeError (a ValueError), now naming the file
        raise json.JSONDecodeError(f"{p} is not valid JSON: {e.msg}", e.doc, e.pos) from None


def read_results(path: str | Path) -> ResultsFile:
    """A ``results.json`` (or the output folder holding one), checked, with null numbers as NaN.

    Raises FileNotFoundError when there is none, ValueError when it is not valid JSON or not
    posenc bench results (:func:`check_results`).
    """
    p = Path(path)
    if p.is_dir():
        p = RunLayout(p).results_json
    if not p.is_file():
        raise FileNotFoundError(f"no benchmark results at {str(p)!r}; run `posenc bench --out DIR` first")
    return _nan_for_null(check_results(_read_json(p), str(p)))


def read_run(path: str | Path) -> RunRecord:
    """One run's ``result.json``, checked, with null numbers as NaN."""
    p = Path(path)
    return _nan_for_null(check_run(_read_json(p), str(p)))


def read_points(path: str | Path) -> list[Point]:
    """The points of one variant's file (``variants/VARIANT.json``), with null values as NaN."""
    p = Path(path)
    data = _read_json(p)
    return _nan_for_null(_check_points(data.get("points") if isinstance(data, dict) else data, str(p)))


def write_run(path: str | Path, record: RunRecord) -> None:
    """Write one run's ``result.json`` (strict JSON, atomically)."""
    write_json(path, check_run(record, str(path)))


def write_points(path: str | Path, points: list[Point]) -> None:
    """Write one variant's points (``variants/VARIANT.json``), so a resumed run skips it."""
    write_json(path, dict(points=_check_points(points, str(path))))


def write_results(out: str | Path, results: ResultsFile) -> list[Path]:
    """``OUT/results.json`` and ``OUT/results.csv`` (one row per point); returns their paths."""
    layout = RunLayout(Path(out))
    check_results(results, "the results to write")
    write_json(layout.results_json, results, indent=1)  # strict: NaN (no run beyond L) -> null
    with open(layout.results_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "encoding", "variant", "seed", "train_length", "length", "depth", "metric", "value",
                    *POINT_EXTRAS])
        for r in results["runs"]:
            for p in r["points"]:
                w.writerow([r["task"], r["encoding"], p["variant"], r["seed"], r["train_length"], p["length"],
                            "" if p["depth"] is None else p["depth"], r["metric"], p["value"],
                            *("" if p.get(k) is None else p[k] for k in POINT_EXTRAS)])
    return [layout.results_json, layout.results_csv]


# --------------------------------------------------------------------------- the folder


@dataclass(frozen=True)
class RunFolder:
    """``OUT/runs/TASK/NAME/seedK``: the files of one run."""

    path: Path

    @property
    def settings(self) -> Path:
        return self.path / "run.json"

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint.safetensors"

    @property
    def model(self) -> Path:
        return self.path / "model.safetensors"

    @property
    def result(self) -> Path:
        return self.path / "result.json"

    def variant(self, name: str) -> Path:
        """``variants/NAME.json``: one variant's points, written as soon as they are measured."""
        return self.path / "variants" / f"{name}.json"

    @property
    def made(self) -> tuple[Path, ...]:
        """The files that show the run was (partly) made."""
        return self.result, self.model, self.checkpoint


@dataclass(frozen=True)
class RunLayout:
    """Where everything of one output folder lives (module docstring)."""

    out: Path

    @property
    def settings(self) -> Path:
        return self.out / "bench.json"

    @property
    def runs(self) -> Path:
        return self.out / "runs"

    @property
    def results_json(self) -> Path:
        return self.out / "results.json"

    @property
    def results_csv(self) -> Path:
        return self.out / "results.csv"

    @property
    def plots(self) -> Path:
        return self.out / "plots"

    @property
    def owned(self) -> tuple[Path, ...]:
        """What the bench writes (and ``--overwrite`` deletes); nothing else in OUT is touched."""
        return self.settings, self.runs, self.results_json, self.results_csv, self.plots

    def run(self, task: str, name: str, seed: int) -> RunFolder:
        """The folder of one (task, NAME, seed); ``name`` must be a folder name."""
        return RunFolder(self.runs / task / name / f"seed{seed}")


class _Comparable(Protocol):
    def comparable(self) -> dict[str, Any]: ...


def check_out_dir(out: Path, settings: _Comparable, *, resume: bool, overwrite: bool) -> bool:
    """Refuse to mix with an earlier run unless told to resume it or overwrite it.

    Returns True when an earlier ``bench.json`` exists and matches ``settings.comparable()``:
    only then are runs without their own ``run.json`` trusted.
    """
    if resume and overwrite:
        raise ValueError("pass --resume or --overwrite, not both")
    layout = RunLayout(Path(out))
    stored = layout.settings
    earlier = stored.exists() or layout.runs.exists()
    if earlier and not (resume or overwrite):
        raise ValueError(
            f"--out {out} holds an earlier benchmark run; pass --resume to continue it or --overwrite to replace it"
        )
    if earlier and overwrite:
        for p in layout.owned:  # only what the bench itself writes
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    elif earlier and resume and stored.exists():
        try:
            old = json.loads(stored.read_text())
        except ValueError:
            raise ValueError(f"--resume: {stored} is not valid JSON; use --overwrite to start over") from None
        old_cmp = {k: v for k, v in old.items() if k not in ("encodings", "tasks", "seeds")}
        new_cmp = settings.comparable()
        if old_cmp != new_cmp:
            diff = {k: (old_cmp.get(k), v) for k, v in new_cmp.items() if old_cmp.get(k) != v}
            raise ValueError(f"--resume: settings differ from the earlier run in {out} (earlier, now): {diff}")
        return True
    return False


def settings_hash(settings: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``settings``."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def check_run_dir(folder: Path, settings: dict[str, Any], *, trust_unrecorded: bool) -> None:
    """Make sure ``folder`` holds nothing made with other settings, then record ours.

    A ``run.json`` with other settings is refused, naming them. A run with results but no
    ``run.json`` is trusted only when the earlier ``bench.json`` matched (``trust_unrecorded``).
    """
    run = RunFolder(Path(folder))
    record = run.settings
    if record.exists():
        try:
            old = json.loads(record.read_text())["settings"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"--resume: {record} is unreadable; use --overwrite to start over") from None
        if old != settings:
            diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
            diff.update({k: (v, None) for k, v in old.items() if k not in settings})
            raise ValueError(
                f"--resume: {folder} was trained with other settings (earlier, now): {diff}; "
                "use the earlier settings or --overwrite"
            )
        return
    found = [p.name for p in run.made if p.exists()]
    if found and not trust_unrecorded:
        raise ValueError(
            f"--resume: {folder} holds {', '.join(found)} but no run.json recording its settings, and "
            "bench.json is missing, so they cannot be checked; use --overwrite to start over"
        )
    write_json(record, dict(settings=settings, hash=settings_hash(settings)), indent=1)
