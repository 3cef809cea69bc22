"""The published claims checked on the standard run: each paper's headline, the number it rests
on in ``bench_standard.json``, its interval and a computed verdict (docs/bench.md "The standard
run and the published orderings").

Two interval rules, one per kind of number:

* **a ratio of byte perplexities** on ``lm``, one per seed (a model against its own perplexity
  at L, or against plain RoPE of the same seed): a verdict needs every seed to agree, and the
  interval is the range over the seeds (Press et al. 2022; FoX, PoPE, p-RoPE and HoPE);
* **a difference of scores over (task, seed) cells**, paired by cell: its 95 % percentile
  bootstrap interval over the cells (:mod:`posenc.bench.stats`); "holds" when the interval lies
  above 0, "reversed" below, "not resolved" otherwise (Kazemnejad et al. 2023 on the MRR; CoPE,
  randomized positions and HoPE on the beyond-L accuracy).

A claim whose encoding, variant or task is not in the results reads "not run".
"""

from __future__ import annotations

from .captions import caption, md_table

# Thresholds behind the verdicts on perplexity ratios (the papers give curves, not numbers):
# perplexity at the longest length over perplexity at L, in every seed.
COLLAPSE, FLAT = 1.5, 1.1
NOT_RUN = ["not run", "–"]


def _lm(data: dict) -> dict[str, dict[int, tuple[float, float]]]:
    """``encoding`` or ``encoding+scaling`` -> seed -> (ppl at L, ppl at the longest length); a
    scaled row's ppl at L is its unscaled model's (a scaling changes the model beyond L only)."""
    from posenc.bench.summary import run_scores

    out: dict[str, dict[int, tuple[float, float]]] = {}
    for r in data["runs"]:
        if r["metric"] != "ppl":
            continue
        scores = run_scores(r)
        at_L = scores["base"][0]
        for variant, (_, beyond) in scores.items():
            key = r["encoding"] if variant == "base" else f"{r['encoding']}+{variant}"
            out.setdefault(key, {})[r["seed"]] = (at_L, beyond)
    return out


def _spread(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.2f}x [{min(xs):.2f}, {max(xs):.2f}]"


def _verdict(xs, ok, bad) -> str:
    return "holds" if all(map(ok, xs)) else "does not hold" if all(map(bad, xs)) else "mixed across seeds"


def _ratio_row(paper: str, claim: str, xs: list[float] | None, what: str, ok, bad) -> list[str]:
    return [paper, claim, *(NOT_RUN if not xs else [f"{what}: {_spread(xs)}", _verdict(xs, ok, bad)])]


def _growth(lm: dict, enc: str) -> list[float] | None:
    """Per seed: ppl at the longest length / ppl at L."""
    return [b / a for _, (a, b) in sorted(lm[enc].items())] if enc in lm else None


def _paired(lm: dict, first: str, second: str, at: int) -> list[float] | None:
    """Per seed both have: ``first``'s ppl over ``second``'s (``at`` 0: at L, 1: the longest)."""
    if first not in lm or second not in lm:
        return None
    seeds = sorted(set(lm[first]) & set(lm[second]))
    return [lm[first][s][at] / lm[second][s][at] for s in seeds] or None


def _cell_differences(data: dict, first: str, second: str, tasks) -> list[float]:
    """``first``'s beyond-L score minus ``second``'s in every (task, seed) cell both have, the
    tasks in ``tasks`` (accuracy: a fraction)."""
    rows = {(r["task"], r["encoding"]): r for r in data["summary"] if r["variant"] == "base" and r["task"] in tasks}
    diffs = []
    for task in dict.fromkeys(t for t, _ in rows):
        a, b = rows.get((task, first)), rows.get((task, second))
        if a is None or b is None:
            continue
        theirs = dict(zip(b["seed_ids"], b["beyond_seeds"]))
        diffs += [x - theirs[s] for s, x in zip(a["seed_ids"], a["beyond_seeds"]) if s in theirs]
    return diffs


def _difference_row(paper: str, claim: str, data: dict, first: str, second: str, tasks, names: tuple[str, str]) -> list[str]:
    from posenc.bench.stats import bootstrap_mean

    diffs = _cell_differences(data, first, second, tasks)
    if not diffs:
        return [paper, claim, *NOT_RUN]
    mean, lo, hi = (100 * x for x in bootstrap_mean(diffs))
    v = "holds" if lo > 0 else "reversed" if hi < 0 else "not resolved (CI includes 0)"
    return [paper, claim, f"accuracy >L, {names[0]} − {names[1]}: {mean:+.1f} pts [{lo:+.1f}, {hi:+.1f}] over "
            f"{len(diffs)} cells", v]


def _press(data: dict, lm: dict, longest: int) -> list[list[str]]:
    from posenc.bench.report import scaling_label

    press = "Press et al. 2022"
    rows = []
    for enc, claim, ok, bad in (
            ("sinusoidal", f"sinusoidal collapses beyond L (ratio ≥ {COLLAPSE})", lambda x: x >= COLLAPSE, lambda x: x < COLLAPSE),
            ("learned", f"learned collapses beyond L (ratio ≥ {COLLAPSE})", lambda x: x >= COLLAPSE, lambda x: x < COLLAPSE),
            ("alibi", f"ALiBi stays flat (ratio ≤ {FLAT})", lambda x: x <= FLAT, lambda x: x > FLAT),
            ("rope", f"RoPE degrades (ratio > {FLAT})", lambda x: x > FLAT, lambda x: x <= FLAT)):
        rows.append(_ratio_row(press, claim, _growth(lm, enc), f"lm ppl {longest}L / L", ok, bad))
    for scaling in data["settings"]["scalings"]:
        paired = _paired(lm, f"rope+{scaling}", "rope", 1)  # same seed, same base model
        if not paired:
            continue
        label = scaling_label(scaling)
        rows.append(_ratio_row(press, f"{label} repairs RoPE (ppl at {longest}L below plain RoPE's)", paired,
                               f"ppl at {longest}L, {label} / plain", lambda x: x < 1, lambda x: x >= 1))
    return rows


