"""PaTH's figure: what the Householder products do to one query (Yang et al. 2025, "PaTH
Attention: Position Encoding via Accumulating Householder Transformations").

Every token t makes, from the layer input, H_t = I - β_t w_t w_tᵀ (|w_t| = 1, β_t in (0, 2)),
and the logit of query i and key j is s q_iᵀ H_i ⋯ H_{j+1} k_j. Here the layer input is random
(so the w_t are), every token has the same q and k (so without PaTH every logit is the same,
NoPE), and four heads differ only in β, set by ``bt_proj``'s bias: β → 0 is NoPE, β = 1 a
projection, β → 2 a reflection (orthogonal: nothing is lost). Left, the last query's logit
over the keys; right, the norm of the transported query, |P_ijᵀ q| / |q|, read as the logits
of the basis keys e_1 … e_D. Everything through the real ``path`` encoding's ``terms`` hook
(:func:`posenc.analysis.probes.attention_logits`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..attention import Attention
from ..encoding import QKProjection
from ..registry import build
from .canvas import PlotResult, figure, save
from .probes import attention_logits

__all__ = ["BETAS", "path_logits_by_distance", "plot_path_householder"]

BETAS = (0.01, 0.5, 1.0, 1.999)  # one head each


def path_logits_by_distance(T: int = 48, head_dim: int = 16, betas: tuple[float, ...] = BETAS,
                            seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logit (H, T), norm (H, T), w (H, T, D), β (H, T)) float64 of the last query of a ``path`` encoding with one head
    per β in ``betas`` over keys at distance T - 1 … 0, on a random layer input (``seed``),
    q = k = the first basis vector at every token. ``norm``: |P_ijᵀ q| / |q| from the logits of
    every basis key (each logit divided by the scale s); w and β: the encoding's ``householders``
    of the layer input."""
    H, D = len(betas), head_dim
    C = H * D
    gen = torch.Generator().manual_seed(seed)
    enc = build("path", d_model=C, num_heads=H).double()
    for p in enc.parameters():  # FLA-like random w projections from a fixed seed
        with torch.no_grad():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) / math.sqrt(max(p.shape[-1], 1)))
    with torch.no_grad():
        enc.bt_proj.weight.zero_()
        enc.bt_proj.bias.copy_(torch.tensor([math.log(b / (2 - b)) for b in betas], dtype=torch.float64))
    x = torch.randn(1, T, C, generator=gen, dtype=torch.float64)
    proj = QKProjection.of(Attention(C, H).double(), x)
    pos = torch.arange(T)[None]
    s = 1.0 / math.sqrt(D)
    basis = torch.eye(D, dtype=torch.float64)
    q = basis[0].expand(1, H, 1, D)  # the last query only
    with torch.no_grad():
        rows = [attention_logits(enc, q, basis[d].expand(1, H, T, D), pos[:, -1:], pos, proj)[0, :, 0]
                for d in range(D)]  # (H, T) each: s q·P_ij e_d
        w, beta, _ = enc.householders(x)
    logit = rows[0]
    norm = torch.stack(rows).pow(2).sum(0).sqrt() / s
    return logit, norm, w[0], beta[0]


def plot_path_householder(out_dir: Path, T: int = 48, head_dim: int = 16, seed: int = 0) -> PlotResult:
    """PaTH's logit of one q/k pair over the keys, and the norm it keeps (Yang et al. 2025):
    the tokens between key and query turn q by their Householders I - β w wᵀ; β → 0 is NoPE,
    β → 2 reflections that keep |q|, β between them shrink it."""
    logit, norm, w, beta = path_logits_by_distance(T, head_dim, BETAS, seed)
    dist = torch.arange(T - 1, -1, -1)
    s = 1.0 / math.sqrt(head_dim)
    plt, fig, (a0, a1) = figure(2)
    for h, b in enumerate(BETAS):
        label = f"β = {b:g}" + (" (≈ NoPE)" if b < 0.1 else " (reflection)" if b > 1.99 else "")
        a0.plot(dist.numpy(), logit[h].numpy(), "-", color=f"C{h}", label=label)
        a1.plot(dist.numpy(), norm[h].numpy(), "-", color=f"C{h}", label=label)
    a0.axhline(s, color="gray", ls=":", lw=1)
    a0.axhline(-s, color="gray", ls=":", lw=1)
    a0.set_xlabel("distance i - j")
    a0.set_ylabel("logit s qᵀ P_ij k (q = k)")
    a0.set_title("the last query's logits (dotted: ±s |q||k|)", fontsize=10)
    a0.legend(fontsize=8, loc="lower left")
    a1.set_xlabel("distance i - j")
    a1.set_ylabel("|P_ijᵀ q| / |q|")
    a1.set_ylim(0, 1.05)
    a1.set_title("the norm the Householders keep", fontsize=10)
    return save(plt, fig, out_dir, "path-householder", "PaTH: the query turned by the Householders of the tokens between",
                {"betas": BETAS, "distance": dist, "logit": logit, "norm": norm, "scale": s,
                 "w": w, "beta": beta})
