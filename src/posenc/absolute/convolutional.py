"""A depthwise convolution over the sequence as a positional encoding.

Zero padding is how convolutions leak absolute position: a token near the start sees zeros
where its neighbours would be, so its output differs from the same token further in
(Islam, Jia & Bruce 2020, "How Much Position Information Do Convolutional Neural Networks
Encode?", ICLR). Chu et al. 2021 ("Conditional Positional Encodings for Vision
Transformers", CPVT) turn this into a positional encoding: x + DWConv(x).

    y_t = x_t + b + sum_j w[:, j] * x_{t - left + j},   j = 0 .. K-1,

a depthwise (per-channel) kernel w (C, K), with x_s = 0 where s is outside the token's
document (before its start or after its end in a packed row), at a padding token, or
before the stream. ``causal=True`` (default) takes left = K - 1: the output never reads
ahead, so the encoding works in a decoder and with a KV cache (the last K - 1 inputs and
their document ids live in ``state``). ``causal=False`` centres the kernel (odd K,
left = right = (K - 1) / 2) for encoders; it reads future tokens, so it cannot decode
incrementally and refuses a KV cache.

The sum over j is K shifted, masked multiply-adds (not ``F.conv1d``): the zero padding
moves with each document's start, which a single convolution cannot express.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_int
from ..encoding import Dims, PositionalEncoding
from ..literature import EMBEDDINGS_ONLY
from ..positions import SequenceInfo
from ..registry import register
from .stream import document_starts, valid_mask

__all__ = ["ConvolutionalConfig", "ConvolutionalEncoding"]

MAX_KERNEL_SIZE = 1024


@dataclass
class ConvolutionalConfig(EncodingConfig):
    """``kernel_size`` in [1, 1024]: the taps are a Python loop (CPVT's PEG uses 3), and the
    KV cache keeps kernel_size - 1 past inputs per row."""

    kernel_size: int = 3
    causal: bool = True  # left zero padding (decoders, KV cache); False: centred (odd kernel_size)
    bias: bool = True

    def validate(self) -> None:
        check_int("kernel_size", self.kernel_size, minimum=1, maximum=MAX_KERNEL_SIZE)
        if not self.causal and self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd when causal=False (a centred kernel), got {self.kernel_size}")


@register(
    "convolutional",
    family="absolute",
    summary="x + depthwise 1-D conv with zero padding at document starts (CPVT's PEG)",
    paper="Chu et al. 2021, Conditional Positional Encodings for Vision Transformers; Islam et al. 2020",
    claims={
        "absolute": (False, "Islam et al. 2020: zero padding leaks position only near the boundary"),
        "extrapolation": (True, "a convolution runs at any length"),
        "linear_attention": (True, EMBEDDINGS_ONLY),
    },
)
class ConvolutionalEncoding(PositionalEncoding):
    """x + DWConv(x), zero padded per document (see the module docstring)."""

    Config = ConvolutionalConfig

    def __init__(self, config: ConvolutionalConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        k = config.kernel_size
        # nn.Conv1d's default init for a depthwise kernel: fan_in = K.
        bound = 1.0 / math.sqrt(k)
        self.weight = nn.Parameter(torch.empty(dims.d_model, k).uniform_(-bound, bound))  # (C, K)
        self.bias = nn.Parameter(torch.zeros(dims.d_model)) if config.bias else None
        self.left = k - 1 if config.causal else (k - 1) // 2
        self.right = k - 1 - self.left

    def embed(self, x: Tensor, seq: SequenceInfo, state: dict[str, Any] | None = None) -> Tensor:
        if state is not None and not self.config.causal:
            raise ValueError(
                "a centred convolution (causal=False) reads future tokens and cannot decode with a "
                "KV cache; use causal=True"
            )
        B, T, C = x.shape
        L, R = self.left, self.right
        state = {} if state is None else state
        starts = document_starts(seq, state.get("segment"))  # (B, T)
        doc = state.get("doc", torch.zeros(B, dtype=torch.long, device=x.device))[:, None] + starts.long().cumsum(1)
        # History (causal KV cache): the last L inputs, their validity and document ids.
        hx = state.get("x", x.new_zeros(B, L, C))
        hv = state.get("valid", torch.zeros(B, L, dtype=torch.bool, device=x.device))
        hd = state.get("docs", torch.full((B, L), -1, dtype=torch.long, device=x.device))
        pad_x, pad_v = x.new_zeros(B, R, C), torch.zeros(B, R, dtype=torch.bool, device=x.device)
        xe = torch.cat([hx.to(x.dtype), x, pad_x], dim=1)  # (B, L + T + R, C)
        ve = torch.cat([hv, valid_mask(seq), pad_v], dim=1)  # (B, L + T + R)
        de = torch.cat([hd, doc, torch.full_like(pad_v, -1, dtype=torch.long)], dim=1)

        w = self.weight.to(x.dtype)
        out = x if self.bias is None else x + self.bias.to(x.dtype)
        for j in range(self.config.kernel_size):  # tap j reads token t - L + j
            src = xe[:, j : j + T]  # (B, T, C)
            keep = ve[:, j : j + T] & (de[:, j : j + T] == doc)  # (B, T): same document, not padding
            out = out + w[:, j] * src * keep[..., None].to(x.dtype)
        if self.config.causal and L > 0:
            state["x"], state["valid"], state["docs"] = xe[:, -L:], ve[:, -L:], de[:, -L:]
        if T > 0:
            state["doc"] = doc[:, -1]
            if seq.segment_ids is not None:
                state["segment"] = seq.segment_ids[:, -1]
        return out  # (B, T, C)
