"""Where the engines disagree about one file: every engine's reading (:func:`read_all`) and,
against transformers' (the reference), the differences a user would meet (:func:`disagreements`).

A difference is stated with what it does to the attention logits, which is what a user feels:

* frequencies: at distance ``m`` a pair's angle is ``m * theta_i``, so a relative error ``e_i``
  in ``theta_i`` turns that pair by ``m * theta_i * e_i`` radians more; the largest such phase
  error over the pairs at the file's longest distance is reported (above about 0.1 rad a pair's
  contribution to a logit visibly changes; above pi it points elsewhere);
* scale: every logit is multiplied by ``attention_factor**2 * softmax_scale``; a ratio of those
  between two engines is a temperature change of the whole softmax;
* past the original length: static, dynamic (recomputed from the sequence length) or switch
  (LongRoPE's second set past ``switch_at``): the same file gives other frequencies at long
  lengths, compared at ``length``;
* refusal: the engine does not run the file as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .base import EngineRope, Unsupported, engine_names, engine_rule

__all__ = ["Disagreement", "Reading", "disagreements", "read_all"]

#: relative frequency difference below which two engines agree: a GGUF stores its floats in
#: float32 (about 6e-8 relative rounding), so llama.cpp's reading of a factor written there
#: differs from transformers' float64 by that much without being a different RoPE
REL_TOL = 1e-6
#: logit-scale ratio difference below which two engines agree (the same float32 reason)
SCALE_TOL = 1e-6

#: one engine's reading of the file: its ropes, or the Unsupported it raised
Reading = list[EngineRope] | Unsupported


def read_all(config: Mapping[str, Any], engines: list[str] | None = None) -> dict[str, Reading]:
    """Every engine's reading of ``config`` (default: all registered, transformers first); an
    engine that cannot run the file (or a part of it posenc's rule does not model) gives an
    :class:`Unsupported` (the one line to show).
    transformers' own errors (a malformed file) propagate: nothing is read from a bad file."""
    out: dict[str, Reading] = {}
    for name in engines or engine_names():
        try:
            out[name] = engine_rule(name)(config)
        except (Unsupported, ValueError, TypeError) as e:
            if name == "transformers":
                raise
            # an engine that cannot read a file transformers reads: its line is the finding
            out[name] = e if isinstance(e, Unsupported) else Unsupported(str(e))
    return out


@dataclass(frozen=True)
class Disagreement:
    """One way ``engine`` reads the file differently from transformers, on ``layer_type``.

    ``kind``: "refuses", "frequencies", "scale", "beyond", "layout"; ``line``: what happens, in
    words; ``phase``: the largest extra rotation of a pair at ``length`` tokens (radians), for
    frequency differences; ``scale``: this engine's logit scale over transformers'."""

    engine: str
    layer_type: str | None
    kind: str
    line: str
    phase: float | None = None
    scale: float | None = None


def _match(ropes: list[EngineRope], ref: EngineRope) -> EngineRope | None:
    for r in ropes:
        if r.layer_type == ref.layer_type:
            return r
    return ropes[0] if len(ropes) == 1 and ref.layer_type is None else None


def _phase(a: torch.Tensor, b: torch.Tensor, length: int) -> tuple[float, int]:
    """The largest |a_i - b_i| * (length - 1) over the pairs and the pair it is at."""
    diff = (a - b).abs() * (length - 1)
    i = int(diff.argmax())
    return float(diff[i]), i


def _compare(engine: str, ref: EngineRope, other: EngineRope, length: int) -> list[Disagreement]:
    where = ref.layer_type
    out: list[Disagreement] = []
    if other.rotary_dim != ref.rotary_dim:
        return [Disagreement(engine, where, "frequencies",
                             f"rotates {other.rotary_dim} channels per head, transformers {ref.rotary_dim}")]
    if other.layout != ref.layout:
        out.append(Disagreement(engine, where, "layout",
                                f"pairs channels {other.layout} (transformers: {ref.layout}): the same scores only "
                                "if the converted q/k weights are permuted to match"))
    for at, label in ((None, "within the original length"), (length, f"at {length} tokens")):
        if at is not None and ref.beyond == "static" and other.beyond == "static":
            break  # the same frequencies at every length: already compared
        a, fa = ref.frequencies(at)
        b, fb = other.frequencies(at)
        rel = float(((a - b).abs() / a.abs().clamp_min(1e-300)).max())
        if rel > REL_TOL:
            phase, i = _phase(a, b, length)
            out.append(Disagreement(engine, where, "frequencies",
                                    f"{label}: inv_freq differs by up to {rel:.3g} relative (pair {i}); at distance "
                                    f"{length - 1} that turns pair {i} by {phase:.3g} rad more", phase=phase))
        ratio = (fb * fb * other.softmax_scale) / (fa * fa * ref.softmax_scale)
        if abs(ratio - 1) > SCALE_TOL:
            out.append(Disagreement(engine, where, "scale",
                                    f"{label}: logits scaled by {fb * fb * other.softmax_scale:.6g} (transformers "
                                    f"{fa * fa * ref.softmax_scale:.6g}): {100 * (ratio - 1):+.3g} % on every logit, "
                                    "a softmax temperature change", scale=ratio))
    if other.beyond != ref.beyond:
        what = {"static": "the same frequencies at every length",
                "dynamic": "frequencies recomputed from the sequence length",
                "switch": "a second set of frequencies past {switch_at} tokens"}
        out.append(Disagreement(engine, where, "beyond",
                                f"past the original length: {what[other.beyond].format(switch_at=other.switch_at)} "
                                f"(transformers: {what[ref.beyond].format(switch_at=ref.switch_at)})"))
    elif ref.beyond == "switch" and other.switch_at != ref.switch_at:
        out.append(Disagreement(engine, where, "beyond",
                                f"switches to the long factors past {other.switch_at} tokens (transformers: "
                                f"past {ref.switch_at})"))
    return out


def disagreements(readings: Mapping[str, Reading], length: int) -> list[Disagreement]:
    """How each engine's reading differs from transformers', at ``length`` tokens (the longest
    distance the user will serve). ``readings``: :func:`read_all`'s result."""
    if not isinstance(length, int) or isinstance(length, bool) or length < 2:
        raise ValueError(f"length must be an int >= 2 (tokens), got {length!r}")
    ref = readings["transformers"]
    assert isinstance(ref, list)
    out: list[Disagreement] = []
    for engine, reading in readings.items():
        if engine == "transformers":
            continue
        if isinstance(reading, Unsupported):
            out.append(Disagreement(engine, None, "refuses", str(reading)))
            continue
        for r in ref:
            other = _match(reading, r)
            if other is None:
                out.append(Disagreement(engine, r.layer_type, "refuses",
                                        f"has no RoPE for layer type {r.layer_type!r}"))
                continue
            out.extend(_compare(engine, r, other, length))
    return out
