"""The probe maths of ``posenc check``: what an encoding does to single tokens and to logits.

A tiny model (:class:`Probe`: d_model 64, 4 heads by default) and two quantities the checks
share:

* the *code* of position p: what a single token at p receives on its own — the change
  ``embed`` makes to a constant content vector, and/or the ``rotate``-d q and k — (N, F);
* the *logits* (H, Tq, Tk) between a query at i and a key at j whose content is the same at
  every position. Their attention part comes through the per-forward objects
  :class:`posenc.Attention` itself uses (the context, the encoding's ``EncodingState``: its
  rotation, shared bias and layer terms) and the eager backend's formula
  ``q·kᵀ·scale + terms``, in float64; an ``embed`` encoding adds code(i)·code(j) / sqrt(C),
  the textbook PE(i)·PE(j) (identity projections). The weights of those logits are the layer's
  (:func:`attention_weights`: their softmax, or their exp where the terms are log weights).

An encoding whose logit depends on the tokens between key and query (:func:`reads_the_stream`:
FoX's gates of the layer input, CoPE's counts, stick-breaking's sticks) is probed on one stream of
identical tokens, the keys at or before the queries, as a decoding run sees them.

Notation: B batch, T length, H heads, D head dim, C model width, N positions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import Attention, AttentionContext
from ..backends import LayerTerms
from ..config import check_int
from ..encoding import Dims, PositionalEncoding, QKProjection
from ..positions import SequenceInfo
from ..scan_terms import EXCLUDED, CountTerm, StickSums

__all__ = [
    "Probe",
    "attention_logits",
    "attention_weights",
    "code_parts",
    "content_input",
    "content_vectors",
    "decay_profile",
    "expected_score_curve",
    "generator",
    "has_no_signal",
    "max_position",
    "position_codes",
    "position_logits",
    "probe_projection",
    "reads_the_stream",
    "rotated",
    "spread",
    "values_at",
]


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


def generator(probe: Probe, salt: int) -> torch.Generator:
    """A generator seeded from the probe's seed and a per-use salt."""
    return torch.Generator().manual_seed(probe.seed * 1000 + salt)


def content_vectors(enc: PositionalEncoding, probe: Probe, kind: str = "random") -> tuple[Tensor, Tensor]:
    """Per-head content vectors (H, D) for q and k: random N(0, 1) or all ones."""
    H, D = enc.dims.num_heads, enc.dims.head_dim
    if kind == "ones":
        return torch.ones(H, D), torch.ones(H, D)
    g = generator(probe, 1)
    return torch.randn(H, D, generator=g), torch.randn(H, D, generator=g)


def _embed_code(enc: PositionalEncoding, positions: Tensor, probe: Probe) -> Tensor:
    """(N,) positions -> (N, C): what ``embed`` adds to the same content vector at each position."""
    C = enc.dims.d_model
    c = torch.randn(C, generator=generator(probe, 2))
    x = c.expand(1, positions.numel(), C).contiguous()  # (1, N, C)
    return (enc.embed(x, SequenceInfo(positions[None])) - x)[0].double()


def _prepared(enc: PositionalEncoding, q_pos: Tensor, k_pos: Tensor):
    """The encoding's state for one bidirectional forward of queries at q_pos (B, Tq) and keys
    at k_pos (B, Tk), made by the context as :class:`posenc.Attention` makes it."""
    ctx = AttentionContext.build(SequenceInfo(q_pos), SequenceInfo(k_pos), causal=False)
    return ctx.prepare(enc)


