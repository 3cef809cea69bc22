"""``posenc plot KIND --out DIR``: the figures that explain why each scheme works.

Every plot function computes its data with posenc's own library functions, draws one PNG
(matplotlib, Agg backend, fixed size) and returns a :class:`PlotResult` holding the path and
the data behind the figure, so tests can check the numbers, not only the pixels.

Examples::

    posenc plot sinusoidal-heatmap --out figs
    posenc plot rope-score --out figs          # base 1e4 / 5e5 / 8e6 against a trained length
    posenc plot all --out figs                 # every kind
    posenc plot rope-score --set bases=1e4,1e6 --set train_len=8192 --out figs

Kinds are listed in :data:`PLOTS`; ``posenc plot --help`` prints them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ..cli.args import first_sentence, output_dir
from .canvas import DPI, FIGSIZE, PlotResult, coincident_groups, library_function, prepare_out_dir
from .canvas import figure as _figure
from .canvas import save as _save
from ..rotary.scaling import SCALINGS
from .family_figures import FAMILY_FIGURES

__all__ = ["CONCERNS", "PLOTS", "PlotResult", "FIGSIZE", "DPI", "make_plot", "parse_options", "prepare_out_dir",
           "rope_bound", "library_function"]


def _inv_freq(dim: int, base: float) -> Tensor:
    """RoPE / sinusoidal frequencies base^(-2i/d), float64, via the rotary library."""
    rope_frequencies = library_function("rope_frequencies", ("posenc.rotary", "posenc.rotary.scaling"))
    inv_freq, _ = rope_frequencies("default", dim, base)
    return inv_freq.double()


# ---- sinusoidal ---------------------------------------------------------------------------
def _sin_table(positions: Tensor, dim: int, base: float, layout: str = "interleaved") -> Tensor:
    from ..absolute.sinusoidal import sinusoidal_table

    return sinusoidal_table(positions, dim, base, layout=layout).double()


def plot_sinusoidal_heatmap(out_dir: Path, length: int = 128, dim: int = 64, base: float = 10000.0) -> PlotResult:
    """PE(p, i) as an image: fast waves in the first dimensions, slow ones in the last (Vaswani et al. 2017).

    Drawn in the "half" layout ([sin | cos], as tensor2tensor lays it out): interleaved rows
    would alternate sin ~ 0 and cos ~ 1 at the slow end and read as stripes."""
    table = _sin_table(torch.arange(length), dim, base, layout="half")  # (T, C)
    plt, fig, (ax,) = _figure()
    im = ax.imshow(table.T.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    ax.set_xlabel("position p")
    ax.set_ylabel(f"dimension (0..{dim // 2 - 1}: sin, {dim // 2}..{dim - 1}: cos)")
    fig.colorbar(im, ax=ax, label="PE(p, i)")
    return _save(plt, fig, out_dir, "sinusoidal-heatmap", f"Sinusoidal encoding, d = {dim}, base {base:g}", {"table": table})


def plot_sinusoidal_waves(
    out_dir: Path, length: int = 256, dim: int = 64, base: float = 10000.0, dims: tuple[int, ...] = (0, 4, 8, 12, 16)
) -> PlotResult:
    """Single dimensions PE(·, 2i): the wavelength 2 pi base^(2i/d) grows geometrically with i."""
    pos = torch.arange(length)
    table = _sin_table(pos, dim, base)
    plt, fig, (ax,) = _figure()
    periods = {}
    for i in dims:
        periods[i] = 2 * math.pi * base ** (2 * (i // 2) / dim)
        ax.plot(pos.numpy(), table[:, i].numpy(), label=f"dim {i}: period {periods[i]:.1f}")
    ax.set_xlabel("position p")
    ax.set_ylabel("PE(p, i)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside: the waves fill the axes
    return _save(
        plt, fig, out_dir, "sinusoidal-waves", f"Sinusoidal dimensions, d = {dim}: period grows with i",
        {"positions": pos, "waves": {i: table[:, i] for i in dims}, "periods": periods},
    )


def plot_sinusoidal_base(
    out_dir: Path, length: int = 256, dim: int = 64, index: int = 16, bases: tuple[float, ...] = (100.0, 1000.0, 10000.0)
) -> PlotResult:
    """One fixed dimension for several bases: a larger base stretches the wave (longer period)."""
    pos = torch.arange(length)
    plt, fig, (ax,) = _figure()
    waves = {}
    for b in bases:
        waves[b] = _sin_table(pos, dim, b)[:, index]
        ax.plot(pos.numpy(), waves[b].numpy(), label=f"base {b:g}: period {2 * math.pi * b ** (2 * (index // 2) / dim):.1f}")
    ax.set_xlabel("position p")
    ax.set_ylabel(f"PE(p, {index})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside: the waves fill the axes
    return _save(plt, fig, out_dir, "sinusoidal-base", f"Effect of the base at dimension {index} of {dim}", {"positions": pos, "waves": waves})


def plot_sinusoidal_dot(out_dir: Path, max_distance: int = 256, dim: int = 64, base: float = 10000.0) -> PlotResult:
    """PE(p)·PE(p + k) = sum_i cos(k w_i): symmetric in k, largest at 0 (Yan et al. 2019, TENER)."""
    ref = 512  # any p gives the same curve: the dot product depends only on k
    dist = torch.arange(-max_distance, max_distance + 1)
    table = _sin_table(torch.arange(ref - max_distance, ref + max_distance + 1), dim, base)
    dot = table @ table[max_distance]  # (2K + 1,)
    plt, fig, (ax,) = _figure()
    ax.plot(dist.numpy(), dot.numpy(), label=f"PE({ref})·PE({ref} + k)")
    ax.set_xlabel("distance k")
    ax.set_ylabel("dot product")
    ax.legend(loc="upper right")
    return _save(plt, fig, out_dir, "sinusoidal-dot", f"Sinusoidal dot product vs distance, d = {dim}", {"distance": dist, "dot": dot})


# ---- RoPE -----------------------------------------------------------------------------------
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
    plt, fig, (a0, a1) = _figure(2)
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
    return _save(plt, fig, out_dir, "rope-decay", f"RoPE long-range decay, d = {dim}", {"distance": dist, "bound": bound, "score": score})


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
    plt, fig, (a0, a1) = _figure(2)
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
    return _save(
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
    plt, fig, (a0, a1) = _figure(2)
    a0.plot(dist.numpy(), high.numpy(), lw=0.6, label=f"pairs 0..{half - 1}")
    a1.plot(dist.numpy(), low.numpy(), lw=0.8, color="C1", label=f"pairs {half}..{f.numel() - 1}")
    for ax, t in ((a0, "high-frequency band"), (a1, "low-frequency band")):
        ax.set_xlabel("relative distance")
        ax.set_ylabel("sum cos(r theta_i) over the band")
        ax.set_title(t)
        ax.legend(loc="upper right")
    return _save(plt, fig, out_dir, "rope-bands", f"RoPE frequency bands, d = {dim}, base {base:g}", {"distance": dist, "high": high, "low": low})


def plot_rope_scaling(
    out_dir: Path, dim: int = 128, base: float = 10000.0, factor: float = 8.0, original: int = 4096
) -> PlotResult:
    """Frequencies per pair for every registered RoPE scaling type at ``factor`` times the
    trained length, each set for that length by its registry entry's rule
    (:meth:`posenc.rotary.Scaling.at_factor`; LongRoPE, whose factors are searched per model,
    with its illustrative ramp) and labelled by its entry (linear: Chen et al. 2023; NTK:
    bloc97 2023; YaRN: Peng et al. 2023; Llama 3: Meta 2024; LongRoPE: Ding et al. 2024)."""
    registry = library_function("SCALINGS", ("posenc.rotary", "posenc.rotary.scaling"))
    rope_frequencies = library_function("rope_frequencies", ("posenc.rotary", "posenc.rotary.scaling"))
    plt, fig, (ax,) = _figure()
    freqs, factors, labels, skipped = {}, {}, {}, {}
    seq_len = round(factor * original)
    for t, entry in registry.items():
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
    return _save(
        plt, fig, out_dir, "rope-scaling",
        f"RoPE scalings, d = {dim}, base {base:g}, factor {factor:g}, L = {original}, sequence length {seq_len}",
        {"inv_freq": freqs, "attention_factor": factors, "label": labels, "skipped": skipped, "factor": factor,
         "seq_len": seq_len, "coincide": [g for g in groups if len(g) > 1], "not_drawn": zeroed},
    )


# ---- relative biases ---------------------------------------------------------------------
def plot_t5_buckets(out_dir: Path, max_distance: int = 256, num_buckets: int = 32, bucket_max_distance: int = 128) -> PlotResult:
    """T5's buckets (Raffel et al. 2020): exact for small distances, logarithmic up to
    max_distance, one shared bucket beyond it."""
    fn = library_function("t5_relative_position_bucket", ("posenc.relative", "posenc.relative.t5"))
    rel = torch.arange(-max_distance, max_distance + 1)  # key position - query position
    bi = fn(rel, bidirectional=True, num_buckets=num_buckets, max_distance=bucket_max_distance)
    uni = fn(rel, bidirectional=False, num_buckets=num_buckets, max_distance=bucket_max_distance)
    plt, fig, (ax,) = _figure()
    ax.step(rel.numpy(), bi.numpy(), where="mid", label="bidirectional")
    ax.step(rel.numpy(), uni.numpy(), where="mid", label="unidirectional")
    for x in (-bucket_max_distance, bucket_max_distance):
        ax.axvline(x, color="gray", ls=":", lw=1)
    ax.set_xlabel("relative position (key - query)")
    ax.set_ylabel("bucket")
    ax.legend(loc="upper left")
    return _save(
        plt, fig, out_dir, "t5-buckets", f"T5 buckets: {num_buckets} buckets, max_distance {bucket_max_distance}",
        {"relative_position": rel, "bidirectional": bi, "unidirectional": uni},
    )


def plot_alibi(out_dir: Path, num_heads: int = 8, max_distance: int = 64) -> PlotResult:
    """ALiBi biases per head (Press et al. 2022): -m_h * distance, geometric slopes m_h."""
    fn = library_function("alibi_slopes", ("posenc.relative", "posenc.relative.alibi"))
    slopes = torch.tensor(fn(num_heads), dtype=torch.float64)
    dist = torch.arange(max_distance + 1)
    bias = -slopes[:, None] * dist[None, :].double()  # (H, K)
    plt, fig, (ax,) = _figure()
    for h in range(num_heads):
        ax.plot(dist.numpy(), bias[h].numpy(), label=f"head {h}: m = {slopes[h]:.4g}")
    ax.set_xlabel("distance i - j")
    ax.set_ylabel("bias added to the logit")
    ax.legend(loc="lower left", fontsize=8)
    return _save(plt, fig, out_dir, "alibi", f"ALiBi biases, {num_heads} heads", {"slopes": slopes, "distance": dist, "bias": bias})


def plot_deberta_buckets(out_dir: Path, max_distance: int = 1024, bucket_size: int = 256, max_position: int = 512) -> PlotResult:
    """DeBERTa-v2's log buckets (He et al. 2021): identity up to bucket_size / 2, logarithmic beyond."""
    fn = library_function("log_bucket_position", ("posenc.relative", "posenc.relative.deberta"))
    rel = torch.arange(-max_distance, max_distance + 1)
    buckets = fn(rel, bucket_size, max_position)
    # DeBERTa then clamps to its table of 2 * bucket_size rows (att_span = position_buckets).
    used = buckets.clamp(-bucket_size, bucket_size - 1)
    plt, fig, (ax,) = _figure()
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
    return _save(
        plt, fig, out_dir, "deberta-buckets", f"DeBERTa log buckets: bucket_size {bucket_size}, max_position {max_position}",
        {"relative_position": rel, "buckets": buckets, "clamped": used},
    )


