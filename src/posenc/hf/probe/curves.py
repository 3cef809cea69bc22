"""Probe step 2, curves: the score of the captured q and k against relative distance.

Notation: q_t (H, D), k_t (Hkv, D) at tokens t = 1..T-1 (token 0, often BOS, an attention
sink with outsized keys, is left out); R(d) rotates each pair j by d * theta_j (and scales
by the scaling's attention factor). The curve of head h is

    s_h(d) = scale * mean_{i, j} q_i,h . R(d) k_j,g(h)  =  scale * qbar_h . R(d) kbar_g(h)

(the mean over every pair of real tokens, equal to the means' score because the score is
bilinear; g(h) is the key head of query head h under GQA; scale is the attention's own,
1/sqrt(D) for Llama). The same split into the high-frequency half of the rotated pairs (the
r/4 largest theta_j) and the low-frequency half: ``full = high + low + unrotated`` (channels
past ``rotary_dim`` do not depend on d). :func:`variant_ropes`: the same RoPE with its base
raised and with each training-free scaling of the registry set for the probed length.
"""

from __future__ import annotations

import sys
from typing import Sequence

import torch
from torch import Tensor

from ...rotary import RotaryEmbedding
from ...rotary.scaling import get_scaling, list_scalings

__all__ = ["distances", "frequency_halves", "probe_scalings", "score_curves", "variant_ropes"]


def _pair_channels(rope: RotaryEmbedding, pairs: Tensor) -> Tensor:
    """Channel indices of rotated ``pairs`` in the rope's layout."""
    half = rope.rotary_dim // 2
    if rope.config.layout == "half":
        return torch.cat([pairs, pairs + half])
    return torch.cat([2 * pairs, 2 * pairs + 1])


def frequency_halves(rope: RotaryEmbedding) -> tuple[Tensor, Tensor]:
    """(high, low): pair indices of the r/4 largest theta_j and of the rest."""
    order = torch.argsort(rope.inv_freq, descending=True)
    n_high = (rope.rotary_dim // 2) // 2
    return order[:n_high].sort().values, order[n_high:].sort().values


@torch.no_grad()
def score_curves(
    q: Tensor, k: Tensor, rope: RotaryEmbedding, distances: Tensor, scale: float,
    halves: tuple[Tensor, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Score against distance per head: ``{"full", "high", "low", "unrotated"}``, each (H, N) float32.

    q (H, T, D), k (Hkv, T, D) pre-rotation; ``distances`` (N,) ints >= 0. qbar (mean over
    tokens 1..T-1) is rotated at position d and kbar at position 0 by ``rope``: the logit of
    a query d tokens after its key. ``halves``: the (high, low) pair indices (default: this
    rope's own, :func:`frequency_halves`).
    """
    H, Hkv, D = q.shape[0], k.shape[0], q.shape[-1]
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of key heads ({Hkv})")
    skip = 1 if q.shape[1] > 1 else 0
    qbar = q[:, skip:].mean(1).float()  # (H, D)
    kbar = k[:, skip:].mean(1).float()  # (Hkv, D)
    N = distances.numel()
    qpos = distances.reshape(1, N).long()
    kpos = torch.zeros(1, 1, dtype=torch.long)
    # For length-dependent scalings (dynamic NTK) the current length is max(d) + 1: the
    # frequencies a context of the curve's full length would use.
    q_rot, k_rot = rope.rotate(qbar[None, :, None, :].expand(1, H, N, D).contiguous(),
                               kbar[None, :, None, :].contiguous(), qpos, kpos)
    k_rot = k_rot[0, :, 0].repeat_interleave(H // Hkv, dim=0)  # (H, D): key head of each query head
    prod = q_rot[0] * k_rot[:, None, :] * scale  # (H, N, D)
    high, low = frequency_halves(rope) if halves is None else halves
    r = rope.rotary_dim
    out = {
        "full": prod.sum(-1),
        "high": prod[..., _pair_channels(rope, high)].sum(-1),
        "low": prod[..., _pair_channels(rope, low)].sum(-1),
        "unrotated": prod[..., r:].sum(-1),
    }
    return out


def probe_scalings() -> tuple[str, ...]:
    """The scalings the probe can draw: every registered one with a training-free rule for
    factor x L (:meth:`posenc.rotary.Scaling.at_factor`; LongRoPE has none: its per-pair
    factors are searched per model)."""
    return tuple(list_scalings(extends=True))


def variant_ropes(rope: RotaryEmbedding, L: int, extend: float, base_factor: float,
                  scalings: Sequence[str]) -> dict[str, RotaryEmbedding]:
    """The checkpoint's own RoPE ("model"), its base times ``base_factor`` (its own scaling
    kept) and each scaling set for ``extend * L`` by its registry entry's rule. A scaling
    this RoPE cannot take (NTK with rotary_dim 2) is skipped with a note on stderr."""
    out = {"model": rope}
    out[f"base x{base_factor:g}"] = RotaryEmbedding(rope.config.replace(base=rope.config.base * base_factor),
                                                    rope.dims)
    for s in scalings:
        v = RotaryEmbedding(rope.config, rope.dims)
        try:
            v.set_scaling(s, **get_scaling(s).at_factor(extend, L))
        except (TypeError, ValueError) as e:
            print(f"posenc probe: skipping scaling {s!r}: {e}", file=sys.stderr)
            continue
        out[s] = v
    return out


def distances(max_d: int, points: int) -> Tensor:
    """At most ``points`` distances from 0 to ``max_d``, evenly spaced (every one when fewer)."""
    if max_d + 1 <= points:
        return torch.arange(max_d + 1)
    return torch.linspace(0, max_d, points).round().long().unique()
