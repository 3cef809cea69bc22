"""Clipped RoPE, CoPE (``clipped``): the lowest frequencies tapered to zero by a raised cosine.

Li et al. 2026, "CoPE: Clipped RoPE as A Scalable Free Lunch for Long Context LLMs",
arXiv:2602.05258; the authors' code, github.com/hrlics/CoPE, ``modeling_cope.py`` (commit
bb728e8c5ad6041ce2db352576e66bbdb689fee4, ``LlamaRotaryEmbedding.__init__``, ``use_cope``)
and ``train/training/modeling_flash_llama_cope.py`` (commit c5449aace2be, ``clip_low_n``).

RoPE's pairs whose period 2 pi / theta_i exceeds the trained length L never complete a turn in
training: past L they reach angles never seen (the out-of-distribution outliers), and within L
they act as a slowly drifting bias. HoPE (``hope``) and the paper's "HardClip" set them to 0;
CoPE clips them softly, because a hard cut in frequency rings in the logits over distance
(spectral leakage). The last n pairs, the lowest frequencies, are multiplied by a half cosine
that falls from 1 to 0 across them:

    theta'_i = theta_i                                  for i < d/2 - n,
    theta'_i = theta_i * (1 + cos(pi j / (n - 1))) / 2  for i = d/2 - n + j, j = 0 .. n - 1,

so the first tapered pair keeps theta (weight 1) and the last one stops rotating (weight 0);
n = 1 keeps its one pair (the authors' ``linspace(0, pi, 1) = [0]``), and n is capped at d/2.
The authors fix n by hand (``clip_low_n = 20`` of Llama-3-8B's 64 pairs, continued
pre-training at 64k): ``clipped_pairs``. Given the trained length instead
(``original_max_position_embeddings``), n is the number of pairs whose period exceeds L, the
pairs the paper's argument is about (18 for Llama 3's base 500000 and d = 128 at L = 65536).

It is a choice of frequencies a model is trained (or continued-pretrained) with, not a
training-free extension of a model trained with plain RoPE: it changes the logits within the
trained length. So the entry has no ``extension`` rule; figures draw it as trained at L.
transformers has no rope_type for it (the authors' code patches Llama's rotary module behind a
``use_cope`` flag with n fixed in the code), so it has no HF spelling: ``to_hf`` refuses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import check_int
from .schema import Scaling, ScalingConfig

__all__ = ["CLIPPED", "ClippedScaling", "clipped_count", "clipped_inv_freq"]


@dataclass
class ClippedScaling(ScalingConfig):
    """Config of the ``clipped`` rope type: give exactly one of

    Attributes:
        clipped_pairs: n, the number of lowest-frequency pairs the taper spans (int >= 0;
            the authors' ``clip_low_n``, 20 in their code; 0 is plain RoPE).
        original_max_position_embeddings: L, the trained length (int >= 1): n is then the
            number of pairs whose period 2 pi / theta_i exceeds L.
    """

    clipped_pairs: int | None = None
    original_max_position_embeddings: int | None = None

    def validate(self) -> None:
        if (self.clipped_pairs is None) == (self.original_max_position_embeddings is None):
            raise ValueError(
                "rope type 'clipped' takes exactly one of clipped_pairs (the number of lowest-frequency pairs "
                "tapered, >= 0) and original_max_position_embeddings (the trained length L: the pairs whose "
                f"period exceeds it are tapered); got clipped_pairs={self.clipped_pairs!r}, "
                f"original_max_position_embeddings={self.original_max_position_embeddings!r}"
            )
        if self.clipped_pairs is not None:
            check_int("clipped_pairs", self.clipped_pairs, minimum=0)
        else:
            check_int("original_max_position_embeddings", self.original_max_position_embeddings, minimum=1)


def clipped_count(inv_freq: Tensor, cfg: ClippedScaling) -> Tensor:
    """n, the number of tapered pairs (at most d/2), a 0-dim int64 tensor: ``clipped_pairs``, or
    the pairs whose period 2 pi / theta_i exceeds the trained length (a tensor, so that
    torch.compile traces it without a host sync)."""
    if cfg.clipped_pairs is not None:
        return torch.tensor(min(cfg.clipped_pairs, inv_freq.numel()), device=inv_freq.device)
    return (2 * math.pi / inv_freq > cfg.original_max_position_embeddings).sum()


def clipped_inv_freq(inv_freq: Tensor, cfg: ClippedScaling, *, base: float,
                     seq_len: int | None = None) -> tuple[Tensor, float]:
    """theta_i times the taper over the last n pairs (module docstring); attention factor 1."""
    if base < 1.0:
        # The taper runs over the last pairs, the lowest frequencies only when theta_i decreases.
        raise ValueError(f"base must be > 1 for rope type 'clipped' (its taper spans the last, lowest-frequency "
                         f"pairs), got {base}")
    n = clipped_count(inv_freq, cfg).to(inv_freq.dtype)
    i = torch.arange(inv_freq.numel(), dtype=inv_freq.dtype, device=inv_freq.device)
    j = i - (inv_freq.numel() - n)  # the index within the taper; < 0 before it
    phase = math.pi * j / (n - 1).clamp(min=1.0)  # torch.linspace(0, pi, n); n = 1 gives [0]
    weight = torch.where(j >= 0, 0.5 * (1.0 + torch.cos(phase)), 1.0)
    return inv_freq * weight, 1.0


CLIPPED = Scaling(
    "clipped", ClippedScaling, clipped_inv_freq,
    "theta_i of the last n pairs times (1 + cos(pi j / (n - 1))) / 2: 1 down to 0 (n given, or the pairs "
    "whose period exceeds L)",
    "Li et al. 2026, CoPE: Clipped RoPE as A Scalable Free Lunch for Long Context LLMs", label="Clipped RoPE",
    # Trained with, not a training-free extension: figures draw it as trained at L (no `extension`).
    illustration=lambda factor, original, rotary_dim: {"original_max_position_embeddings": original},
)
