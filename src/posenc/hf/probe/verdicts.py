"""Probe step 2b, verdicts: the three claims of the RoPE-base literature, measured on one layer.

The claims (Liu et al. 2023, Fig. 1, on Llama's first layer; the Llama 2 discussion of the
two frequency halves), each read on the layer's curves (:func:`.curves.score_curves`, the mean
over the chosen heads) and answered *holds* / *does not hold* with its numbers:

(a) **rise**: "beyond the trained length the score rises again" (the model's own RoPE);
(b) **raised base**: "raising the base brings the decay back without training" (the base x F
    curve, F = ``--base-factor``);
(c) **low half**: "the low-frequency half keeps the long-range decay".

Everything is read on **window means**, never on single points of the oscillating curve. Ld is
the layer's trained distance (the trained length L; a sliding-window layer's window, the
farthest distance it ever attends to, when smaller). The curve is evaluated at *every* integer
distance 0..E*Ld (E = ``--extend``) and averaged over windows of width w = Ld/8 that start every
w/2 tokens: M(a) = mean of s(d) over a <= d < a + w. With

    inside  = the windows that end within the trained distance (a + w <= Ld),
    beyond  = the windows that start at or past it (a >= Ld, a + w <= E*Ld + 1),
    start   = M(0),   trough = min over inside of M(a) (at a*),
    fall    = start - trough                      (how far the score decays within Ld),
    rise    = max over beyond of M(a) - trough    (how far it climbs back past Ld),

the verdicts are, with F the model curve's fall:

(a) holds iff F > 0 and rise >= F / 2: past Ld the score climbs back at least half of what it
    fell within Ld.
(b) holds iff F > 0, the raised-base curve falls within Ld too (its own fall > 0) and its rise
    < F / 2: past Ld it does not climb back, by (a)'s yardstick, above its trough within Ld.
    Stored beside it, not part of the rule: the raised curve's lowest window past Ld and how far
    it climbs from there by E*Ld (``late_climb``; a raised base can delay the rise, not remove it).
(c) holds iff F > 0 and the low-frequency half carries at least 3/4 of the fall to the trough:
    (M_low(0) - M_low(a*)) / (M(0) - M(a*)) >= 3/4 (full = high + low + a constant, so the high
    half carries the rest).

The thresholds (1/2, 3/4) are fixed here; every number they compare is stored beside the
verdict (probe.json's ``verdicts``), so a reader can apply another.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...rotary import RotaryEmbedding
from .curves import score_curves

__all__ = ["CLAIMS", "LOW_SHARE", "RISE_SHARE", "dense_curve", "dense_curves", "judge", "verdict_line", "window_grid",
           "window_means"]

#: (a) and (b)'s threshold: a climb back of at least this share of the model's fall is a rise.
RISE_SHARE = 0.5
#: (c)'s threshold: the low half's share of the fall to the trough.
LOW_SHARE = 0.75

CLAIMS = {
    "rise": "beyond the trained length the score rises again",
    "raised_base": "raising the base brings the decay back without training",
    "low_half": "the low-frequency half keeps the long-range decay",
}

_CHUNK = 8192


def window_grid(trained: int, extend: float) -> tuple[int, int, int]:
    """(w, step, last distance) for a layer of trained distance ``trained``: w = trained/8
    (at least 1), step w/2 (at least 1), distances 0..ceil(extend * trained)."""
    w = max(1, trained // 8)
    return w, max(1, w // 2), int(-(-extend * trained // 1))


def window_means(curve: Tensor, w: int, step: int) -> tuple[Tensor, Tensor]:
    """(starts, means) of the windows [a, a + w) of a curve sampled at every distance 0..N-1,
    for a = 0, step, 2 step, ... with a + w <= N."""
    n = curve.numel()
    if n < w:
        raise ValueError(f"a curve of {n} points has no window of width {w}")
    c = torch.cat([torch.zeros(1, dtype=torch.float64), curve.double().cumsum(0)])
    starts = torch.arange(0, n - w + 1, step)
    return starts, (c[starts + w] - c[starts]) / w


@torch.no_grad()
def dense_curve(q: Tensor, k: Tensor, rope: RotaryEmbedding, scale: float, heads: Tensor, last: int,
                halves: tuple[Tensor, Tensor], kinds: tuple[str, ...] = ("full",)) -> dict[str, Tensor]:
    """``kinds`` of :func:`.curves.score_curves` at every distance 0..``last``, mean over
    ``heads``, float64, computed in chunks; each chunk also holds ``last`` (dropped), so a
    length-dependent scaling (dynamic NTK) sees the whole curve's length in every chunk."""
    out: dict[str, list[Tensor]] = {kind: [] for kind in kinds}
    for lo in range(0, last + 1, _CHUNK):
        d = torch.arange(lo, min(last, lo + _CHUNK - 1) + 1)
        c = score_curves(q, k, rope, torch.cat([d, torch.tensor([last])]), scale, halves)
        for kind in kinds:
            out[kind].append(c[kind][heads, :-1].double().mean(0))
    return {kind: torch.cat(v) for kind, v in out.items()}


