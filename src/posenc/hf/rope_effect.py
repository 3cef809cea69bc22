"""What each engine's reading of a checkpoint's RoPE does to that model's own attention logits
(``posenc rope FILE --model``): the probe's real pre-rotation q and k, rotated with each engine's
frequencies and scaled by its logit scale, against transformers' reading, at distances up to the
served length.

For a query q and key k of one head, RoPE's logit at distance Δ (half layout, pairs (j, j + r/2),
attention factor a, softmax scale s, the D - r channels past the rotated ones passing through) is

    s * (a^2 * sum_j (A_j cos(Δ θ_j) + B_j sin(Δ θ_j)) + C),
    A_j = q_j k_j + q_{j+r/2} k_{j+r/2},  B_j = q_j k_{j+r/2} - q_{j+r/2} k_j,  C = the rest's q·k,

so every (q, k) pair of the text is evaluated at every distance of a grid without rotating
anything. The pairs: ``pairs`` (query token, key token) of the captured text, drawn once
(seeded), every query head against its key head (grouped queries: head h reads key head
h // (H / Hkv)). Each engine is read in transformers' layout on transformers' weights (what an
engine does with its own weight layout, the converter's permutation for llama.cpp, is the same
rotation); its frequencies and factor are those at the served length (dynamic and switching
rules included). Layers of another layer type (Gemma 3) take that type's reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from ..engines import EngineRope, Unsupported

__all__ = ["LogitEffect", "capture_model_qk", "distance_grid", "logit_effects", "pair_logits"]


@dataclass(frozen=True)
class LogitEffect:
    """One engine's logits against transformers' on the model's q/k: the largest and the mean
    absolute difference (logit units, before the softmax), and the reference's mean absolute
    logit for scale, over ``pairs`` x heads x layers x distances."""

    engine: str
    max_abs: float
    mean_abs: float
    reference_mean_abs: float
    worst_distance: int

    def to_json(self) -> dict[str, Any]:
        """The fields, by name (``posenc rope --model --json``'s ``model_effect`` entries)."""
        return dict(engine=self.engine, max_abs=self.max_abs, mean_abs=self.mean_abs,
                    reference_mean_abs=self.reference_mean_abs, worst_distance=self.worst_distance)


def distance_grid(length: int, points: int = 48) -> Tensor:
    """Distances 0 .. length - 1: 0, 1, then about log-spaced up to length - 1 (int64, sorted, unique)."""
    from ..config import check_int

    check_int("length", length, minimum=2)
    check_int("points", points, minimum=1)
    top = max(1, length - 1)
    grid = torch.logspace(0, math.log10(top), points, dtype=torch.float64).round().long()
    return torch.unique(torch.cat([torch.tensor([0, 1, top]), grid]).clamp(0, top))


def pair_logits(q: Tensor, k: Tensor, rope: EngineRope, length: int, distances: Tensor, scale: float) -> Tensor:
    """Logits (pairs, distances) float64 of query rows ``q`` (pairs, D) and key rows ``k``
    (pairs, D) under ``rope`` at a ``length``-token sequence, ``scale`` the head's 1/sqrt(D)."""
    inv, factor = rope.frequencies(length)
    half = inv.numel()
    qd, kd = q.double(), k.double()
    q1, q2, k1, k2 = qd[:, :half], qd[:, half:2 * half], kd[:, :half], kd[:, half:2 * half]
    A, B = q1 * k1 + q2 * k2, q1 * k2 - q2 * k1  # (pairs, r/2)
    C = (qd[:, 2 * half:] * kd[:, 2 * half:]).sum(-1, keepdim=True)  # (pairs, 1)
    ang = distances.double()[:, None] * inv[None, :]  # (distances, r/2)
    rot = A @ ang.cos().T + B @ ang.sin().T  # (pairs, distances)
    return scale * rope.softmax_scale * (factor * factor * rot + C)


def _for_layer(ropes: list[EngineRope], layer: int) -> EngineRope | None:
    for r in ropes:
        if r.layers is None or layer in r.layers:
            return r
    return None


def logit_effects(qk: dict[int, tuple[Tensor, Tensor]], scales: dict[int, float],
                  readings: dict[str, list[EngineRope] | Unsupported], length: int, *, pairs: int = 2048,
                  seed: int = 0) -> list[LogitEffect]:
    """Each engine's :class:`LogitEffect` (transformers' reading the reference; engines that
    refuse the file left out) on captured ``qk`` = {layer: (q (H, T, D), k (Hkv, T, D))} with
    the layers' logit ``scales``, at distances of :func:`distance_grid` (length)."""
    from ..config import check_int

    check_int("pairs", pairs, minimum=1)
    if not qk:
        raise ValueError("qk must hold at least one layer's captured q and k, got none")
    if "transformers" not in readings:
        raise ValueError(f"readings must include transformers' (the reference); got {', '.join(readings) or 'none'}")
    ref = readings["transformers"]
    if isinstance(ref, Unsupported):
        raise ValueError(f"transformers cannot read this file: {ref}")
    distances = distance_grid(length)
    gen = torch.Generator().manual_seed(seed)
    draws = {}
    for layer, (q, _) in qk.items():
        T = q.shape[1]
        draws[layer] = (torch.randint(0, T, (pairs,), generator=gen), torch.randint(0, T, (pairs,), generator=gen))
    out = []
    for engine, ropes in readings.items():
        if engine == "transformers" or isinstance(ropes, Unsupported):
            continue
        worst, total, ref_total, count, worst_d = 0.0, 0.0, 0.0, 0, 0
        for layer, (q, k) in qk.items():
            mine, theirs = _for_layer(ropes, layer), _for_layer(ref, layer)
            if mine is None or theirs is None:  # a NoPE layer for both, or a layer this engine does not rotate
                continue
            H, Hkv = q.shape[0], k.shape[0]
            qi, ki = draws[layer]
            for h in range(H):
                qa, ka = q[h, qi], k[h // (H // Hkv), ki]
                want = pair_logits(qa, ka, theirs, length, distances, scales[layer])
                got = pair_logits(qa, ka, mine, length, distances, scales[layer])
                diff = (got - want).abs()
                m = float(diff.max())
                if m > worst:
                    worst, worst_d = m, int(distances[int(diff.max(0).values.argmax())])
                total += float(diff.sum())
                ref_total += float(want.abs().sum())
                count += diff.numel()
        if count:
            out.append(LogitEffect(engine, worst, total / count, ref_total / count, worst_d))
    return out


def capture_model_qk(path: str, layers: Sequence[int] | None, tokens: int) -> tuple[dict[int, tuple[Tensor, Tensor]],
                                                                                      dict[int, float]]:
    """Load the checkpoint at ``path`` (a folder or a .gguf, float32 on the CPU) and capture the
    pre-rotation q/k of ``layers`` (None: the first, middle and last) on ``tokens`` tokens of the
    standard library's sources; returns (q/k by layer, logit scale by layer)."""
    from .checkpoint import load_model, load_tokenizer, open_checkpoint
    from .models import resolve_model
    from .probe.capture import capture_qk, layer_taps, probe_text_ids

    ckpt = open_checkpoint(str(resolve_model(path)))
    model = load_model(ckpt, torch.float32, progress=False)
    taps = layer_taps(model)
    n = len(taps)
    chosen = sorted(set(layers if layers is not None else (0, n // 2, n - 1)))
    ids = probe_text_ids(load_tokenizer(ckpt), None, tokens)
    with torch.no_grad():
        qk = capture_qk(model, torch.tensor([ids]), chosen)
    return qk, {layer: taps[layer].scale for layer in chosen}
