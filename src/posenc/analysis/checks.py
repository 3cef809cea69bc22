"""``posenc check``: the literature's claims about each encoding, measured by running it.

Every check is a small function ``check_x(enc, probe) -> CheckResult`` whose docstring states
the claim and its paper. Nothing is declared by hand: each cell comes from calling the
encoding's hooks (``embed`` / ``rotate`` / ``score_bias`` / ``score``) on a tiny model
(:class:`Probe`, d_model 64, 4 heads by default). A check that does not apply to the hooks an
encoding overrides answers ``n/a`` with the reason.

Examples::

    posenc check                      # every registered encoding
    posenc check sinusoidal learned   # some of them
    posenc check --json               # machine-readable

Two probe quantities are shared by the checks:

* the *code* of position p: what a single token at p receives on its own — the change
  ``embed`` makes to a constant content vector, and/or the ``rotate``-d q and k — (N, F);
* the *logits* (H, Tq, Tk) between a query at i and a key at j whose content is the same at
  every position, built the way :class:`posenc.Attention` builds them (rotate, q·k * scale,
  score_bias, score); an ``embed`` encoding contributes code(i)·code(j) / sqrt(C), the
  textbook PE(i)·PE(j) (identity projections).

Notation: B batch, T length, H heads, D head dim, C model width.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import Tensor

from ..cli_args import add_json_option, emit_json, int_at_least, positive_int
from ..config import check_int
from ..encoding import Dims, PositionalEncoding
from ..positions import SequenceInfo
from .claims import expected_for, verdict

__all__ = [
    "CHECKS",
    "CheckResult",
    "Probe",
    "build_probe_encoding",
    "check_encoding",
    "run_checks",
    "format_table",
    "position_codes",
    "position_logits",
    "max_position",
]

HAS, LACKS, NA, ERROR = "yes", "no", "n/a", "error"
MEASURED = ""  # a measurement with no yes/no answer (the cost)


@dataclass(frozen=True)
class Probe:
    """Sizes of the probe model and of the position ranges the checks look at.

    Args:
        d_model, num_heads: the tiny model the encoding is built for (head dim = C // H).
        train_len: the length a model would have been trained at (L); check 6 compares
            the score curve beyond it with the curve within it.
        far_len: longest distance for the decay and boundedness curves.
        max_probe_position: the largest position tried when asking "does it accept p?".
        seed: seed of the random content vectors.
    """

    d_model: int = 64
    num_heads: int = 4
    train_len: int = 128
    far_len: int = 2048
    max_probe_position: int = 2**14
    seed: int = 0
    accepted: int | None = None  # max_position of the encoding under test, set by check_encoding

    def __post_init__(self) -> None:
        check_int("d_model", self.d_model, minimum=2)
        check_int("num_heads", self.num_heads, minimum=1)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        check_int("train_len", self.train_len, minimum=8)
        check_int("far_len", self.far_len, minimum=2 * self.train_len)
        check_int("max_probe_position", self.max_probe_position, minimum=self.far_len)

    @property
    def dims(self) -> Dims:
        return Dims(self.d_model, self.num_heads, self.d_model // self.num_heads)


@dataclass
class CheckResult:
    """One cell: what was measured, and what the literature expects.

    ``status``: "yes" (the encoding has the property), "no", "n/a" (the property does not
    apply to the hooks it overrides), "error", or "" for a plain measurement (the cost); ``value`` the measured number; ``detail`` what
    the number is. ``expected`` ("yes", "no", "untrained" or "" for no claim), ``source`` (the
    citation) and ``verdict`` ("agrees", "differs", "untrained", "no claim", or the status when
    nothing was measured) are filled from :mod:`posenc.analysis.claims` by
    :func:`check_encoding` for a registered encoding.
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


# ---------------------------------------------------------------------------------------
# Probing the hooks
# ---------------------------------------------------------------------------------------
def _generator(probe: Probe, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(probe.seed * 1000 + salt)


def _content(enc: PositionalEncoding, probe: Probe, kind: str = "random") -> tuple[Tensor, Tensor]:
    """Per-head content vectors (H, D) for q and k: random N(0, 1) or all ones."""
    H, D = enc.dims.num_heads, enc.dims.head_dim
    if kind == "ones":
        return torch.ones(H, D), torch.ones(H, D)
    g = _generator(probe, 1)
    return torch.randn(H, D, generator=g), torch.randn(H, D, generator=g)


def _embed_code(enc: PositionalEncoding, positions: Tensor, probe: Probe) -> Tensor:
    """(N,) positions -> (N, C): what ``embed`` adds to the same content vector at each position."""
    C = enc.dims.d_model
    c = torch.randn(C, generator=_generator(probe, 2))
    x = c.expand(1, positions.numel(), C).contiguous()  # (1, N, C)
    return (enc.embed(x, SequenceInfo(positions[None])) - x)[0].double()


def position_codes(enc: PositionalEncoding, positions: Tensor, probe: Probe) -> Tensor | None:
    """Per-token position codes (N, F) float64, or None when no hook acts on single tokens.

    The code concatenates the ``embed`` code (N, C) and the rotated q and k (N, 2 * H * D) for
    random content that is the same at every position.
    """
    parts = []
    if enc.has_embed:
        parts.append(_embed_code(enc, positions, probe))
    if enc.has_rotate:
        N, H, D = positions.numel(), enc.dims.num_heads, enc.dims.head_dim
        qc, kc = _content(enc, probe)
        q = qc[None, :, None, :].expand(1, H, N, D).contiguous()  # (1, H, N, D)
        k = kc[None, :, None, :].expand(1, H, N, D).contiguous()
        pos = positions[None]
        rq, rk = enc.rotate(q, k, pos, pos)
        parts.append(rq[0].transpose(0, 1).reshape(N, H * D).double())  # (N, H*D)
        parts.append(rk[0].transpose(0, 1).reshape(N, -1).double())
    return torch.cat(parts, dim=-1) if parts else None


def position_logits(
    enc: PositionalEncoding, q_pos: Tensor, k_pos: Tensor, probe: Probe, content: str = "random",
    terms_only: bool = False,
) -> Tensor:
    """Logits (H, Tq, Tk) float64 between queries at ``q_pos`` and keys at ``k_pos``.

    Content is the same at every position (random or all ones per head), so every change
    across the matrix comes from the encoding. Built as :class:`posenc.Attention` does.
    ``terms_only``: just the additive terms (``score_bias`` and ``score``), without the
    embed codes' product and q·k.
    """
    H, D, C = enc.dims.num_heads, enc.dims.head_dim, enc.dims.d_model
    Tq, Tk = q_pos.numel(), k_pos.numel()
    logits = torch.zeros(H, Tq, Tk, dtype=torch.float64)
    if enc.has_embed and not terms_only:
        eq, ek = _embed_code(enc, q_pos, probe), _embed_code(enc, k_pos, probe)
        logits += (eq @ ek.T / math.sqrt(C))[None]  # PE(i)·PE(j), identity projections
    qc, kc = _content(enc, probe, content)
    q = qc[None, :, None, :].expand(1, H, Tq, D).contiguous()  # (1, H, Tq, D)
    k = kc[None, :, None, :].expand(1, H, Tk, D).contiguous()  # (1, H, Tk, D)
    qp, kp = q_pos[None], k_pos[None]
    if enc.has_rotate:
        q, k = enc.rotate(q, k, qp, kp)
    scale = enc.attention_scale(D)
    if not terms_only:
        logits += (q.double() @ k.double().transpose(-2, -1))[0] * scale
    if enc.has_score_bias:
        logits += enc.score_bias(qp, kp)[0].double()  # (1 or H, Tq, Tk) broadcasts
    if enc.has_score:
        logits += enc.score(q, k, qp, kp, scale)[0].double()
    return logits


def _accepts(enc: PositionalEncoding, p: int, probe: Probe) -> bool:
    """Whether every hook the encoding has runs at position ``p`` (key at 0, query at p)."""
    pos = torch.tensor([p])
    try:
        if enc.has_embed or enc.has_rotate:
            code = position_codes(enc, pos, probe)
            if code is not None and not bool(torch.isfinite(code).all()):
                return False
        s = position_logits(enc, pos, torch.tensor([0]), probe)
        return bool(torch.isfinite(s).all())
    except (ValueError, IndexError, RuntimeError):
        return False


def max_position(enc: PositionalEncoding, probe: Probe) -> int:
    """Largest position the hooks accept, up to ``probe.max_probe_position`` (doubling, then bisection).

    Several checks ask; :func:`check_encoding` computes it once per encoding and hands it to
    them in ``probe.accepted`` (a stateful encoding, an ODE or a recurrence, pays for every far
    position it is asked about).
    """
    if probe.accepted is not None:
        return probe.accepted
    cap = probe.max_probe_position
    if _accepts(enc, cap, probe):  # the common case, in one call
        return cap
    if not _accepts(enc, 0, probe):
        return -1
    lo, hi = 0, 1
    while hi < cap and _accepts(enc, hi, probe):
        lo, hi = hi, min(2 * hi, cap)
    while hi - lo > 1:  # lo accepted, hi rejected
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _accepts(enc, mid, probe) else (lo, mid)
    return lo


def _spread(x: Tensor) -> float:
    """Largest within-head range of logits (H, ...) — a per-head constant carries no position."""
    if x.dim() == 1:
        return float(x.max() - x.min())
    flat = x.reshape(x.shape[0], -1)
    return float((flat.amax(-1) - flat.amin(-1)).max())


def _no_signal(x: Tensor) -> bool:
    return _spread(x) <= 1e-9 * (1.0 + float(x.abs().max()))


def _fmt(x: float) -> str:
    return f"{x:.2g}" if (x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e4)) else f"{x:.3g}"


def _expected_score_curve(enc: PositionalEncoding, probe: Probe, dmax: int) -> Tensor:
    """s(d), d = 0..dmax: head-mean logit of a query at d and a key at 0 for all-ones content.

    For independent q, k with E[q] = E[k] = 1, E[q^T M k] = 1^T M 1, so all-ones content gives
    the expected score exactly (Su et al. 2021, RoFormer §3.4.3 study the same sum).
    """
    s = position_logits(enc, torch.arange(dmax + 1), torch.tensor([0]), probe, content="ones")
    return s[:, :, 0].mean(0)  # (dmax + 1,)


def _decay_profile(s: Tensor) -> dict:
    """Upper envelope of s over octaves [2^k, 2^(k+1)), the drop and where it stops decaying."""
    dmax = s.numel() - 1
    edges = [1]
    while edges[-1] <= dmax:
        edges.append(2 * edges[-1])
    upper = [float(s[a : min(b, dmax + 1)].max()) for a, b in zip(edges[:-1], edges[1:])]
    tail = s[1:]
    rng = float(tail.max() - tail.min())
    low = min(upper)
    drop = (upper[0] - low) / rng if rng > 0 else 0.0
    running, stop = math.inf, len(upper) - 1
    for i, u in enumerate(upper):
        running = min(running, u)
        if running <= low + 0.05 * rng:
            stop = i
            break
    return {"edges": edges[:-1], "upper": upper, "drop": drop, "stop_bin": stop, "range": rng}


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
    if _no_signal(base):
        return CheckResult(LACKS, "0", "no hook depends on position")
    shifted = position_logits(enc, torch.arange(t) + probe.train_len, torch.arange(t) + probe.train_len, probe)
    rel = float((shifted - base).abs().max()) / _spread(base)
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
    if _no_signal(s):
        return CheckResult(NA, "", "logits do not depend on position")
    H = s.shape[0]
    diag = (pos[:, None] - pos[None, :] + t - 1).reshape(1, -1).expand(H, -1)  # (H, T*T) diagonal ids
    sums = torch.zeros(H, 2 * t - 1, dtype=s.dtype).scatter_add_(1, diag, s.reshape(H, -1))  # (H, 2T-1)
    counts = torch.bincount(diag[0], minlength=2 * t - 1).to(s.dtype)
    diag_mean = (sums / counts).gather(1, diag).view_as(s)  # (H, T, T)
    rng = _spread(s)
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
    parts = _code_parts(enc, torch.arange(1), probe)
    width = max(p.shape[-1] for p in parts)
    n = min(4 * width + 32, max_position(enc, probe) + 1)
    if n - 32 <= width:
        return CheckResult(NA, "", f"only {n} positions accepted; a {width}-dim map needs more")
    parts = _code_parts(enc, torch.arange(n), probe)
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


_MAX_FIT = 512  # features per least-squares fit in the linear-map check


def _code_parts(enc: PositionalEncoding, positions: Tensor, probe: Probe) -> list[Tensor]:
    """The per-token code (see :func:`position_codes`) in parts of at most ``_MAX_FIT`` features.

    A narrow code is one part. A wide embed code keeps columns [0, 256) and [C/2, C/2 + 256):
    interleaved sin/cos pairs are adjacent and half-layout pairs are C/2 apart, so both layouts
    keep whole pairs. Rotated q and k keep their first heads, up to 256 features each.
    """
    code = position_codes(enc, positions, probe)
    if code.shape[-1] <= _MAX_FIT:
        return [code]
    parts, at = [], 0
    if enc.has_embed:
        C = enc.dims.d_model
        emb = code[:, :C]
        if C > _MAX_FIT:
            half, w = C // 2, _MAX_FIT // 2
            emb = torch.cat([emb[:, :w], emb[:, half : half + w]], dim=-1)
        parts.append(emb)
        at = C
    if enc.has_rotate:
        H, D = enc.dims.num_heads, enc.dims.head_dim
        keep = max(1, (_MAX_FIT // 2) // D) * D  # whole heads
        q, k = code[:, at : at + H * D], code[:, at + H * D :]
        qk = torch.cat([q[:, :keep], k[:, :keep]], dim=-1)
        parts.extend([qk] if qk.shape[-1] <= _MAX_FIT else [q[:, :keep], k[:, :keep]])
    return parts


def _values_at(enc: PositionalEncoding, positions: Tensor, probe: Probe) -> Tensor:
    """Largest magnitude of everything position-dependent at each position p: the code, and the
    additive logit terms (``score_bias``, ``score``) of a query at p and a key at 0 on their own
    (the content part q·k is the same at every position and would hide a small growing bias)."""
    out = torch.zeros(positions.numel(), dtype=torch.float64)
    if enc.has_score_bias or enc.has_score:
        out = position_logits(enc, positions, torch.tensor([0]), probe, terms_only=True)[:, :, 0].abs().amax(0)  # (N,)
    codes = position_codes(enc, positions, probe)
    if codes is not None:
        out = torch.maximum(out, codes.abs().amax(-1))
    return out


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
    near = _values_at(enc, torch.arange(L), probe)
    ref = float(near.max())
    if ref == 0:
        return CheckResult(NA, "", "no position-dependent values")
    octaves = []  # max |value| per octave [L 2^j, L 2^(j+1)), 16 log-spaced samples each
    lo = L
    while lo < limit:
        hi = min(2 * lo, limit)
        pos = torch.unique(torch.logspace(math.log10(lo), math.log10(hi), 16).round().long())
        octaves.append(float(_values_at(enc, pos, probe).max()))
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
    s = _expected_score_curve(enc, probe, dmax)
    if _no_signal(s[1:]):
        return CheckResult(NA, "", "the score does not depend on distance")
    prof = _decay_profile(s)
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
    s = _expected_score_curve(enc, probe, dmax)
    L = probe.train_len
    inside, out = s[1:L], s[L:]
    r_in = float(inside.max() - inside.min())
    q = max(1, out.numel() // 4)
    if _no_signal(s[1:]):
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
    from ..attention import Attention

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
    sim = (rotated phi(q))·(rotated phi(k)) * exp(score_bias + score). Max relative error.
    """
    torch.manual_seed(probe.seed)
    dims, t = enc.dims, 32
    H, D, C = dims.num_heads, dims.head_dim, dims.d_model
    g = _generator(probe, 3)
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
        rq, rk = (r.double() for r in enc.rotate(fq.float(), fk.float(), pos, pos))
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    add = torch.zeros(1, H, t, t, dtype=torch.float64)
    if enc.has_score_bias:
        add = add + enc.score_bias(pos, pos).double()
    if enc.has_score:
        add = add + enc.score(fq.float(), fk.float(), pos, pos, enc.attention_scale(D)).double()
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
# Running and printing
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def _perturb_zero_params(enc: PositionalEncoding, seed: int) -> None:
    # A learned table initialised to exactly zero (T5-style bias, some relative embeddings)
    # would make every probe answer "no position signal"; small random values show structure.
    g = torch.Generator().manual_seed(seed)
    for p in enc.parameters():
        if p.is_floating_point() and not bool(p.any()):
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))


def build_probe_encoding(name: str, probe: Probe) -> PositionalEncoding:
    """Build registered encoding ``name`` at the probe size, default config, eval mode."""
    from ..registry import build, get_info

    torch.manual_seed(probe.seed)
    # Eager kernels: the checks call each hook a few times on new shapes, where compiling a
    # fused kernel (RoPE's "auto" on large inputs) would take longer than the whole check.
    extra = {"kernel": "eager"} if "kernel" in {f.name for f in dataclasses.fields(get_info(name).config_cls)} else {}
    enc = build(name, d_model=probe.d_model, num_heads=probe.num_heads, **extra).eval()
    _perturb_zero_params(enc, probe.seed)
    return enc


@torch.no_grad()
def check_encoding(enc: PositionalEncoding, probe: Probe | None = None, only: list[str] | None = None) -> dict[str, CheckResult]:
    """Run every check (or those in ``only``) on an encoding instance; errors become ``error`` cells."""
    probe = Probe() if probe is None else probe
    out = {}
    try:
        probe = dataclasses.replace(probe, accepted=max_position(enc, dataclasses.replace(probe, accepted=None)))
    except Exception:  # noqa: BLE001 - each check then reports the failure itself
        probe = dataclasses.replace(probe, accepted=None)
    for key, (_, fn) in CHECKS.items():
        if only is not None and key not in only:
            continue
        try:
            out[key] = fn(enc, probe)
        except NotImplementedError as e:
            out[key] = CheckResult(NA, "", f"hook not implemented: {e}")
        except Exception as e:  # noqa: BLE001 - a failing probe is reported, not hidden
            out[key] = CheckResult(ERROR, type(e).__name__, str(e))
        expected, source = expected_for(enc.name, key)
        r = out[key]
        r.expected = {True: HAS, False: LACKS, None: ""}.get(expected, str(expected))
        r.source = source
        r.verdict = verdict(r.status, expected)
    return out


def run_checks(names: list[str] | None = None, probe: Probe | None = None) -> dict[str, dict[str, CheckResult]]:
    """``{encoding: {check: result}}`` for the given registered names (default: all)."""
    from ..registry import get_info, list_encodings

    probe = Probe() if probe is None else probe
    names = list_encodings() if not names else list(names)
    for n in names:
        get_info(n)  # an unknown name lists the valid ones
    return {n: check_encoding(build_probe_encoding(n, probe), probe) for n in names}


LEGEND = (
    "Each cell: the measurement (yes / no: has the property; n/a: it does not apply) and, in\n"
    "brackets, how it compares with what the literature claims for that encoding: [agrees],\n"
    "[expected yes|no] where it differs, [untrained] where the property depends on learned\n"
    "weights the probe has at random init, [no claim] where no paper makes one."
)


def format_table(results: dict[str, dict[str, CheckResult]]) -> str:
    """A plain-text table: one row per encoding, one column per check."""
    keys = list(CHECKS)
    header = ["encoding"] + [CHECKS[k][0] for k in keys]
    rows = [[name] + [r[k].cell() if k in r else "" for k in keys] for name, r in results.items()]
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    line = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def claims() -> list[tuple[str, str, str, str, str]]:
    """(key, title, claim, papers, measurement) for every check, from its docstring's paragraphs."""
    out = []
    for key, (title, fn) in CHECKS.items():
        paras = [" ".join(p.split()) for p in (fn.__doc__ or "").strip().split("\n\n")] + ["", "", ""]
        out.append((key, title, paras[0], paras[1], paras[2].removeprefix("Measured: ")))
    return out


def results_to_json(results: dict[str, dict[str, CheckResult]]) -> dict:
    return {n: {k: asdict(r) for k, r in rs.items()} for n, rs in results.items()}


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------
def _cmd_check(args: argparse.Namespace) -> int:
    if args.d_model % args.heads:  # each was checked by the parser; this is the pair
        raise ValueError(f"--d-model ({args.d_model}) must be divisible by --heads ({args.heads})")
    probe = Probe(d_model=args.d_model, num_heads=args.heads, train_len=args.train_len)
    results = run_checks(args.names, probe)
    from ..bench.files import finite_or_none  # strict JSON: a non-finite measurement is null

    if not emit_json(args.json, finite_or_none(results_to_json(results))):
        print(format_table(results))
        print()
        print(LEGEND)
        differ = [(n, k, r) for n, rs in results.items() for k, r in rs.items() if r.verdict == "differs"]
        print(f"{sum(r.verdict == 'agrees' for rs in results.values() for r in rs.values())} cells agree with "
              f"the literature, {len(differ)} differ" + (":" if differ else "."))
        for n, k, r in differ:
            print(f"  {n} / {CHECKS[k][0]}: measured {r.status} {r.value}, expected {r.expected} ({r.source})")
        print()
        for _, title, claim, papers, measured in claims():
            print(f"{title}: {claim}\n    {papers}\n    measured: {measured}")
    errors = [f"{n}.{k}: {r.detail}" for n, rs in results.items() for k, r in rs.items() if r.status == ERROR]
    for e in errors:
        print(f"posenc check: probe error in {e}", file=sys.stderr)
    return 1 if errors else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check", help="measure each encoding's claimed properties by running it")
    p.add_argument("names", nargs="*", metavar="NAME", help="encodings to check (default: all registered)")
    add_json_option(p, "every cell (status, value, detail, data, expected, source, verdict)")
    p.add_argument("--d-model", type=int_at_least(2), default=64, help="probe model width C (default 64)")
    p.add_argument("--heads", type=positive_int, default=4, help="probe heads H, dividing --d-model (default 4)")
    p.add_argument("--train-len", type=int_at_least(8), default=128, help="training length L the curves are judged against (default 128)")
    p.set_defaults(func=_cmd_check)

