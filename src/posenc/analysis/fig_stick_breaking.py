"""Stick-breaking's figure: how one query spends its stick on the keys before it (Tan et al.
2024, "Scaling Stick-Breaking Attention").

Query i breaks its stick at the keys before it, nearest first: key j takes beta_ij =
sigmoid(z_ij) of what the keys between it and the query have left, A_ij = beta_ij
prod_{t=j+1}^{i-1} (1 - beta_it); what no key takes, 1 - sum_j A_ij, is dropped. Here one query
reads keys whose logits z_ij follow a few patterns (the same logit everywhere: a geometric
decay from the query backwards; one strong key: most of the stick is spent there and the keys
behind it get little). The weights are the real ``stick_breaking`` encoding's, through its
``weights`` hook (head dim 1, so z_ij = q·k_j).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..registry import build
from .canvas import PlotResult, figure, save

__all__ = ["stick_weights", "plot_stick_breaking"]


def logit_patterns(n: int, strong_at: int) -> dict[str, torch.Tensor]:
    """name -> the logits z (n,) of the keys before the query, ordered by key index (the query
    sits after the last one); ``strong_at`` counts back from the query (1 = the nearest key)."""
    strong = torch.full((n,), -3.0, dtype=torch.float64)
    strong[n - strong_at] = 4.0
    return {"z = 0 everywhere (β = ½)": torch.zeros(n, dtype=torch.float64),
            "z = -3 everywhere (β ≈ 0.05)": torch.full((n,), -3.0, dtype=torch.float64),
            f"z = -3, one key z = 4 at distance {strong_at}": strong}


def stick_weights(z: torch.Tensor) -> torch.Tensor:
    """A_ij (n,) float64 of one query over n keys before it with logits ``z`` (n,), from the
    ``stick_breaking`` encoding's ``weights``: the query is the last of n + 1 keys (its own key,
    z = 0, takes nothing: ``attend_current`` False)."""
    enc = build("stick_breaking", d_model=1, num_heads=1)
    k = torch.cat([z, torch.zeros(1, dtype=z.dtype)]).view(1, 1, -1, 1)  # (1, 1, n + 1, 1)
    q = torch.ones(1, 1, 1, 1, dtype=z.dtype)  # z_ij = 1 * k_j / sqrt(1)
    with torch.no_grad():
        w = enc.weights(q, k)[0, 0, 0].double()  # (n + 1,)
    return w[:-1]


def plot_stick_breaking(out_dir: Path, n_keys: int = 24, strong_at: int = 6) -> PlotResult:
    """One query's stick-breaking weights and the stick left over (Tan et al. 2024): each key takes sigmoid(q·k) of the stick the
    keys nearer the query left, so equal logits decay geometrically with distance, a strong key
    spends the stick and the keys behind it get little; the rest of the stick is dropped."""
    pats = logit_patterns(n_keys, strong_at)
    weights = {name: stick_weights(z) for name, z in pats.items()}
    left = {name: 1.0 - float(w.sum()) for name, w in weights.items()}
    dist = torch.arange(n_keys, 0, -1)  # distance i - j of key j, ordered by key index
    plt, fig, (a0, a1) = figure(2)
    for c, (name, w) in enumerate(weights.items()):
        a0.plot(dist.numpy(), w.numpy(), "o-", ms=3, color=f"C{c}", label=name)
    a0.set_xlabel("distance i - j (keys before the query)")
    a0.set_ylabel("weight A_ij")
    a0.set_title("one query's weights", fontsize=10)
    a0.legend(fontsize=8)
    names = list(weights)
    spent = [1.0 - left[n] for n in names]
    a1.bar(range(len(names)), spent, color=[f"C{c}" for c in range(len(names))], label="spent on the keys")
    a1.bar(range(len(names)), [left[n] for n in names], bottom=spent, color="lightgray", hatch="//",
           label="left over (dropped)")
    a1.set_xticks(range(len(names)), [n.split(" (")[0] for n in names], fontsize=7, rotation=15, ha="right")
    a1.set_ylim(0, 1.05)
    a1.set_ylabel("Σ_j A_ij and 1 - Σ_j A_ij")
    a1.set_title(f"the stick over {n_keys} keys", fontsize=10)
    a1.legend(fontsize=8, loc="lower right")
    return save(plt, fig, out_dir, "stick-breaking", "Stick-breaking: each key takes a share of what nearer keys left",
                {"logits": pats, "weights": weights, "left": left, "distance": dist})
