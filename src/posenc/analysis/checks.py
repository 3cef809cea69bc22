"""The checks of ``posenc check``: the literature's claims about each encoding, measured.

Every check is a small function ``check_x(enc, probe) -> CheckResult`` whose docstring states
the claim, its papers and the measurement (paragraphs one to three: :func:`claims` reads them).
Nothing is declared by hand: each cell comes from running the encoding's hooks through the
probe (:mod:`posenc.analysis.probes`: per-token codes, and logits through the attention
path). A check that does not apply to the hooks an encoding overrides answers ``n/a`` with
the reason. :data:`CHECKS` is the table (key -> column title, function), in column order;
:func:`format_table` prints results as the command does. Running them:
:mod:`posenc.analysis.runner`; the command: :mod:`posenc.cli.check`.

Notation: B batch, T length, H heads, D head dim, C model width.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import Tensor

from ..text import plain
from ..encoding import Dims, PositionalEncoding
from ..positions import SequenceInfo
from .probes import (
    MAX_FIT,
    Probe,
    attention_logits,
    code_parts,
    decay_profile,
    expected_score_curve,
    generator,
    has_no_signal,
    max_position,
    position_codes,
    position_logits,
    probe_projection,
    rotated,
    spread,
    values_at,
)

__all__ = [
    "CHECKS",
    "LEGEND",
    "CheckResult",
    "claims",
    "format_claims",
    "format_differ",
    "format_table",
    "results_to_json",
]

HAS, LACKS, NA, ERROR = "yes", "no", "n/a", "error"
MEASURED = ""  # a measurement with no yes/no answer (the cost)


@dataclass
class CheckResult:
    """One cell: what was measured, and what the literature expects.

    ``status``: "yes" (the encoding has the property), "no", "n/a" (the property does not
    apply to the hooks it overrides), "error", or "" for a plain measurement (the cost); ``value`` the measured number; ``detail`` what
    the number is. ``expected`` ("yes", "no", "untrained" or "" for no claim), ``source`` (the
    citation) and ``verdict`` ("agrees", "differs", "untrained", "no claim", or the status when
    nothing was measured) are filled from :mod:`posenc.analysis.claims` by
    :func:`posenc.analysis.runner.check_encoding` for a registered encoding.
    """

    status: str
    value: str
    detail: str = ""
    data: dict = field(default_factory=dict)
    expected: str = ""
    source: str = ""
    verdict: str = ""

    def cell(self) -> str:
        """``yes 9.6e-08 [agrees]``; ``no 0.38 [expected yes]`` when it differs."""
        text = f"{self.status} {self.value}".strip()
        if self.verdict == "differs":
            return f"{text} [expected {self.expected}]"
        if self.verdict in ("agrees", "untrained", "no claim"):
            return f"{text} [{self.verdict}]"
        return text


def _fmt(x: float) -> str:
    return f"{x:.2g}" if (x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e4)) else f"{x:.3g}"


# ---------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------
def check_absolute(enc: PositionalEncoding, probe: Probe) -> CheckResult:
    """Distinct positions get distinct codes: the encoding tells position p from p'.

    Vaswani et al. 2017 (sinusoidal: a unique code per position); Su et al. 2021 (RoFormer:
    RoPE "encodes the absolute position with a rotation matrix"). For encodings that act only
    on the logits, the scores themselves must change when both positions shift (relative
    biases — Shaw et al. 2018, Raffel et al. 2020, Press et al. 2022 — are shift-invariant
    and so carry no absolute position).

    Measured: min over pairs p != p' < N of ||code(p) - code(p')|| / mean ||code||, N = L * 4;
    without codes, the largest logit change under a shift of all positions by L.
    """
    n = min(4 * probe.train_len, max_position(enc, probe) + 1)
    codes = position_codes(enc, torch.arange(n), probe)
    if codes is not None:
        norm = float(codes.norm(dim=-1).mean())
        if norm == 0:
            return CheckResult(LACKS, "0", "every position gets the same (zero) code")
        dist = torch.cdist(codes, codes)  # (N, N)
        dist.fill_diagonal_(math.inf)
        rel = float(dist.min()) / norm
        ok = rel > 1e-3
        return CheckResult(
            HAS if ok else LACKS, _fmt(rel), f"min relative distance between codes of positions < {n}", {"n": n}
        )
    t = probe.train_len // 2
    base = position_logits(enc, torch.arange(t), torch.arange(t), probe)
    if has_no_signal(base):
        return CheckResult(LACKS, "0", "no hook depends on position")
    shifted = position_logits(enc, torch.arange(t) + probe.train_len, torch.arange(t) + probe.train_len, probe)
    rel = float((shifted - base).abs().max()) / spread(base)
    ok = rel > 1e-3
    why = "scores change under a shift" if ok else "scores are shift-invariant: only i - j is seen"
    return CheckResult(HAS if ok else LACKS, _fmt(rel), why)


def check_relative(enc: PositionalEncoding, probe: Probe) -> CheckResult:
    """The logit of a query at i and a key at j depends only on i - j.

    Shaw et al. 2018 and Raffel et al. 2020 (relative biases, Toeplitz by construction);
    Su et al. 2021, RoFormer eq. 16 ((R_m q)^T (R_n k) = q^T R_{n-m} k); Vaswani et al. 2017
    (PE(p)·PE(q) = sum_i cos((p - q) w_i) for sinusoidal codes).

    Measured: logits (H, T, T) for random content; largest deviation from the mean of each
    diagonal, and from the same matrix shifted by L, relative to the logits' range.
    """
    t = probe.train_len // 2
    pos = torch.arange(t)
    s = position_logits(enc, pos, pos, probe)
    if has_no_signal(s):
        return CheckResult(NA, "", "logits do not depend on position")
    H = s.shape[0]
    diag = (pos[:, None] - pos[None, :] + t - 1).reshape(1, -1).expand(H, -1)  # (H, T*T) diagonal ids
    sums = torch.zeros(H, 2 * t - 1, dtype=s.dtype).scatter_add_(1, diag, s.reshape(H, -1))  # (H, 2T-1)
    counts = torch.bincount(diag[0], minlength=2 * t - 1).to(s.dtype)
    diag_mean = (sums / counts).gather(1, diag).view_as(s)  # (H, T, T)
    rng = spread(s)
    resid = float((s - diag_mean).abs().max()) / rng
    if max_position(enc, probe) >= probe.train_len + t:
        shifted = position_logits(enc, pos + probe.train_len, pos + probe.train_len, probe)
        resid = max(resid, float((shifted - s).abs().max()) / rng)
    ok = resid < 1e-4
    return CheckResult(HAS if ok else LACKS, _fmt(resid), "max deviation from Toeplitz / logit range")


def check_linear_map(enc: PositionalEncoding, probe: Probe) -> CheckResult:
    """A fixed linear map T(k) takes the code of p to the code of p + k, for every p.

    Vaswani et al. 2017, §3.5: "for any fixed offset k, PE_{pos+k} can be represented as a
    linear function of PE_pos" (a block rotation); RoPE's rotated q, k share it.

    Measured: T(k) fitted by least squares on positions p < N (N > 4 F for F-dim codes, so a
    fit is not trivial), k in {1, 8, 32}; the worst relative residual ||X T - Y|| / ||Y||. Wide
    codes are fitted part by part, each part at most 512 features: the embed code's first and
    middle 256 columns (whole sin/cos pairs in both layouts), and the rotated q and k of the
    first heads (a rotary map acts head by head). A fit over F features costs N F^2, and a
    Llama-sized model's full code (F = 8192) would take hours.
    """
    if not (enc.has_embed or enc.has_rotate):
        return CheckResult(NA, "", "no per-token code: positions enter only through the scores")
    parts = code_parts(enc, torch.arange(1), probe)
    width = max(p.shape[-1] for p in parts)
    n = min(4 * width + 32, max_position(enc, probe) + 1)
    if n - 32 <= width:
        return CheckResult(NA, "", f"only {n} positions accepted; a {width}-dim map needs more")
    parts = code_parts(enc, torch.arange(n), probe)
    if all(float(p.norm()) == 0 for p in parts):
        return CheckResult(NA, "", "all codes are zero")
    worst = 0.0
    for codes in parts:
        if float(codes.norm()) == 0:
            continue
        for k in (1, 8, 32):
            x, y = codes[: n - k], codes[k:]
            t = torch.linalg.lstsq(x, y).solution  # (F, F)
            worst = max(worst, float((x @ t - y).norm() / y.norm()))
    ok = worst < 1e-4
    return CheckResult(HAS if ok else LACKS, _fmt(worst), f"worst least-squares residual over k in (1, 8, 32), p < {n}")


def check_bounded(enc: PositionalEncoding, probe: Probe) -> CheckResult:
    """Values do not grow with position: codes and logit terms stay in the range seen at short positions.

    Vaswani et al. 2017 (sin/cos in [-1, 1]); Su et al. 2021 (rotations preserve norms).
    Press et al. 2022 (ALiBi) and Sun et al. 2023 (xPos) grow by design: the ALiBi bias is
    -m (i - j), xPos scales keys by zeta^(-n).

    Measured: max |value| (codes; the additive logit terms of a query at p and a key at 0,
    without the content's q·k) at positions up to the far length (or the largest accepted) divided by max |value|
    at positions < L (the reported ratio), and the maximum per octave
    [L 2^j, L 2^(j+1)). Unbounded when the octave maxima rise in each of the last three octaves
    by steps that do not shrink (the last at least half the first): a logarithmic bias,
    r log(1 + d), adds the same step every octave however small r is, a linear one doubles it;
    a bounded curve oscillates or levels off (FIRE's bias is constant beyond its threshold,
    though its maximum there exceeds the one within L).
    """
    limit = min(probe.far_len, max_position(enc, probe))
    L = probe.train_len
    near = values_at(enc, torch.arange(L), probe)
    ref = float(near.max())
    if ref == 0:
        return CheckResult(NA, "", "no position-dependent values")
    octaves = []  # max |value| per octave [L 2^j, L 2^(j+1)), 16 log-spaced samples each
    lo = L
    while lo < limit:
        hi = min(2 * lo, limit)
        pos = torch.unique(torch.logspace(math.log10(lo), math.log10(hi), 16).round().long())
        octaves.append(float(values_at(enc, pos, probe).max()))
        lo = hi
    growth = max(octaves, default=ref) / ref
    steps = [b - a for a, b in zip(octaves[-4:], octaves[-3:])]
    tol = 1e-7 * max(octaves + [ref])
    rising = len(steps) == 3 and all(d > tol for d in steps) and steps[-1] >= 0.5 * steps[0]
    ok = not rising
    why = f"max |value| up to position {limit} / up to {L}"
    why += f"; rises by a steady step each octave (last {_fmt(steps[-1])})" if rising else "; levels off or oscillates"
    return CheckResult(HAS if ok else LACKS, f"x{_fmt(growth)}", why, {"octave_max": octaves, "near_max": ref})


def check_decay(enc: PositionalEncoding, probe: Probe) -> CheckResult:
    """The expected score decays with distance, up to a distance where it stops decaying.

    Su et al. 2021, RoFormer §3.4.3 (RoPE's long-term decay); Press et al. 2022 (ALiBi's linear
    penalty); Raffel et al. 2020 (T5's buckets stop at max_distance).

    Measured: s(d) = logit of a query at d and a key at 0 for E[q] = E[k] = 1 (all-ones
    content), averaged over heads. Upper envelope per octave [2^j, 2^(j+1)); decay = drop of
    the envelope from d = 1 to its minimum, as a fraction of the range of s; it stops at the
    first octave within 5% of that minimum.
    """
    dmax = min(probe.far_len, max_position(enc, probe))
    s = expected_score_curve(enc, probe, dmax)
    if has_no_signal(s[1:]):
        return CheckResult(NA, "", "the score does not depend on distance")
    prof = decay_profile(s)
    ok = prof["drop"] > 0.2
    stop = prof["edges"][prof["stop_bin"]]
    if not ok:
        return CheckResult(LACKS, f"drop {_fmt(prof['drop'])}", "no systematic decay of the score envelope", prof)
    where = f"still at {dmax}" if prof["stop_bin"] == len(prof["upper"]) - 1 else f"stops ~{stop}"
    return CheckResult(HAS, f"drop {_fmt(prof['drop'])}, {where}", "envelope drop / range; where it stops decaying", prof)


def check_extrapolation(enc: PositionalEncoding, probe: Probe) -> CheckResult:
    """The encoding produces positions beyond the training length, and its score curve there.

    Press et al. 2022 ("Train Short, Test Long"): learned tables stop at their length; fixed
    and relative schemes run on, with different behaviour of the score beyond L.

    Measured: the largest position the hooks accept (up to the probe cap); then s(d) (see the decay check) on [L, 8L] against [1, L): "keeps decaying",
    "flat" (range < 5% of the in-range one), "grows" (max |s| > 1.5 x in-range) or "stays in range".
    """
    cap = max_position(enc, probe)
    dmax = min(8 * probe.train_len, cap)
    if cap < 2 * probe.train_len:
        return CheckResult(LACKS, f"max pos {cap}", "rejects positions beyond twice the training length")
    s = expected_score_curve(enc, probe, dmax)
    L = probe.train_len
    inside, out = s[1:L], s[L:]
    r_in = float(inside.max() - inside.min())
    q = max(1, out.numel() // 4)
    if has_no_signal(s[1:]):
        shape = "no position signal"
    elif float(out[-q:].max()) < float(out[:q].min()):
        shape = "keeps decaying"
    elif float(out.max() - out.min()) < 0.05 * r_in:
        shape = "flat"
    elif float(out.abs().max()) > 1.5 * float(inside.abs().max()):
        shape = "grows"
    else:
        shape = "stays in range"
    ok = cap >= probe.max_probe_position
    pos = f">={cap}" if ok else f"max pos {cap}"
    return CheckResult(HAS if ok else LACKS, f"{pos}; beyond {L}: {shape}", "largest accepted position; score curve beyond L", {"max_position": cap, "shape": shape})


def _cost_model(enc: PositionalEncoding | None, dims: Dims) -> Callable[[Tensor, SequenceInfo], Tensor]:
    from .. import Attention

    torch.manual_seed(0)
    attn = Attention(dims.d_model, dims.num_heads, pe=enc, impl="eager").eval()

    def forward(x: Tensor, seq: SequenceInfo) -> Tensor:
        if enc is not None and enc.has_embed:
            x = enc.embed(x, seq)
        return attn(x, seq)

    return forward


def _time_per_token(fwd: Callable[[Tensor, SequenceInfo], Tensor], dims: Dims, t: int = 256) -> float:
    from ..speed.timing import time_fn

    x = torch.randn(1, t, dims.d_model)
    seq = SequenceInfo.from_offset(1, t)
    # One thread: at these sizes intra-op threads only add synchronisation, and on a busy
    # machine a thread that waits for a core makes timings swing by 10x and more.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return time_fn(lambda: fwd(x, seq), warmup=1, repeat=3) / t
    finally:
        torch.set_num_threads(threads)


def check_cost(enc: PositionalEncoding, probe: Probe) -> CheckResult:
    """Parameter count, and the extra time per token over no encoding.

    Press et al. 2022 (ALiBi: no parameters, negligible cost); Shaw et al. 2018 and He et al.
    2021 (DeBERTa) pay for (Tq, Tk) relative terms; Devlin et al. 2019 (a C x L table).

    Measured: parameters at the probe size; time per token of one eager attention forward
    (T = 256 or the table length, embed hook included, one thread) over the same with no
    encoding, the fastest of 5 alternating rounds each. Indicative only on a shared machine; a
    measurement, not a yes/no property.
    """
    params = sum(p.numel() for p in enc.parameters())
    # Baseline and encoding timed in alternation, the fastest of five rounds each: the ratio
    # is what matters, and on a shared machine noise only ever adds time. A wide model keeps
    # about the same work per round (T * C^2 in the projections), so a Llama-sized probe still
    # finishes in seconds.
    t = min(256, max(16, 2**16 // enc.dims.d_model), max_position(enc, probe) + 1)
    with_pe, without = _cost_model(enc, enc.dims), _cost_model(None, enc.dims)  # built once: a wide layer is slow to init
    runs = [(_time_per_token(with_pe, enc.dims, t), _time_per_token(without, enc.dims, t)) for _ in range(5)]
    ratio = min(r[0] for r in runs) / min(r[1] for r in runs)
    return CheckResult(
        MEASURED, f"{params} params, x{ratio:.2f}", "parameters; time per token / no encoding",
        {"params": params, "time_ratio": ratio},
    )


def check_linear_attention(enc: PositionalEncoding, probe: Probe) -> CheckResult:
    """Usable with linear (kernelized) attention: positions factor through per-token features.

    Su et al. 2021, RoFormer §3.3: with feature maps phi, the numerator becomes
    sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n and the denominator keeps phi(q)^T phi(k);
    Katharopoulos et al. 2020 (linear attention, phi = elu + 1).

    Measured: a causal linear-attention forward (prefix sums of per-token terms; it can use
    only ``embed`` and ``rotate``) against its quadratic equivalent, where every hook enters:
    sim = (rotated phi(q))·(rotated phi(k)) * exp(bias + logit terms). Max relative error.
    """
    torch.manual_seed(probe.seed)
    dims, t = enc.dims, 32
    H, D, C = dims.num_heads, dims.head_dim, dims.d_model
    g = generator(probe, 3)
    x = torch.randn(1, t, C, generator=g)
    seq = SequenceInfo.from_offset(1, t)
    if enc.has_embed:
        x = enc.embed(x, seq)
    w = torch.randn(3, C, H * D, generator=g) / math.sqrt(C)
    q, k, v = ((x @ w[i]).view(1, t, H, D).transpose(1, 2).double() for i in range(3))  # (1, H, T, D)
    phi = lambda z: torch.nn.functional.elu(z) + 1  # noqa: E731
    fq, fk = phi(q), phi(k)
    rq, rk = fq, fk
    pos = seq.positions
    if enc.has_rotate:
        rq, rk = (r.double() for r in rotated(enc, fq.float(), fk.float(), pos, pos))
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    proj = probe_projection(probe, x if enc.reads_layer_input else None) if enc.has_terms else None
    add = attention_logits(enc, fq.float(), fk.float(), pos, pos, proj, terms_only=True)  # (1, H, T, T)
    mult = add.exp().masked_fill(~causal, 0.0)  # (1, H, T, T)
    num_q = ((rq @ rk.transpose(-2, -1)) * mult) @ v  # (1, H, T, D)
    den_q = ((fq @ fk.transpose(-2, -1)) * mult).sum(-1, keepdim=True)  # (1, H, T, 1)
    quad = num_q / den_q
    kv = torch.einsum("bhtd,bhte->bhtde", rk, v).cumsum(2)  # (1, H, T, D, D) prefix sums
    num_l = torch.einsum("bhtd,bhtde->bhte", rq, kv)
    den_l = torch.einsum("bhtd,bhtd->bht", fq, fk.cumsum(2))[..., None]
    lin = num_l / den_l
    err = float((lin - quad).abs().max() / quad.abs().max())
    ok = err < 1e-4
    why = "linear form matches the quadratic one"
    if not ok:
        why = "a (Tq, Tk) logit term that per-token feature maps cannot carry"
    return CheckResult(HAS if ok else LACKS, _fmt(err), why)


# name -> (column title, check function). Order is the column order of the table.
CHECKS: dict[str, tuple[str, Callable[[PositionalEncoding, Probe], CheckResult]]] = {
    "absolute": ("absolute position", check_absolute),
    "relative": ("relative (i-j only)", check_relative),
    "linear_map": ("linear map T(k)", check_linear_map),
    "bounded": ("bounded", check_bounded),
    "decay": ("long-range decay", check_decay),
    "extrapolation": ("beyond train length", check_extrapolation),
    "cost": ("params, cost", check_cost),
    "linear_attention": ("linear attention", check_linear_attention),
}


# ---------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------
LEGEND = (
    "Each cell: the measurement (yes / no: has the property; n/a: it does not apply) and, in\n"
    "brackets, how it compares with what the literature claims for that encoding: [agrees],\n"
    "[expected yes|no] where it differs, [untrained] where the property depends on learned\n"
    "weights the probe has at random init, [no claim] where no paper makes one."
)


#: The widest line ``posenc check`` prints: a terminal's width, less a margin.
WIDTH = 120


def format_table(results: dict[str, dict[str, CheckResult]], width: int = WIDTH) -> str:
    """A plain-text table: one row per encoding, one column per check. The columns that do not
    fit in ``width`` characters beside the ones before them continue in a further block below
    (the encoding column repeated, a blank line between blocks), so no line is wider than
    ``width`` unless a single column is."""
    keys = list(CHECKS)
    header = ["encoding"] + [CHECKS[k][0] for k in keys]
    rows = [[name] + [r[k].cell() if k in r else "" for k in keys] for name, r in results.items()]
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    blocks: list[list[int]] = [[]]
    for i in range(1, len(header)):  # greedy: a column joins the block while the block's line fits
        used = widths[0] + sum(2 + widths[j] for j in blocks[-1])
        if blocks[-1] and used + 2 + widths[i] > width:
            blocks.append([])
        blocks[-1].append(i)

    def line(row: list[str], cols: list[int]) -> str:
        return "  ".join(row[j].ljust(widths[j]) for j in [0, *cols]).rstrip()

    return "\n\n".join("\n".join([line(header, b), line(["-" * w for w in widths], b)] + [line(r, b) for r in rows])
                       for b in blocks)


def _fill(text: str, width: int, lead: str, rest: str) -> str:
    """``text`` wrapped at spaces only (a hyphenated word or a long formula stays whole)."""
    return textwrap.fill(text, width, initial_indent=lead, subsequent_indent=rest, break_on_hyphens=False,
                         break_long_words=False)


def format_claims(width: int = WIDTH) -> str:
    """Each check's claim, its papers and its measurement (:func:`claims`), wrapped to ``width``."""
    fill = lambda text, lead, rest: _fill(text, width, lead, rest)  # noqa: E731
    return "\n".join(f"{fill(f'{title}: {claim}', '', '    ')}\n{fill(papers, '    ', '    ')}\n"
                     f"{fill(f'measured: {measured}', '    ', '      ')}"
                     for _, title, claim, papers, measured in claims())


def format_differ(results: dict[str, dict[str, CheckResult]], width: int = WIDTH) -> list[str]:
    """One wrapped line group per cell whose verdict differs from the literature's claim."""
    return [_fill(f"{n} / {CHECKS[k][0]}: measured {r.status} {r.value}, expected {r.expected} ({r.source})",
                  width, "  ", "      ")
            for n, rs in results.items() for k, r in rs.items() if r.verdict == "differs"]


def claims() -> list[tuple[str, str, str, str, str]]:
    """(key, title, claim, papers, measurement) for every check, from its docstring's paragraphs."""
    out = []
    for key, (title, fn) in CHECKS.items():
        paras = [" ".join(plain(p).split()) for p in (fn.__doc__ or "").strip().split("\n\n")] + ["", "", ""]
        out.append((key, title, paras[0], paras[1], paras[2].removeprefix("Measured: ")))
    return out


def results_to_json(results: dict[str, dict[str, CheckResult]]) -> dict:
    return {n: {k: asdict(r) for k, r in rs.items()} for n, rs in results.items()}
