"""What ``posenc extend`` measures and how it picks: the candidates (the model as it is, the
training-free RoPE scalings, the training-free attention methods), the rule over their measured
rows, and the printed table.

**The rule** (:func:`choose`): a candidate's passkey accuracy k/n carries its 95 % Wilson
interval (:func:`posenc.intervals.wilson`); the *eligible* candidates are those whose interval's
high end reaches the best accuracy measured, i.e. those not significantly worse at passkey than
the best one. Among them the lowest token perplexity wins (ties: the earlier row). With one
example per depth and three depths the interval is wide: 2/3 (high end 0.94) is excluded
against a 3/3, 3/3 competes with anything.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["METHOD_GRIDS", "NONE", "Candidate", "candidates", "check_names", "choose", "format_table", "from_flag", "method_label",
           "method_names", "progress_line", "scaling_names"]

#: the name that drops a family from the grid (``--scalings none``, ``--methods none``)
NONE = "none"
#: ``--method-grid``: each method at its paper's recommended parameters, or at its small grid
#: around them (:meth:`posenc.methods.base.AttentionMethod.grid`, the recommended set first)
METHOD_GRIDS = ("recommended", "small")


@dataclass(frozen=True)
class Candidate:
    """One row of the table: a scaling or an attention method and its parameters (both None:
    the model as it is)."""

    label: str
    scaling: str | None
    params: dict[str, Any]
    method: str | None = None


def scaling_names() -> list[str]:
    """The training-free scalings extend can run (the registry's types with an extension rule)."""
    from ..rotary.scaling import list_scalings

    return list_scalings(extends=True)


def method_names() -> list[str]:
    """The training-free attention methods (:data:`posenc.methods.METHODS`)."""
    from ..methods import METHODS

    return list(METHODS)


def check_names(what: str, names: tuple[str, ...] | None, valid: list[str]) -> None:
    """Refuse an unknown name in one line naming ``what`` and the valid ones (None: all, fine)."""
    for n in names or ():
        if n not in valid:
            raise ValueError(f"{what}: unknown name {n!r}; valid: {', '.join(valid)} (or {NONE})")


def from_flag(what: str, values: list[str] | None) -> tuple[str, ...] | None:
    """A family's flag as the grid takes it: not given -> None (all), ``none`` -> () (none of
    them), else the names in order, once each; ``none`` beside a name is refused."""
    if values is None:
        return None
    if NONE in values:
        if len(values) > 1:
            raise ValueError(f"{what}: {NONE} drops the whole family; give it alone, got {' '.join(values)}")
        return ()
    return tuple(dict.fromkeys(values))


def method_label(name: str, params: dict[str, Any]) -> str:
    """``Self-Extend G=... W=...`` style: the class's label and its parameters."""
    from ..methods import METHODS

    return f"{METHODS[name].label} " + " ".join(f"{k}={v:g}" for k, v in params.items())


def candidates(L: int, N: int, multipliers: tuple[float, ...], *, scalings: tuple[str, ...] | None = None,
               methods: tuple[str, ...] | None = None, model_type: str | None = None,
               method_grid: str = "recommended") -> list[Candidate]:
    """The grid: the model as it is, then each training-free scaling of ``scalings`` (None: all) at
    factor ``m * N / L`` (its ``extension`` rule's parameters; repeated parameter sets are evaluated
    once), then each attention method of ``methods`` (None: all) at its paper's
    ``recommended(L, N)``, or with ``method_grid="small"`` at each set of its ``grid(L, N)``. Methods stand in for the attention of :data:`posenc.hf.methods.METHOD_MODEL_TYPES`
    only: with ``methods=None`` another ``model_type`` gets none, a named method is refused."""
    from ..config import check_choice
    from ..methods import METHODS
    from ..rotary.scaling import SCALINGS
    from .methods import METHOD_MODEL_TYPES
    from .scalings import scaling_params

    check_names("--scalings", scalings, scaling_names())
    check_names("--methods", methods, method_names())
    check_choice("--method-grid", method_grid, METHOD_GRIDS)
    out = [Candidate(NONE, None, {})]
    seen = set()
    for name in scaling_names() if scalings is None else dict.fromkeys(scalings):
        label = SCALINGS[name].label
        # a rule that ignores the factor (dynamic NTK: the current length sets it) is named alone
        by_factor = scaling_params(name, 2.0, L) != scaling_params(name, 3.0, L)
        for m in multipliers:
            params = scaling_params(name, m * N / L, L)
            key = (name, json.dumps(params, sort_keys=True))
            if key in seen:
                continue
            seen.add(key)
            out.append(Candidate(f"{label} x{m * N / L:g}" if by_factor else label, name, params))
    if model_type not in METHOD_MODEL_TYPES:
        if methods:
            raise ValueError(f"--methods {' '.join(methods)}: model_type {model_type!r} is not one whose attention "
                             f"the methods can replace ({', '.join(METHOD_MODEL_TYPES)}); give --methods {NONE}")
        return out
    for name in method_names() if methods is None else dict.fromkeys(methods):
        cls = METHODS[name]
        for params in cls.grid(L, N) if method_grid == "small" else (cls.recommended(L, N),):
            out.append(Candidate(method_label(name, dict(params)), None, dict(params), method=name))
    return out


def choose(rows: list[dict[str, Any]]) -> tuple[int, str]:
    """(index of the winner, the rule in words): the lowest perplexity among the rows whose passkey
    interval's high end (``passkey_high``) reaches the best accuracy (``passkey``), NaN
    perplexities excluded; ties go to the earlier row (module docstring)."""
    if not rows:
        raise ValueError("choose needs at least one candidate row, got none")
    best = max(r["passkey"] for r in rows)
    eligible = [i for i, r in enumerate(rows) if r["passkey_high"] >= best - 1e-12 and not math.isnan(r["ppl"])]
    if not eligible:
        raise ValueError("every candidate not significantly worse at passkey has a NaN perplexity: nothing to choose")
    win = min(eligible, key=lambda i: (rows[i]["ppl"], i))
    rule = (f"lowest token perplexity among the candidates not significantly worse at passkey than the best "
            f"({best:.2f}): those whose 95 % Wilson interval of passkey accuracy reaches it; ties: the earlier row")
    return win, rule


def format_table(rows: list[dict[str, Any]], win: int, N: int, written: int | None = None) -> str:
    """The table ``extend`` prints: perplexity at N with its 95 % interval, passkey k/n with its
    Wilson interval, seconds; the winner marked, and the row written to config.json when it is
    another (an attention method won)."""
    width = max(len(r["label"]) for r in rows)
    head = (f"{'candidate':<{width}}  {'ppl@' + str(N):>10}  {'95 % interval':>19}  {'passkey':>7}  "
            f"{'95 % interval':>13}  {'seconds':>7}")
    lines = [head]
    for i, r in enumerate(rows):
        mark = "  <- chosen" if i == win else "  <- written (best RoPE candidate)" if i == written else ""
        ppl_ci = f"[{r['ppl_low']:.3f}, {r['ppl_high']:.3f}]"
        pk = f"{r['passkey_right']}/{r['passkey_trials']}"
        pk_ci = f"[{r['passkey_low']:.2f}, {r['passkey_high']:.2f}]"
        lines.append(f"{r['label']:<{width}}  {r['ppl']:>10.3f}  {ppl_ci:>19}  {pk:>7}  {pk_ci:>13}  "
                     f"{r['seconds']:>7.1f}{mark}")
    return "\n".join(lines)


def progress_line(done: int, total: int, row: dict[str, Any], seconds: float, eta: float | None) -> str:
    """``[3/9] YaRN x1.5: ppl 12.3 [12.1, 12.6], passkey 2/3; 41 s; ETA 6.2 min``: one finished
    candidate (``eta``: seconds left, :class:`posenc.progress.Eta`)."""
    from ..progress import format_minutes

    return (f"[{done}/{total}] {row['label']}: ppl {row['ppl']:.4g} [{row['ppl_low']:.4g}, {row['ppl_high']:.4g}], "
            f"passkey {row['passkey_right']}/{row['passkey_trials']}; {seconds:.0f} s; ETA {format_minutes(eta)}")
