"""``extend``'s measurement of its grid, in one process or split over ``torchrun`` ranks.

The work is a list of units: for each candidate, its perplexity (every window at once, so its
block-bootstrap interval is one computation) and each passkey prompt apart. Under ``torchrun
--nproc_per_node R -m posenc extend ...`` (gloo on a CPU, NCCL on GPUs; each rank on its own
``cuda:LOCAL_RANK``) rank r measures the units ``k`` with ``k % R == r``, patching each
candidate it has units of once; every rank then receives every unit's result
(``all_gather_object``) and builds the same rows. A unit's result does not depend on which rank
computed it or what ran before (the same weights, the same patch, the same prompt), so the rows
equal one process's: the perplexities and passkey counts exactly, ``seconds`` being the sum of
the ranks' times on the candidate.
"""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["measure_grid", "units"]


def units(candidates: int, samples: int) -> list[tuple[int, int | None]]:
    """The grid's units in order: ``(i, None)`` candidate i's perplexity, ``(i, j)`` its j-th prompt."""
    return [(i, j) for i in range(candidates) for j in (None, *range(samples))]


def _gather(local: dict, world: int) -> dict:
    if world == 1:
        return local
    import torch.distributed as dist

    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, local)
    merged: dict = {}
    for part in parts:
        merged.update(part)
    return merged


def measure_grid(lm: Any, grid: list[Any], written: list[Any], settings: Any, stream: Any, passkey: Any, L: int,
                 per_candidate: float, estimate: float, progress: bool) -> list[dict[str, Any]]:
    """Every candidate's row: perplexity at N with its interval (and past L), passkey successes of
    ``settings.samples`` prompts with their Wilson interval; a line per candidate on stderr (rank
    0 alone under torchrun, for the candidates it measured)."""
    import torch

    from ..bench.data import example_rng
    from ..bench.train import distributed_info
    from ..intervals import wilson
    from ..progress import Eta
    from ..progress import bar as progress_bar
    from .evaluation import token_perplexity
    from .extend_grid import progress_line
    from .patch import patch_model, unpatch_model

    rank, world = distributed_info()
    N = settings.to
    examples = [passkey.sample(N, example_rng("extend", passkey.name, settings.eval_seed, N, d), depth=d)
                for d in settings.depths for _ in range(settings.passkey_examples)]
    work = [u for k, u in enumerate(units(len(grid), settings.samples)) if k % world == rank]
    mine = sorted({i for i, _ in work})
    shown = progress and rank == 0
    bar = progress_bar(len(mine), "extend", unit="candidate", enabled=shown)
    share = len(work) / max(1, len(grid) * (settings.samples + 1))  # this rank's part of the work
    eta = Eta(per_candidate * len(grid) * share, prior_seconds=estimate * share if estimate else estimate)
    device = next(lm.model.parameters()).device
    results: dict[tuple, Any] = {}  # (i, None): perplexity; (i, j): prompt j right; (i, 'seconds', rank)
    for n, i in enumerate(mine):
        c, t0 = grid[i], time.perf_counter()
        if c.scaling is not None:
            patch_model(lm.model, scaling=c.scaling, **c.params)
        elif c.method is not None:
            patch_model(lm.model, method=c.method, **c.params)
        try:
            for _, j in (u for u in work if u[0] == i):
                if j is None:
                    results[(i, j)] = token_perplexity(lm, stream, N, settings.windows, trained=L)
                else:
                    ex = examples[j]
                    gen = lm.generate(torch.tensor([ex.prompt], device=device), len(ex.target))[0, N:]
                    results[(i, j)] = gen.tolist() == list(ex.target)
        finally:
            if c.scaling is not None or c.method is not None:
                unpatch_model(lm.model)
        took = time.perf_counter() - t0
        results[(i, "seconds", rank)] = took
        eta.done(per_candidate * sum(1 for u in work if u[0] == i) / (settings.samples + 1), took)
        bar.update()
        if shown and world == 1:
            row = _row(c, written[i], results, i, settings.samples, wilson)
            bar.write(progress_line(n + 1, len(mine), row, took, eta.remaining_seconds()), file=sys.stderr)
    bar.close()
    results = _gather(results, world)
    return [_row(c, hf, results, i, settings.samples, wilson) for i, (c, hf) in enumerate(zip(grid, written))]


def _row(c: Any, hf: Any, results: dict, i: int, samples: int, wilson: Any) -> dict[str, Any]:
    ppl = results[(i, None)]
    right = sum(bool(results[(i, j)]) for j in range(samples))
    low, high = wilson(right, samples)
    seconds = sum(v for k, v in results.items() if k[0] == i and k[1] == "seconds")
    return dict(label=c.label, scaling=c.scaling, method=c.method, params=c.params, ppl=ppl["ppl"],
                ppl_low=ppl["low"], ppl_high=ppl["high"], ppl_beyond=ppl.get("beyond"), passkey=right / samples,
                passkey_right=right, passkey_trials=samples, passkey_low=low, passkey_high=high,
                seconds=round(seconds, 1), hf=hf)
