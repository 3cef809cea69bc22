"""CoPE's figure: contextual positions counted on a sentence (Golovneva et al. 2024, fig. 1).

CoPE's position of key j seen from query i is ``p_ij = sum_{t=j}^{i} sigmoid(s q_i·k_t)``. With
q and k set so that the gate opens on sentence ends only, p counts sentences, not tokens; with
every gate open it is the token distance again. The positions are
:meth:`posenc.relative.cope.ContextualPosition.positions` of a built ``cope`` encoding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..registry import build
from .canvas import PlotResult, figure, save

__all__ = ["SENTENCE", "plot_cope_positions", "gate_qk"]

SENTENCE = "The cat sat . It purred . A dog barked twice . The cat left ."


def gate_qk(opens: torch.Tensor, head_dim: int, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q (1, 1, T, D) and k (1, 1, T, D) whose scaled product s q_i·k_t is +margin where
    ``opens[t]`` and -margin elsewhere (s = 1/sqrt(D)), for every query i."""
    T = opens.numel()
    q = torch.zeros(1, 1, T, head_dim, dtype=torch.float64)
    k = torch.zeros(1, 1, T, head_dim, dtype=torch.float64)
    q[..., 0] = margin * head_dim**0.5
    k[..., 0] = torch.where(opens, 1.0, -1.0).double()
    return q, k


def plot_cope_positions(out_dir: Path, text: str = SENTENCE, margin: float = 12.0, head_dim: int = 8) -> PlotResult:
    """CoPE's contextual positions on a sentence (Golovneva et al. 2024): gates open on "." count
    sentences, gates open everywhere count tokens, seen from the last token."""
    words = text.split()
    T = len(words)
    enc = build("cope", d_model=head_dim, num_heads=1, max_pos=T + 1)
    ends = torch.tensor([w == "." for w in words])
    with torch.no_grad():
        p_sent = enc.positions(*gate_qk(ends, head_dim, margin))[0, 0]  # (T, T)
        p_tok = enc.positions(*gate_qk(torch.ones(T, dtype=torch.bool), head_dim, margin))[0, 0]
    plt, fig, (a0, a1) = figure(2)
    j = torch.arange(T)
    a0.step(j.numpy(), p_tok[-1].numpy(), where="mid", color="C0", label="every gate open: counts tokens")
    a0.step(j.numpy(), p_sent[-1].numpy(), where="mid", color="C3", label='gates open on ".": counts sentences')
    a0.set_xticks(j.numpy(), words, rotation=60, ha="right", fontsize=8)
    a0.set_ylabel(f"contextual position p(i = {T - 1}, j)")
    a0.set_title("seen from the last token", fontsize=10)
    a0.legend(loc="upper right", fontsize=8)
    masked = torch.where(j[:, None] >= j[None, :], p_sent, torch.nan)  # causal: keys up to the query
    im = a1.imshow(masked.numpy(), cmap="viridis", origin="upper")
    a1.set_xticks(j.numpy(), words, rotation=60, ha="right", fontsize=7)
    a1.set_yticks(j.numpy(), words, fontsize=7)
    a1.set_xlabel("key j")
    a1.set_ylabel("query i")
    a1.set_title('p(i, j), gates open on "."', fontsize=10)
    fig.colorbar(im, ax=a1, label="sentences between j and i")
    return save(plt, fig, out_dir, "cope-positions", "CoPE: positions counted in context-dependent units",
                {"words": words, "sentence_positions": p_sent, "token_positions": p_tok, "margin": margin})
