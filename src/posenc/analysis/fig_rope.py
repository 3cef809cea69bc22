"""RoPE's figures: its long-range decay, its score against a trained length per base, its
frequency bands, and every registered scaling's frequencies."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from ..rotary import SCALINGS, rope_frequencies
from .canvas import PlotResult, coincident_groups, figure, save

__all__ = ["plot_rope_bands", "plot_rope_decay", "plot_rope_scaling", "plot_rope_score", "rope_bound"]


def _inv_freq(dim: int, base: float) -> Tensor:
    """RoPE / sinusoidal frequencies base^(-2i/d), float64, via the rotary library."""
    inv_freq, _ = rope_frequencies("default", dim, base)
    return inv_freq.double()


def rope_bound(distance: Tensor, inv_freq: Tensor) -> Tensor:
    """RoFormer §3.4.3: (1 / (d/2)) sum_{j=1}^{d/2} |S_j| with S_j = sum_{i<j} exp(i r theta_i)."""
    ang = distance.double()[:, None] * inv_freq[None, :]  # (R, d/2)
    s = torch.polar(torch.ones_like(ang), ang).cumsum(-1)  # S_1 .. S_{d/2}
    return s.abs().mean(-1)


def _cos_sum(distance: Tensor, inv_freq: Tensor) -> Tensor:
    """sum_i cos(r theta_i): the RoPE score of all-ones q and k per rotated pair, / 2."""
    return torch.cos(distance.double()[:, None] * inv_freq[None, :]).sum(-1)


def plot_rope_decay(
    out_dir: Path, max_distance: int = 1024, dim: int = 128, bases: tuple[float, ...] = (1000.0, 10000.0, 100000.0)
) -> PlotResult:
    """RoPE's long-range decay: RoFormer's upper bound (d = 128) and the all-ones score, per base."""
    dist = torch.arange(max_distance + 1)
    plt, fig, (a0, a1) = figure(2)
    bound, score = {}, {}
    for b in bases:
        f = _inv_freq(dim, b)
        bound[b] = rope_bound(dist, f)
        score[b] = _cos_sum(dist, f)
        a0.plot(dist.numpy(), bound[b].numpy(), label=f"base {b:g}")
        a1.plot(dist.numpy(), score[b].numpy(), label=f"base {b:g}", lw=0.8)
    a0.set_xlabel("relative distance")
    a0.set_ylabel("relative upper bound (1/(d/2)) sum |S_j|")
    a0.set_title("RoFormer bound")
    a1.set_xlabel("relative distance")
    a1.set_ylabel("sum_i cos(r theta_i)  (q = k = 1, / 2)")
    a1.set_title("all-ones score")
    for a in (a0, a1):
        a.legend(loc="upper right")
    return save(plt, fig, out_dir, "rope-decay", f"RoPE long-range decay, d = {dim}", {"distance": dist, "bound": bound, "score": score})


def plot_rope_score(
    out_dir: Path,
    max_distance: int = 2**17,
    dim: int = 128,
    bases: tuple[float, ...] = (1e4, 5e5, 8e6),
    train_len: int = 16384,
    samples: int = 64,
) -> PlotResult:
    """Score vs distance for several bases against a trained length (Men et al. 2024, "Base of
    RoPE Bounds Context Length"): the similar-token advantage B(m) = sum_i cos(m theta_i)
    turns negative at some distance — decay is lost there — and a larger base pushes that
    distance out beyond the trained length."""
    dist = torch.unique(torch.cat([torch.arange(1025), torch.logspace(math.log10(1024), math.log10(max_distance), 2000).long()]))
    full = torch.arange(max_distance + 1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(samples, dim, generator=g, dtype=torch.float64)
    k = q + 0.5 * torch.randn(samples, dim, generator=g, dtype=torch.float64)  # similar keys
    # q^T R(m) k summed pair by pair: (q0 k0 + q1 k1) cos(m theta) + (q0 k1 - q1 k0) sin(m theta)
    a = (q[:, 0::2] * k[:, 0::2] + q[:, 1::2] * k[:, 1::2]).mean(0)  # (d/2,)
    c = (q[:, 0::2] * k[:, 1::2] - q[:, 1::2] * k[:, 0::2]).mean(0)
    plt, fig, (a0, a1) = figure(2)
    ones, rand, lost = {}, {}, {}
    for b in bases:
        f = _inv_freq(dim, b)
        ang = dist.double()[:, None] * f[None, :]
        ones[b] = 2 * torch.cos(ang).sum(-1)  # q = k = 1: each pair gives 2 cos(m theta)
        rand[b] = torch.cos(ang) @ a + torch.sin(ang) @ c
        neg = (_cos_sum(full, f) < 0).nonzero()
        lost[b] = int(neg[0]) if neg.numel() else None  # first distance with B(m) < 0
        for ax, y in ((a0, ones[b]), (a1, rand[b])):
            ax.plot(dist.numpy(), y.numpy(), lw=0.8, label=f"base {b:g} (B<0 from {lost[b] or '>' + str(max_distance)})")
    for ax, t in ((a0, "all-ones q, k"), (a1, f"random q, k = q + noise (mean of {samples})")):
        ax.axvline(train_len, color="k", ls="--", lw=1, label=f"trained length {train_len}")
        ax.axhline(0, color="gray", lw=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("relative distance m")
        ax.set_ylabel("attention score q^T R(m) k")
        ax.set_title(t)
        ax.legend(loc="lower left", fontsize=8)
    return save(
        plt, fig, out_dir, "rope-score", f"RoPE score vs distance, d = {dim}",
        {"distance": dist, "ones": ones, "random": rand, "decay_lost_at": lost, "train_len": train_len},
    )


def plot_rope_bands(out_dir: Path, max_distance: int = 4096, dim: int = 128, base: float = 10000.0) -> PlotResult:
    """High- and low-frequency pairs separately: high frequencies oscillate fast and average
    out at long distance; low frequencies stay near 1 and carry the long-range (semantic)
    signal (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional
    Encodings useful?")."""
    dist = torch.arange(max_distance + 1)
    f = _inv_freq(dim, base)
    half = f.numel() // 2
    high, low = _cos_sum(dist, f[:half]), _cos_sum(dist, f[half:])
    plt, fig, (a0, a1) = figure(2)
    a0.plot(dist.numpy(), high.numpy(), lw=0.6, label=f"pairs 0..{half - 1}")
    a1.plot(dist.numpy(), low.numpy(), lw=0.8, color="C1", label=f"pairs {half}..{f.numel() - 1}")
    for ax, t in ((a0, "high-frequency band"), (a1, "low-frequency band")):
        ax.set_xlabel("relative distance")
        ax.set_ylabel("sum cos(r theta_i) over the band")
        ax.set_title(t)
        ax.legend(loc="upper right")
    return save(plt, fig, out_dir, "rope-bands", f"RoPE frequency bands, d = {dim}, base {base:g}", {"distance": dist, "high": high, "low": low})


def plot_rope_scaling(
    out_dir: Path, dim: int = 128, base: float = 10000.0, factor: float = 8.0, original: int = 4096
) -> PlotResult:
    """Frequencies per pair for every registered RoPE scaling type at ``factor`` times the
    trained length, each set for that length by its registry entry's rule
    (:meth:`posenc.rotary.Scaling.at_factor`; LongRoPE, whose factors are searched per model,
    with its illustrative ramp) and labelled by its entry (linear: Chen et al. 2023; NTK:
    bloc97 2023; YaRN: Peng et al. 2023; Llama 3: Meta 2024; LongRoPE: Ding et al. 2024)."""
    plt, fig, (ax,) = figure()
    freqs, factors, labels, skipped = {}, {}, {}, {}
    seq_len = round(factor * original)
    for t, entry in SCALINGS.items():
        try:
            params = entry.at_factor(factor, original, dim, illustrate=True)
            f, af = rope_frequencies(t, dim, base, seq_len=seq_len, **params)
        except (TypeError, ValueError) as e:
            skipped[t] = str(e)
            continue
        freqs[t], factors[t], labels[t] = f.double(), float(af), entry.label
    # One line per group of equal frequencies (a curve under another reads as missing), named
    # after every member, with the pairs it shares with the unscaled RoPE. Types that set pairs
    # to theta = 0 (p-RoPE, HoPE) cannot sit on the log axis: they have their own figure.
    groups = coincident_groups(freqs)
    plain = freqs.get("default")
    zeroed = []
    for g in groups:
        f = freqs[g[0]]
        if not bool((f > 0).all()):
            zeroed += [labels[t] for t in g]
            continue
        name = " = ".join(f"{labels[t]} (attention factor {factors[t]:.3g})" for t in g)
        if plain is not None and "default" not in g:
            same = int(torch.isclose(f, plain, rtol=1e-9, atol=0.0).long().cumprod(0).sum())
            if same:
                name += "; = no scaling on pair 0" if same == 1 else f"; = no scaling on pairs 0..{same - 1}"
        ax.plot(range(f.numel()), f.numpy(), label=name, lw=1.2)
    if zeroed:
        ax.text(0.01, 0.02, f"{', '.join(zeroed)}: theta = 0 on the lowest pairs, drawn in rope-dropped-frequencies",
                transform=ax.transAxes, fontsize=8, color="0.3")
    ax.set_yscale("log")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("inverse frequency theta_i (rad / position)")
    ax.legend(loc="upper right", fontsize=8)
    return save(
        plt, fig, out_dir, "rope-scaling",
        f"RoPE scalings, d = {dim}, base {base:g}, factor {factor:g}, L = {original}, sequence length {seq_len}",
        {"inv_freq": freqs, "attention_factor": factors, "label": labels, "skipped": skipped, "factor": factor,
         "seq_len": seq_len, "coincide": [g for g in groups if len(g) > 1], "not_drawn": zeroed},
    )
