"""posenc bench statistics over seeds: bad inputs to the bootstrap, and the cells with no
value (issue 14)."""

from __future__ import annotations

import math

from . import Case

A = "bench statistics"


def _bootstrap(rr, **kw):
    from posenc.bench.stats import bootstrap_mrr

    return lambda: bootstrap_mrr(rr, **kw)


def _nan_seed() -> str:
    from posenc.bench.stats import mean_std

    m, s = mean_std([0.5, math.nan, 0.7])
    return f"mean {m}, std {s}: the cell is undefined, not averaged over the seeds that have a value"


def _table_without_nan() -> str:
    from posenc.bench.report import format_table
    from posenc.bench.summary import collect

    def run(enc, seed, values, yarn=None):
        pts = [dict(variant="base", length=n + 1, depth=None, value=v) for n, v in enumerate(values)]
        pts += [dict(variant="yarn", length=n + 3, depth=None, value=v) for n, v in enumerate(yarn or [])]
        return dict(task="lm", encoding=enc, seed=seed, train_length=2, metric="ppl", train_loss=math.nan,
                    train_seconds=1.0, parameters=1, points=pts)

    # rope+yarn has no point within L; alibi seed 1 diverged (NaN perplexity beyond L)
    records = [run("rope", 0, [3.0, 3.0, 5.0, 6.0], [4.0, 4.5]), run("rope", 1, [3.0, 3.0, 5.0, 7.0], [4.0, 5.0]),
               run("alibi", 0, [3.0, 3.0, 4.0, 4.0]), run("alibi", 1, [3.0, 3.0, 4.0, math.nan])]
    text = format_table(collect({"seeds": 2}, records))
    assert "nan" not in text.lower(), text
    row = next(line for line in text.splitlines() if line.startswith("rope + YaRN"))
    alibi = next(line for line in text.splitlines() if line.startswith("alibi"))
    return f"rows {row.split('  ', 1)[1].strip()!r} and {alibi.split('  ', 1)[1].strip()!r}: no nan cell"


CASES = [
    Case(A, "bootstrap of no encodings", "rr must be a non-empty mapping", _bootstrap({})),
    Case(A, "bootstrap with encodings ranked in different numbers of cells", "one reciprocal rank per cell",
         _bootstrap({"a": [1.0, 0.5], "b": [0.5]})),
    Case(A, "bootstrap with zero cells", "one reciprocal rank per cell", _bootstrap({"a": []})),
    Case(A, "bootstrap with a NaN reciprocal rank", r"must be finite numbers in \(0, 1\]; .a. has \[1.0, nan\]", _bootstrap({"a": [1.0, math.nan]})),
    Case(A, "bootstrap with resamples=0", "resamples must be >= 1", _bootstrap({"a": [1.0]}, resamples=0)),
    Case(A, "bootstrap with confidence=1.0", r"confidence must be in \(0.0, 1.0\), got 1.0",
         _bootstrap({"a": [1.0]}, confidence=1.0)),
    Case(A, "bootstrap with confidence='95%'", "confidence", _bootstrap({"a": [1.0]}, confidence="95%"),
         error=(TypeError, ValueError)),
    Case(A, "bootstrap with seed=-1", "seed must be >= 0, got -1", _bootstrap({"a": [1.0]}, seed=-1)),
    Case(A, "one seed of three has no value (NaN)", r"mean nan, std nan", _nan_seed, error=None),
    Case(A, "a RoPE scaling with no point within L and a diverged seed, in the printed table",
         r"as rope \| .*n/a", _table_without_nan, error=None),
]