# kind -> plot function. Order is the order of `posenc plot all` and of the report: the
# textbook figures, then the newer families' (family_figures.py).
PLOTS: dict[str, Callable[..., PlotResult]] = {
    "sinusoidal-heatmap": plot_sinusoidal_heatmap,
    "sinusoidal-waves": plot_sinusoidal_waves,
    "sinusoidal-base": plot_sinusoidal_base,
    "sinusoidal-dot": plot_sinusoidal_dot,
    "rope-decay": plot_rope_decay,
    "rope-score": plot_rope_score,
    "rope-bands": plot_rope_bands,
    "rope-scaling": plot_rope_scaling,
    "t5-buckets": plot_t5_buckets,
    "alibi": plot_alibi,
    "deberta-buckets": plot_deberta_buckets,
    **{kind: f.fn for kind, f in FAMILY_FIGURES.items()},
}

# kind -> what the figure explains: registered encodings, RoPE scaling types, or
# family_figures.ANY_ENCODING. The report keeps the figures that concern what it is given.
CONCERNS: dict[str, tuple[str, ...]] = {
    "sinusoidal-heatmap": ("sinusoidal",),
    "sinusoidal-waves": ("sinusoidal",),
    "sinusoidal-base": ("sinusoidal",),
    "sinusoidal-dot": ("sinusoidal",),
    "rope-decay": ("rope",),
    "rope-score": ("rope",),
    "rope-bands": ("rope",),
    "rope-scaling": ("rope", *SCALINGS),  # every registered scaling type is drawn
    "t5-buckets": ("t5",),
    "alibi": ("alibi",),
    "deberta-buckets": ("deberta",),
    **{kind: f.concerns for kind, f in FAMILY_FIGURES.items()},
}