def _kazemnejad(data: dict) -> tuple[list[list[str]], dict]:
    from posenc.bench.summary import ranking
    from posenc.bench.tasks import SYNTHETIC_TASKS

    rank = ranking([r for r in data["summary"] if r["task"] in SYNTHETIC_TASKS])
    ci = {i["encoding"]: i for i in rank["intervals"]}
    pairs = {(p["first"], p["second"]): p for p in rank["pairs"]}
    rows = []
    for leader in ("none", "t5"):
        for other in ("alibi", "rope", "learned", "sinusoidal"):
            if leader not in ci or other not in ci:
                continue
            p, sign = (pairs[(leader, other)], 1) if (leader, other) in pairs else (pairs[(other, leader)], -1)
            diff, lo, hi = sign * p["diff"], min(sign * p["low"], sign * p["high"]), max(sign * p["low"], sign * p["high"])
            v = "holds" if lo > 0 else "reversed" if hi < 0 else "not resolved (CI includes 0)"
            rows.append(["Kazemnejad et al. 2023", f"{'NoPE' if leader == 'none' else 'T5'} ahead of {other} on the "
                         "synthetic tasks", f"MRR {ci[leader]['mrr']:.2f} vs {ci[other]['mrr']:.2f}, difference "
                         f"{diff:+.2f} [{lo:+.2f}, {hi:+.2f}]", v])
    return rows, rank


def _since_2023(data: dict, lm: dict, longest: int) -> list[list[str]]:
    """The claims of the encodings and RoPE variants added since the first standard table (issue 30)."""
    from posenc.bench.counting import Count, SelectiveCopy
    from posenc.bench.settings import ROPE_VARIANTS
    from posenc.bench.tasks import SYNTHETIC_TASKS

    counting = (SelectiveCopy.name, Count.name)
    algorithmic = (*SYNTHETIC_TASKS, *counting)  # the exact-match problems (not passkey, not lm)
    p_rope, hope, randomized = (ROPE_VARIANTS[k] for k in ("p-RoPE", "HoPE", "randomized RoPE"))
    below = (lambda x: x < 1, lambda x: x >= 1)
    cope, fox, pope = "Golovneva et al. 2024 (CoPE)", "Lin et al. 2025 (FoX)", "Gopalakrishnan et al. 2025 (PoPE)"
    ruoss, barbero, chen = "Ruoss et al. 2023", "Barbero et al. 2025 (p-RoPE)", "Chen et al. 2025 (HoPE)"
    return [
        _difference_row(cope, "CoPE ahead of RoPE beyond L on selective copy and counting", data, "cope", "rope",
                        counting, ("CoPE", "RoPE")),
        _difference_row(cope, "CoPE ahead of a learned absolute table beyond L on selective copy and counting", data,
                        "cope", "learned", counting, ("CoPE", "learned")),
        _ratio_row(fox, f"FoX stays flat beyond L (ratio ≤ {FLAT})", _growth(lm, "fox"), f"lm ppl {longest}L / L",
                   lambda x: x <= FLAT, lambda x: x > FLAT),
        _ratio_row(fox, f"FoX's perplexity at {longest}L below RoPE's", _paired(lm, "fox", "rope", 1),
                   f"ppl at {longest}L, FoX / RoPE", *below),
        _ratio_row(pope, f"PoPE's perplexity at {longest}L below RoPE's", _paired(lm, "pope", "rope", 1),
                   f"ppl at {longest}L, PoPE / RoPE", *below),
        _difference_row(ruoss, "randomized positions lift RoPE beyond L on the algorithmic tasks", data, randomized,
                        "rope", algorithmic, ("randomized", "plain")),
        _ratio_row(barbero, "p-RoPE (p = 0.75) has a lower perplexity than RoPE at L", _paired(lm, p_rope, "rope", 0),
                   "ppl at L, p-RoPE / RoPE", *below),
        _ratio_row(chen, f"HoPE's perplexity at {longest}L below RoPE's", _paired(lm, hope, "rope", 1),
                   f"ppl at {longest}L, HoPE / RoPE", *below),
        _difference_row(chen, "HoPE ahead of RoPE beyond L on the algorithmic tasks", data, hope, "rope", algorithmic,
                        ("HoPE", "RoPE")),
    ]


def orderings(page: str, load) -> str:
    """Does each published claim hold in the standard run? (verdict, the number it rests on, and
    its interval)"""
    data = load("bench_standard")
    lm = _lm(data)
    assert lm, "bench_standard.json has no lm runs"
    longest = max(data["settings"]["lm_eval_factors"])
    kazemnejad, rank = _kazemnejad(data)
    rows = _press(data, lm, longest) + kazemnejad + _since_2023(data, lm, longest)
    m = rank["method"]
    note = (f"Intervals: lm ratios, mean [min, max] over the {data['settings']['seeds']} seeds (a verdict needs every "
            f"seed to agree); MRR over the {m['cells']} synthetic (task, seed) cells with its "
            f"{round(100 * m['confidence'])} % paired bootstrap CI ({m['resamples']:,} resamples); accuracy beyond L, "
            "the mean difference over the paired (task, seed) cells in points with its 95 % bootstrap CI. \"not "
            "run\": the results hold no run of that encoding, variant or task.")
    return (md_table(["paper", "claim", "measured", "verdict"], rows) + "\n\n" + note + "\n\n"
            + caption("bench_standard", page, data))