def rotated(enc: PositionalEncoding, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
    """q (B, H, Tq, D) and k (B, H, Tk, D) rotated as :class:`posenc.Attention` rotates them."""
    return _prepared(enc, q_pos, k_pos).rotate(q, k, k_pos)


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
        qc, kc = content_vectors(enc, probe)
        q = qc[None, :, None, :].expand(1, H, N, D).contiguous()  # (1, H, N, D)
        k = kc[None, :, None, :].expand(1, H, N, D).contiguous()
        pos = positions[None]
        rq, rk = rotated(enc, q, k, pos, pos)  # (1, H, N, D'): D' = D, or 2D for PoPE's real form
        parts.append(rq[0].transpose(0, 1).reshape(N, -1).double())  # (N, H*D')
        parts.append(rk[0].transpose(0, 1).reshape(N, -1).double())
    return torch.cat(parts, dim=-1) if parts else None


@functools.lru_cache(maxsize=4)
def _projection(d_model: int, num_heads: int, seed: int) -> QKProjection:
    with torch.random.fork_rng():  # the checks' own random draws stay as they were
        torch.manual_seed(seed)
        return QKProjection.of(Attention(d_model, num_heads, impl="eager", causal=False))


def probe_projection(probe: Probe, x: Tensor | None = None) -> QKProjection:
    """The projections a content-dependent encoding may read (DeBERTa's ``share_att_key``):
    those of a seeded attention layer of the probe's size (built once per size and seed), with
    ``x`` (1, Tk, C) as the layer input of the keys (FoX's gates read it) when given."""
    proj = _projection(probe.d_model, probe.num_heads, probe.seed)
    return proj if x is None else dataclasses.replace(proj, x=x)


def content_input(enc: PositionalEncoding, probe: Probe, length: int) -> Tensor:
    """(1, length, C): the layer input of ``length`` tokens whose content is the same at every
    position (one random vector), for encodings whose terms read the layer input (FoX: then
    every gate is the same, and its bias a function of the stream distance)."""
    c = torch.randn(enc.dims.d_model, generator=generator(probe, 4))
    return c.expand(1, length, -1)


def attention_logits(
    enc: PositionalEncoding, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, proj: QKProjection | None,
    terms_only: bool = False,
) -> Tensor:
    """Logits (B, H, Tq, Tk) float64 of one bidirectional attention call, before the softmax
    (or the exp: :func:`attention_weights`).

    q (B, H, Tq, D) at q_pos (B, Tq) and k (B, H, Tk, D) at k_pos (B, Tk), unrotated. The steps
    are :class:`posenc.Attention`'s: the context prepares the encoding once
    (``AttentionContext.prepare``: its ``prepare`` state and shared bias), the state rotates the
    new q and k and gives the layer's terms (bias plus ``terms(q, k, state, proj)``), and the
    eager backend's logits ``q·kᵀ·scale + terms`` are formed, here in float64 from the same
    operands. ``terms_only``: the additive terms alone, without q·kᵀ.
    """
    return _logits_and_terms(enc, q, k, q_pos, k_pos, proj, terms_only)[0]


def attention_weights(
    enc: PositionalEncoding, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, proj: QKProjection | None,
) -> Tensor:
    """Weights (B, H, Tq, Tk) float64 of the same call as :func:`attention_logits`: softmax of
    the logits, or exp of them when the layer's terms say the logits are log weights
    (``LayerTerms.normalized`` False: stick-breaking, whose rows sum to at most 1), as the
    eager backend forms them."""
    logits, terms = _logits_and_terms(enc, q, k, q_pos, k_pos, proj)
    return logits.softmax(-1) if terms.normalized else logits.exp()


def _logits_and_terms(
    enc: PositionalEncoding, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, proj: QKProjection | None,
    terms_only: bool = False,
) -> tuple[Tensor, LayerTerms]:
    """:func:`attention_logits` and the layer's terms they were formed with."""
    state = _prepared(enc, q_pos, k_pos)
    scale = state.scale(q.shape[-1])  # of the head dim before rotation (PoPE's rotate doubles the width)
    q, k = state.rotate(q, k, k_pos)
    terms = state.layer_terms(q, k, k, proj)
    logits = torch.zeros(*q.shape[:3], k.shape[2], dtype=torch.float64)  # (B, H, Tq, Tk)
    if not terms_only:
        logits = logits + (q.double() @ k.double().transpose(-2, -1)) * scale
    add = terms.dense_logits()  # (B|1, H|1, Tq, Tk)
    if add is not None:
        logits = logits + add.double()
    return logits, terms


#: Term kinds whose value at a pair is a scan over the keys between the key and its query
#: (CoPE's counts; the stick terms: stick-breaking's and per_row_alibi's).
SCAN_TERMS = (CountTerm, StickSums)


def reads_the_stream(enc: PositionalEncoding, probe: Probe) -> bool:
    """Whether a logit depends on the tokens between its key and its query: the terms read the
    layer input (FoX's gates), or one of them is a scan over the keys in between (CoPE's counts,
    stick-breaking's sticks; read from the layer's terms of a two-token call). Such an
    encoding is probed on a stream (:func:`position_logits`): a query at p and a key at 0 alone
    would see no token between them."""
    if enc.reads_layer_input:
        return True
    if not enc.has_terms:
        return False
    H, D = enc.dims.num_heads, enc.dims.head_dim
    qc, kc = content_vectors(enc, probe, "ones")
    pos = torch.arange(2)[None]
    q, k = qc[None, :, None].expand(1, H, 2, D), kc[None, :, None].expand(1, H, 2, D)
    terms = _logits_and_terms(enc, q, k, pos, pos, probe_projection(probe), terms_only=True)[1]
    return any(isinstance(t, SCAN_TERMS) for t in terms.logits)


def position_logits(
    enc: PositionalEncoding, q_pos: Tensor, k_pos: Tensor, probe: Probe, content: str = "random",
    terms_only: bool = False,
) -> Tensor:
    """Logits (H, Tq, Tk) float64 between queries at ``q_pos`` (Tq,) and keys at ``k_pos`` (Tk,).

    Content is the same at every position (random or all ones per head), so every change
    across the matrix comes from the encoding: :func:`attention_logits` of that content, plus
    the embed codes' product PE(i)·PE(j) / sqrt(C). ``terms_only``: just the additive terms
    (bias and logit terms), without the embed codes' product and q·k.
    """
    H, D, C = enc.dims.num_heads, enc.dims.head_dim, enc.dims.d_model
    Tq, Tk = q_pos.numel(), k_pos.numel()
    if not torch.equal(q_pos, k_pos) and reads_the_stream(enc, probe):
        return _stream_logits(enc, q_pos, k_pos, probe, content, terms_only)
    qc, kc = content_vectors(enc, probe, content)
    q = qc[None, :, None, :].expand(1, H, Tq, D).contiguous()  # (1, H, Tq, D)
    k = kc[None, :, None, :].expand(1, H, Tk, D).contiguous()  # (1, H, Tk, D)
    x = content_input(enc, probe, Tk) if enc.reads_layer_input else None  # q_pos == k_pos: one stream
    proj = probe_projection(probe, x) if enc.has_terms else None  # only ``terms`` reads it
    logits = attention_logits(enc, q, k, q_pos[None], k_pos[None], proj, terms_only)[0]
    if enc.has_embed and not terms_only:
        eq, ek = _embed_code(enc, q_pos, probe), _embed_code(enc, k_pos, probe)
        logits = (eq @ ek.T / math.sqrt(C))[None] + logits  # PE(i)·PE(j), identity projections
    return logits.expand(H, Tq, Tk)


#: Tokens per step when the probe runs a stream through an encoding that reads the layer input.
STREAM_CHUNK = 512


def _stream_logits(
    enc: PositionalEncoding, q_pos: Tensor, k_pos: Tensor, probe: Probe, content: str, terms_only: bool
) -> Tensor:
    """:func:`position_logits` (H, Tq, Tk) for an encoding that reads the stream (FoX, CoPE,
    stick-breaking: :func:`reads_the_stream`): what lies between a query and a key matters, so
    positions are read as places in one stream of identical tokens 0..max(q_pos), each with the
    content input. The stream runs
    through the hooks as a decoding run does, STREAM_CHUNK tokens a step with the step's
    memory carried (the KV cache's slot), and the rows of the wanted queries are kept. Keys
    must sit at or before every query (the checks' "query at p, key at 0")."""
    if int(k_pos.max()) > int(q_pos.min()):
        raise ValueError("the probe's stream reads keys at or before every query")
    H, D = enc.dims.num_heads, enc.dims.head_dim
    qc, kc = content_vectors(enc, probe, content)
    out = torch.zeros(H, q_pos.numel(), k_pos.numel(), dtype=torch.float64)
    memory: dict = {}
    end = int(q_pos.max()) + 1
    for s0 in range(0, end, STREAM_CHUNK):
        s1 = min(s0 + STREAM_CHUNK, end)
        q = qc[None, :, None].expand(1, H, s1 - s0, D)  # (1, H, t, D): this step's queries
        k = kc[None, :, None].expand(1, H, s1, D)  # (1, H, s1, D): every key so far
        proj = dataclasses.replace(probe_projection(probe, content_input(enc, probe, s1 - s0)), memory=memory)
        q_step, k_step = torch.arange(s0, s1)[None], torch.arange(s1)[None]
        rows = ((q_pos >= s0) & (q_pos < s1)).nonzero()[:, 0]
        if rows.numel() == 0:  # nothing to read: the hooks still see the step (the memory grows)
            _prepared(enc, q_step, k_step).layer_terms(q, k, k, proj)
            continue
        logits = attention_logits(enc, q, k, q_step, k_step, proj, terms_only)[0]  # (H, t, s1)
        out[:, rows] = logits[:, q_pos[rows] - s0][:, :, k_pos]
    return out


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

    Several checks ask; ``check_encoding`` computes it once per encoding and hands it to them in
    ``probe.accepted`` (a stateful encoding, an ODE or a recurrence, pays for every far position
    it is asked about).
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


def spread(x: Tensor) -> float:
    """Largest within-head range of logits (H, ...) — a per-head constant carries no position."""
    if x.dim() == 1:
        return float(x.max() - x.min())
    flat = x.reshape(x.shape[0], -1)
    return float((flat.amax(-1) - flat.amin(-1)).max())


def has_no_signal(x: Tensor) -> bool:
    """The values do not vary (within rounding): no position reaches them."""
    return spread(x) <= 1e-9 * (1.0 + float(x.abs().max()))


def expected_score_curve(enc: PositionalEncoding, probe: Probe, dmax: int) -> Tensor:
    """s(d), d = 0..dmax: head-mean logit of a query at d and a key at 0 for all-ones content.

    For independent q, k with E[q] = E[k] = 1, E[q^T M k] = 1^T M 1, so all-ones content gives
    the expected score exactly (Su et al. 2021, RoFormer §3.4.3 study the same sum).
    """
    s = position_logits(enc, torch.arange(dmax + 1), torch.tensor([0]), probe, content="ones")
    return s[:, :, 0].mean(0)  # (dmax + 1,)


def decay_profile(s: Tensor) -> dict:
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


MAX_FIT = 512  # features per least-squares fit in the linear-map check


def code_parts(enc: PositionalEncoding, positions: Tensor, probe: Probe) -> list[Tensor]:
    """The per-token code (see :func:`position_codes`) in parts of at most :data:`MAX_FIT` features.

    A narrow code is one part. A wide embed code keeps columns [0, 256) and [C/2, C/2 + 256):
    interleaved sin/cos pairs are adjacent and half-layout pairs are C/2 apart, so both layouts
    keep whole pairs. Rotated q and k keep their first heads, up to 256 features each.
    """
    code = position_codes(enc, positions, probe)
    if code.shape[-1] <= MAX_FIT:
        return [code]
    parts, at = [], 0
    if enc.has_embed:
        C = enc.dims.d_model
        emb = code[:, :C]
        if C > MAX_FIT:
            half, w = C // 2, MAX_FIT // 2
            emb = torch.cat([emb[:, :w], emb[:, half : half + w]], dim=-1)
        parts.append(emb)
        at = C
    if enc.has_rotate:
        rot = code[:, at:]  # rotated q then k, each (N, H*D') with D' the rotated head width
        half = rot.shape[1] // 2
        D = half // enc.dims.num_heads
        keep = max(1, (MAX_FIT // 2) // D) * D  # whole heads
        q, k = rot[:, :half], rot[:, half:]
        qk = torch.cat([q[:, :keep], k[:, :keep]], dim=-1)
        parts.extend([qk] if qk.shape[-1] <= MAX_FIT else [q[:, :keep], k[:, :keep]])
    return parts


def values_at(enc: PositionalEncoding, positions: Tensor, probe: Probe) -> Tensor:
    """Largest magnitude of everything position-dependent at each position p: the code, and the
    additive logit terms (bias, logit terms) of a query at p and a key at 0 on their own (the
    content part q·k is the same at every position and would hide a small growing bias). A pair
    its term hides (stick-breaking's query and its own key: ``scan_terms.EXCLUDED``, a log
    weight whose exp is 0) has no value: a term at or below it counts as 0."""
    out = torch.zeros(positions.numel(), dtype=torch.float64)
    if enc.has_bias or enc.has_terms:
        terms = position_logits(enc, positions, torch.tensor([0]), probe, terms_only=True)[:, :, 0]  # (H, N)
        out = terms.masked_fill(terms <= EXCLUDED, 0.0).abs().amax(0)  # (N,)
    codes = position_codes(enc, positions, probe)
    if codes is not None:
        out = torch.maximum(out, codes.abs().amax(-1))
    return out