def dense_curves(q: Tensor, k: Tensor, model_rope: RotaryEmbedding, raised_rope: RotaryEmbedding, scale: float,
                 heads: Tensor, last: int, halves: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
    """The curves the verdicts read, at every distance 0..``last``, mean over ``heads``:
    ``full``, ``high``, ``low`` (model RoPE) and ``raised`` (the raised base's full), float64."""
    out = dense_curve(q, k, model_rope, scale, heads, last, halves, ("full", "high", "low"))
    out["raised"] = dense_curve(q, k, raised_rope, scale, heads, last, halves)["full"]
    return out


def _span(a: int, w: int) -> list[int]:
    return [a, a + w - 1]


def judge(curves: dict[str, Tensor], trained: int, extend: float, base_factor: float) -> dict[str, Any]:
    """The three verdicts (see the module docstring) from :func:`dense_curves`' curves (or any
    curves ``full``, ``high``, ``low``, ``raised`` sampled at every distance 0..N-1)."""
    w, step, _ = window_grid(trained, extend)
    starts, M = window_means(curves["full"], w, step)
    _, Mlow = window_means(curves["low"], w, step)
    _, Mhigh = window_means(curves["high"], w, step)
    _, Mb = window_means(curves["raised"], w, step)
    inside = starts + w <= trained
    beyond = starts >= trained
    if not inside.any() or not beyond.any():
        raise ValueError(f"the verdicts need windows inside and past the trained distance {trained} "
                         f"(extend must be >= 1.25, got {extend})")
    si, sb = starts[inside], starts[beyond]

    def shape(m: Tensor) -> dict[str, Any]:
        mi, mb = m[inside], m[beyond]
        t, p = int(mi.argmin()), int(mb.argmax())
        return dict(start=float(m[0]), trough=float(mi[t]), trough_window=_span(int(si[t]), w),
                    fall=float(m[0] - mi[t]), peak_beyond=float(mb[p]), peak_window=_span(int(sb[p]), w),
                    rise=float(mb[p] - mi[t]))

    model, raised = shape(M), shape(Mb)
    F = model["fall"]
    t_idx = int(M[inside].argmin())
    low_fall, high_fall = float(Mlow[0] - Mlow[inside][t_idx]), float(Mhigh[0] - Mhigh[inside][t_idx])
    low_share = low_fall / F if F > 0 else float("nan")
    mb = Mb[beyond]
    lo = int(mb.argmin())
    late = float(mb[lo:].max() - mb[lo])
    common = dict(window=w, step=step, trained_distance=trained, last_distance=int(curves["full"].numel() - 1))
    return {
        "rise": dict(claim=CLAIMS["rise"], holds=bool(F > 0 and model["rise"] >= RISE_SHARE * F),
                     rule=f"fall > 0 and rise >= {RISE_SHARE:g} x fall (model RoPE)",
                     rise_over_fall=model["rise"] / F if F > 0 else float("nan"), **model, **common),
        "raised_base": dict(claim=CLAIMS["raised_base"], base_factor=base_factor,
                            holds=bool(F > 0 and raised["fall"] > 0 and raised["rise"] < RISE_SHARE * F),
                            rule=f"model fall F > 0, raised fall > 0 and raised rise < {RISE_SHARE:g} F",
                            model_fall=F, rise_over_model_fall=raised["rise"] / F if F > 0 else float("nan"),
                            lowest_beyond=float(mb[lo]), lowest_window=_span(int(sb[lo]), w), late_climb=late,
                            late_climb_over_model_fall=late / F if F > 0 else float("nan"), **raised, **common),
        "low_half": dict(claim=CLAIMS["low_half"], holds=bool(F > 0 and low_share >= LOW_SHARE),
                         rule=f"fall > 0 and low half's fall to the trough window >= {LOW_SHARE:g} x fall",
                         fall=F, low_fall=low_fall, high_fall=high_fall, low_share=low_share,
                         trough_window=model["trough_window"], **common),
    }


def verdict_line(name: str, v: dict[str, Any]) -> str:
    """One line of the printed summary: the verdict and the numbers it compares."""
    word = "holds" if v["holds"] else "does NOT hold"
    if name == "rise":
        nums = (f"start {v['start']:+.3f}, trough {v['trough']:+.3f} at d {v['trough_window'][0]}-{v['trough_window'][1]}, "
                f"peak past Ld {v['peak_beyond']:+.3f} at d {v['peak_window'][0]}-{v['peak_window'][1]}: "
                f"rise/fall {v['rise_over_fall']:.2f} (needs >= {RISE_SHARE:g})")
    elif name == "raised_base":
        nums = (f"base x{v['base_factor']:g}: start {v['start']:+.3f}, trough {v['trough']:+.3f} at d "
                f"{v['trough_window'][0]}-{v['trough_window'][1]}, peak past Ld {v['peak_beyond']:+.3f} at d "
                f"{v['peak_window'][0]}-{v['peak_window'][1]}: rise {v['rise_over_model_fall']:.2f} F (needs < "
                f"{RISE_SHARE:g}; F = {v['model_fall']:.3f}, the model's fall); lowest past Ld {v['lowest_beyond']:+.3f} "
                f"at d {v['lowest_window'][0]}-{v['lowest_window'][1]}, then climbs {v['late_climb_over_model_fall']:.2f} F "
                f"by d {v['last_distance']}")
    else:
        nums = (f"fall to d {v['trough_window'][0]}-{v['trough_window'][1]} {v['fall']:+.3f} = low {v['low_fall']:+.3f} "
                f"+ high {v['high_fall']:+.3f}: low share {v['low_share']:.2f} (needs >= {LOW_SHARE:g})")
    return f"({'abc'[list(CLAIMS).index(name)]}) {CLAIMS[name]}: {word} — {nums}"