def make_plot(kind: str, out_dir: str | os.PathLike, **options: Any) -> PlotResult:
    """Draw plot ``kind`` into ``out_dir``; an unknown kind lists the valid ones."""
    if kind not in PLOTS:
        raise ValueError(f"unknown plot kind {kind!r}; valid kinds: {', '.join(PLOTS)}")
    return PLOTS[kind](prepare_out_dir(out_dir), **options)


def parse_options(kind: str, items: list[str]) -> dict[str, Any]:
    """``["key=value", ...]`` -> keyword arguments of plot ``kind``, typed like their defaults.

    Tuples are comma-separated (``bases=1e4,5e5``). An unknown key lists the valid ones.
    """
    import inspect

    params = {n: p.default for n, p in inspect.signature(PLOTS[kind]).parameters.items() if n != "out_dir"}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in params:
            raise ValueError(f"--set {item!r}: {kind} takes {', '.join(f'{k}={v}' for k, v in params.items())}")
        default = params[key]
        try:
            if isinstance(default, tuple):
                elem = type(default[0]) if default else float
                out[key] = tuple(elem(float(x)) if elem is int else elem(x) for x in raw.split(","))
            elif isinstance(default, int):
                out[key] = int(float(raw)) if float(raw).is_integer() else int(raw)
            else:
                out[key] = type(default)(raw)
        except ValueError:
            raise ValueError(f"--set {item!r}: {key} must be like {default!r}") from None
    return out


