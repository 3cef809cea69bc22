"""The relative biases' figures: T5's buckets, ALiBi's slopes, DeBERTa's log buckets, Sandwich's
heads and per-row data-dependent ALiBi's rows."""

from __future__ import annotations

import math

from pathlib import Path

import torch

from ..attention import Attention
from ..encoding import QKProjection
from ..registry import build
from ..relative import alibi_slopes, log_bucket_position, t5_relative_position_bucket
from .canvas import PlotResult, figure, save
from .probes import attention_logits

__all__ = ["plot_alibi", "plot_deberta_buckets", "plot_per_row_alibi", "plot_sandwich", "plot_t5_buckets"]


def plot_t5_buckets(out_dir: Path, max_distance: int = 256, num_buckets: int = 32, bucket_max_distance: int = 128) -> PlotResult:
    """T5's buckets (Raffel et al. 2020): exact for small distances, logarithmic up to
    max_distance, one shared bucket beyond it."""
    rel = torch.arange(-max_distance, max_distance + 1)  # key position - query position
    bi = t5_relative_position_bucket(rel, bidirectional=True, num_buckets=num_buckets, max_distance=bucket_max_distance)
    uni = t5_relative_position_bucket(rel, bidirectional=False, num_buckets=num_buckets, max_distance=bucket_max_distance)
    plt, fig, (ax,) = figure()
    ax.step(rel.numpy(), bi.numpy(), where="mid", label="bidirectional")
    ax.step(rel.numpy(), uni.numpy(), where="mid", label="unidirectional")
    for x in (-bucket_max_distance, bucket_max_distance):
        ax.axvline(x, color="gray", ls=":", lw=1)
    ax.set_xlabel("relative position (key - query)")
    ax.set_ylabel("bucket")
    ax.legend(loc="upper left")
    return save(
        plt, fig, out_dir, "t5-buckets", f"T5 buckets: {num_buckets} buckets, max_distance {bucket_max_distance}",
        {"relative_position": rel, "bidirectional": bi, "unidirectional": uni},
    )


def plot_alibi(out_dir: Path, num_heads: int = 8, max_distance: int = 64) -> PlotResult:
    """ALiBi biases per head (Press et al. 2022): -m_h * distance, geometric slopes m_h."""
    slopes = torch.tensor(alibi_slopes(num_heads), dtype=torch.float64)
    dist = torch.arange(max_distance + 1)
    bias = -slopes[:, None] * dist[None, :].double()  # (H, K)
    plt, fig, (ax,) = figure()
    for h in range(num_heads):
        ax.plot(dist.numpy(), bias[h].numpy(), label=f"head {h}: m = {slopes[h]:.4g}")
    ax.set_xlabel("distance i - j")
    ax.set_ylabel("bias added to the logit")
    ax.legend(loc="lower left", fontsize=8)
    return save(plt, fig, out_dir, "alibi", f"ALiBi biases, {num_heads} heads", {"slopes": slopes, "distance": dist, "bias": bias})


def plot_deberta_buckets(out_dir: Path, max_distance: int = 1024, bucket_size: int = 256, max_position: int = 512) -> PlotResult:
    """DeBERTa-v2's log buckets (He et al. 2021): identity up to bucket_size / 2, logarithmic beyond."""
    rel = torch.arange(-max_distance, max_distance + 1)
    buckets = log_bucket_position(rel, bucket_size, max_position)
    # DeBERTa then clamps to its table of 2 * bucket_size rows (att_span = position_buckets).
    used = buckets.clamp(-bucket_size, bucket_size - 1)
    plt, fig, (ax,) = figure()
    ax.plot(rel.numpy(), buckets.numpy(), label="log bucket")
    ax.plot(rel.numpy(), used.numpy(), ls="--", label=f"clamped to the table [-{bucket_size}, {bucket_size - 1}]")
    near = rel.abs() <= bucket_size  # the identity only where it stays on the bucket scale
    ax.plot(rel[near].numpy(), rel[near].numpy(), color="gray", ls=":", lw=1, label="identity")
    top = 1.05 * float(buckets.abs().max())
    ax.set_xlim(-max_distance, max_distance)  # every distance computed is shown
    ax.set_ylim(-top, top)
    ax.set_xlabel("relative position")
    ax.set_ylabel("bucketed position")
    ax.legend(loc="upper left")
    return save(
        plt, fig, out_dir, "deberta-buckets", f"DeBERTa log buckets: bucket_size {bucket_size}, max_position {max_position}",
        {"relative_position": rel, "buckets": buckets, "clamped": used},
    )


