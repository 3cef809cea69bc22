"""FoPE's figure: the logit over distance with the under-trained frequencies dropped and each
dimension a Fourier series (Hua et al. 2025).

Three curves on the same q and k, the key at position 0 and the query at m, through the
registered encodings' own ``rotate`` hooks (:func:`~posenc.analysis.fig_pope.hook_logits`):
RoPE; FoPE with its coefficients at the identity (``init_gain=0``: RoPE on the kept pairs, whose
period is shorter than L, and a constant from each dropped pair); and FoPE as initialised for
training (the identity plus Xavier-normal noise). Beyond L RoPE's lowest frequencies bring
slow swings never seen in training; FoPE's kept frequencies all completed a period within L.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .canvas import PlotResult, figure, save
from .fig_pope import hook_logits

__all__ = ["plot_fope_frequencies"]


def plot_fope_frequencies(out_dir: Path, head_dim: int = 32, trained_length: int = 64, factor: int = 4,
                          base: float = 10000.0, init_gain: float = 0.3, seed: int = 0) -> PlotResult:
    """RoPE against FoPE (identity and initialised coefficients) on one q, k pair, out to
    ``factor`` x the trained length L (Hua et al. 2025)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, head_dim, generator=g, dtype=torch.float64)
    n = factor * trained_length
    rope = hook_logits("rope", q, k, n, base=base)[0]
    torch.manual_seed(seed)  # FoPE's Xavier noise
    fope_identity = hook_logits("fope", q, k, n, base=base, max_position_embeddings=trained_length, init_gain=0.0)[0]
    torch.manual_seed(seed)
    fope = hook_logits("fope", q, k, n, base=base, max_position_embeddings=trained_length, init_gain=init_gain)[0]
    d = torch.arange(n + 1)
    plt, fig, (ax,) = figure(1)
    ax.plot(d.numpy(), rope.numpy(), color="C0", lw=1.2, label="RoPE")
    ax.plot(d.numpy(), fope_identity.numpy(), color="C1", lw=1.2, label="FoPE, coefficients at the identity")
    ax.plot(d.numpy(), fope.numpy(), color="C2", lw=1.0, label=f"FoPE as initialised (gain {init_gain:g})")
    ax.axvline(trained_length, color="k", ls="--", lw=0.8, label=f"L = {trained_length}")
    ax.set_xlabel("query position m (key at 0)")
    ax.set_ylabel("logit q·k after the rotate hook (unscaled)")
    ax.set_title(f"FoPE: frequencies with a period of L or more dropped, d = {head_dim}, base {base:g}", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    return save(plt, fig, out_dir, "fope-frequencies", "FoPE: only frequencies trained through a full period",
                {"distance": d, "q": q, "k": k, "rope": rope, "fope_identity": fope_identity, "fope": fope})
