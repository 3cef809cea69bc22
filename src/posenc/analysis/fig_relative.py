"""The relative biases' figures: T5's buckets, ALiBi's slopes, DeBERTa's log buckets."""

from __future__ import annotations

from pathlib import Path

import torch

from ..relative import alibi_slopes, log_bucket_position, t5_relative_position_bucket
from .canvas import PlotResult, figure, save

__all__ = ["plot_alibi", "plot_deberta_buckets", "plot_t5_buckets"]


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