def plot_sandwich(out_dir: Path, num_heads: int = 8, head_dim: int = 64, max_distance: int = 2**15) -> PlotResult:
    """Sandwich's biases per head (Chi et al. 2023): the sinusoids' inner product at distance i - j,
    shifted to 0 at 0 and compressed per head as ALiBi's slopes; no parameters, bounded, falling
    about as log of the distance until the lowest frequencies turn."""
    enc = build("sandwich", d_model=num_heads * head_dim, num_heads=num_heads).double()
    dist = torch.unique(torch.logspace(0, math.log10(max_distance), 400).round().long())
    dist = torch.cat([torch.zeros(1, dtype=torch.long), dist])
    with torch.no_grad():
        bias = enc.score_bias(torch.zeros(1, 1, dtype=torch.long), -dist[None])[0, :, 0].double()  # (H, K)
    plt, fig, (a0, a1) = figure(2)
    near = dist <= 64
    for h in range(num_heads):
        a0.plot(dist[near].numpy(), bias[h, near].numpy(), label=f"head {h + 1}: ÷ {8 * (h + 1) / num_heads:g}")
        a1.plot(dist[1:].numpy(), bias[h, 1:].numpy(), color=f"C{h}")
    a0.set_xlabel("distance |i - j|")
    a0.set_ylabel("bias added to the logit")
    a0.set_title("near the query", fontsize=10)
    a0.legend(loc="lower left", fontsize=7)
    a1.set_xscale("log")
    a1.set_xlabel("distance |i - j| (log scale)")
    a1.set_title(f"to {max_distance} (d' = {head_dim})", fontsize=10)
    return save(plt, fig, out_dir, "sandwich", f"Sandwich biases, {num_heads} heads",
                {"distance": dist, "bias": bias, "dim": head_dim})


def plot_per_row_alibi(out_dir: Path, T: int = 64, num_heads: int = 2, seed: int = 0) -> PlotResult:
    """Per-row data-dependent ALiBi (x-transformers): each query forgets the tokens between it and
    the key with its own gates log sigmoid(u_i·v_l/√d), so every row of the bias is its own
    decreasing curve (random layer input, gate map at a seeded random initialisation)."""
    C = 16 * num_heads
    gen = torch.Generator().manual_seed(seed)
    enc = build("per_row_alibi", d_model=C, num_heads=num_heads).double()
    with torch.no_grad():
        enc.gate.weight.copy_(torch.randn(enc.gate.weight.shape, generator=gen, dtype=torch.float64) / math.sqrt(C))
    x = torch.randn(1, T, C, generator=gen, dtype=torch.float64)
    proj = QKProjection.of(Attention(C, num_heads).double(), x)
    pos = torch.arange(T)[None]
    zero = torch.zeros(1, num_heads, T, 16, dtype=torch.float64)
    with torch.no_grad():
        bias = attention_logits(enc, zero, zero, pos, pos, proj, terms_only=True)[0]  # (H, T, T)
    rows = [T // 4, T // 2, 3 * T // 4, T - 1]
    plt, fig, axes = figure(num_heads)
    for h, ax in enumerate(axes):
        for c, i in enumerate(rows):
            d = torch.arange(i + 1)
            ax.plot(d.numpy(), bias[h, i, i - d].numpy(), color=f"C{c}", label=f"query i = {i}")
        ax.set_xlabel("distance i - j")
        ax.set_title(f"head {h}", fontsize=10)
        ax.legend(loc="lower left", fontsize=8)
    axes[0].set_ylabel("bias b_ij = Σ_{l=j}^{i-1} log σ(u_i·v_l/√d)")
    return save(plt, fig, out_dir, "per-row-alibi", "Per-row data-dependent ALiBi: each query row forgets with its own gates",
                {"rows": rows, "bias": bias, "x": x, "gate": enc.gate.weight.detach().clone()})
