"""PoPE's figure: what (magnitudes) and where (phases) decoupled (Gopalakrishnan et al. 2025).

PoPE's logit ``Re sum_c softplus(q_c) softplus(k_c) e^{i((m - n) theta_c - delta_c)}`` has positive
magnitudes, so with the phase bias at zero no content moves its peak off distance 0; RoPE's
``q^T R(m - n) k`` mixes content into the phase, and its peak moves with q and k. Both curves are
the dot products of q and k after the registered encodings' own ``rotate`` hooks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..registry import build
from .canvas import PlotResult, figure, save

__all__ = ["hook_logits", "plot_pope_polar"]


def hook_logits(name: str, q: torch.Tensor, k: torch.Tensor, max_distance: int, **config) -> torch.Tensor:
    """Logits q_m·k_0 (unscaled) after encoding ``name``'s ``rotate`` hook, one query per pair
    at positions m = 0..max_distance, the key at position 0: (pairs, max_distance + 1)."""
    P, D = q.shape
    enc = build(name, d_model=D, num_heads=1, **config)
    pos = torch.arange(max_distance + 1)
    qs = q[:, None, None, :].expand(P, 1, pos.numel(), D)  # (P, 1, T, D): the same q at every position
    ks = k[:, None, None, :]  # (P, 1, 1, D)
    with torch.no_grad():
        qr, kr = enc.rotate(qs, ks, pos.expand(P, -1), torch.zeros(P, 1, dtype=torch.long))
    return (qr @ kr.transpose(-1, -2))[:, 0, :, 0]  # (P, T)


def plot_pope_polar(out_dir: Path, head_dim: int = 32, pairs: int = 3, max_distance: int = 48,
                    base: float = 10000.0) -> PlotResult:
    """PoPE against RoPE on the same q and k (Gopalakrishnan et al. 2025): PoPE's logit peaks at
    distance 0 whatever the content, RoPE's peak moves with it."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(pairs, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(pairs, head_dim, generator=g, dtype=torch.float64)
    pope = hook_logits("pope", q, k, max_distance, base=base)
    rope = hook_logits("rope", q, k, max_distance, base=base)
    d = torch.arange(max_distance + 1)
    plt, fig, (a0, a1) = figure(2)
    for ax, curves, name in ((a0, pope, "PoPE"), (a1, rope, "RoPE")):
        for i in range(pairs):
            peak = int(curves[i].argmax())
            ax.plot(d.numpy(), curves[i].numpy(), color=f"C{i}", lw=1.2, label=f"q, k pair {i}: peak at d = {peak}")
            ax.plot([peak], [float(curves[i, peak])], "o", color=f"C{i}")
        ax.set_xlabel("distance m - n (query after key)")
        ax.set_ylabel("logit q·k after the rotate hook (unscaled)")
        ax.set_title(f"{name}, d = {head_dim}, base {base:g}" + (", phase bias 0 (its init)" if name == "PoPE" else ""),
                     fontsize=10)
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    return save(plt, fig, out_dir, "pope-polar", "PoPE: content sets the magnitudes, position the phases",
                {"distance": d, "q": q, "k": k, "pope": pope, "rope": rope})