def _cmd_plot(args: argparse.Namespace) -> int:
    kinds = list(PLOTS) if args.kind == "all" else [args.kind]
    if args.kind != "all" and args.kind not in PLOTS:
        raise ValueError(f"unknown plot kind {args.kind!r}; valid kinds: all, {', '.join(PLOTS)}")
    if args.set and args.kind == "all":
        raise ValueError("--set applies to one plot kind, not to 'all'")
    options = parse_options(args.kind, args.set) if args.set else {}
    prepare_out_dir(args.out)
    failed = 0
    for kind in kinds:
        try:
            res = make_plot(kind, args.out, **options)
        except ValueError as e:
            if args.kind != "all":
                raise
            print(f"posenc plot: skipped {kind}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{res.path}  {res.title}")
    return 1 if failed else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plot", help="draw the figures that explain each scheme (PNG)",
        description="Kinds (or all):\n" + "\n".join(f"  {k}: {first_sentence(f.__doc__)}" for k, f in PLOTS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", metavar="KIND", help="plot kind, or 'all' (see the list above)")
    p.add_argument("--out", type=output_dir, required=True, help="directory for the PNG files (created if missing)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a parameter of the plot function, e.g. --set train_len=8192 --set bases=1e4,1e6 (repeatable)",
    )
    p.set_defaults(func=_cmd_plot)
