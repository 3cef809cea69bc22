"""A recurrent layer in place of a positional encoding (Neishi & Yoshinaga 2019).

Neishi & Yoshinaga, "On the Relation between Position Information and Sentence Length in
Neural Machine Translation" (CoNLL 2019), replace the Transformer's positional encoding
layer by an RNN over the token embeddings ("RNN-Transformer"): order enters through the
recurrence, with no position ids at all, and long inputs do not meet unseen positions.

Here a small GRU reads the embeddings x (B, T, C) and its hidden states h (B, T, Hd) are
projected back and added: ``x + W h``. The recurrence respects the stream's structure:

* it restarts from h = 0 where a document starts (position 0 or a new segment id), so a
  packed row equals its documents run alone;
* a padding token (``seq.valid`` False) leaves h unchanged, so padding changes nothing;
* with a KV cache, the running h (and the last segment id) live in the ``state`` dict, so
  decoding token by token equals one full forward.

The GRU cell is PyTorch's (r, z, n gates, ``torch.nn.GRU`` parameters). On CPU, where the
fused kernel library is built (``make install``), every batch runs its steps there, forward and
backward (:func:`kernel_scan`: 6 and 5 ms for (2, 1024) tokens at hidden 64, against about
0.1 s of a training step as PyTorch ops). Elsewhere plain batches (no restart after the first
token, no padding) run through ``nn.GRU`` itself (cuDNN on a GPU), and the others an explicit
loop over time (:func:`gru_scan`) with the input gates precomputed in one matmul. The kernel
and the loop work in at least float32 whatever the model dtype: a recurrence accumulates
rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config import EncodingConfig
from ..encoding import Dims, PositionalEncoding
from ..literature import EMBEDDINGS_ONLY, LEARNED, UNTRAINED
from ..positions import SequenceInfo
from ..registry import register
from ..limits import check_width
from ..rotary import cpu_rope
from .stream import document_starts

__all__ = ["RecurrentConfig", "RecurrentEncoding", "gru_scan", "kernel_scan"]


@dataclass
class RecurrentConfig(EncodingConfig):
    """``hidden``: the GRU's state width, in [1, 2^16]."""

    hidden: int = 64  # GRU state width Hd

    def validate(self) -> None:
        check_width("hidden", self.hidden)


def gru_scan(gru: nn.GRU, x: Tensor, h0: Tensor, reset: Tensor, valid: Tensor) -> Tensor:
    """Run ``gru``'s single layer over x (B, T, C) from h0 (B, Hd) -> states (B, T, Hd).

    ``reset`` (B, T): h is zeroed before reading that token; ``valid`` (B, T): False tokens
    keep the previous state. Works in float32 or wider; returns that dtype.
    """
    gi, w_hh, b_hh = _input_gates(gru, x)
    return _steps(gi, h0.to(gi.dtype), w_hh, b_hh, reset, valid)


def _input_gates(gru: nn.GRU, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(gi (B, T, 3 Hd), W_hh, b_hh) in float32 or wider: every step's input gates in one matmul
    (rounded back to that dtype where autocast ran the matmul in bfloat16), and the recurrent
    weights in the same dtype."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    gi = torch.nn.functional.linear(x.to(dtype), gru.weight_ih_l0.to(dtype), gru.bias_ih_l0.to(dtype)).to(dtype)
    return gi, gru.weight_hh_l0.to(dtype), gru.bias_hh_l0.to(dtype)


def _steps(gi: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor, reset: Tensor, valid: Tensor) -> Tensor:
    """The GRU's steps from their input gates gi (B, T, 3 Hd) and h0 (B, Hd): states (B, T, Hd)."""
    gi_r, gi_z, gi_n = gi.chunk(3, dim=-1)  # (B, T, Hd) each
    out = []
    for t in range(gi.shape[1]):
        h = h.masked_fill(reset[:, t, None], 0.0)
        gh_r, gh_z, gh_n = torch.nn.functional.linear(h, w_hh, b_hh).chunk(3, dim=-1)  # (B, Hd) each
        r = torch.sigmoid(gi_r[:, t] + gh_r)
        z = torch.sigmoid(gi_z[:, t] + gh_z)
        n = torch.tanh(gi_n[:, t] + r * gh_n)
        h = torch.where(valid[:, t, None], (1 - z) * n + z * h, h)
        out.append(h)
    return torch.stack(out, dim=1)  # (B, T, Hd)


def kernel_scan(ext, gru: nn.GRU, x: Tensor, h0: Tensor, reset: Tensor, valid: Tensor) -> Tensor:
    """:func:`gru_scan` with the recurrence in the fused CPU kernel (``ext``, the module of
    :func:`posenc.rotary.cpu_rope.kernel`; ``csrc/gru_cpu.cpp``): the input gates one matmul
    here, the steps and their backward (the adjoint of the same steps) there. Equal to
    :func:`gru_scan` within roundings (float64: 1e-15); float32 or wider, as it."""
    gi, w_hh, b_hh = _input_gates(gru, x)
    return _KernelGru.apply(ext, gi, h0.to(gi.dtype), w_hh, b_hh, reset.bool(), valid.bool())


class _KernelGru(torch.autograd.Function):
    """The GRU's steps from their input gates (B, T, 3 Hd) -> states (B, T, Hd), forward and
    backward in the kernel; keeps each step's input state and its r, z, n and W_hn h (5 Hd
    numbers a step). A backward that must itself be differentiable (``create_graph``) replays
    the steps as PyTorch ops (:func:`_steps`) and takes their gradient, so second derivatives
    are those of :func:`gru_scan`."""

    @staticmethod
    def forward(ctx, ext, gi: Tensor, h0: Tensor, w_hh: Tensor, b_hh: Tensor, reset: Tensor, valid: Tensor) -> Tensor:
        states, h_in, gates = ext.gru_recurrence(gi, h0, w_hh, b_hh, reset, valid)
        ctx.save_for_backward(gi, h0, w_hh, b_hh, reset, valid, h_in, gates)
        ctx.ext = ext
        return states

    @staticmethod
    def backward(ctx, grad: Tensor):
        gi, h0, w_hh, b_hh, reset, valid, h_in, gates = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the steps again, as differentiable ops
            inputs = (gi, h0, w_hh, b_hh)
            with torch.enable_grad():
                states = _steps(*inputs, reset, valid)
            return None, *cpu_rope.replayed_grads(states, inputs, grad), None, None
        dgi, dh0, dw_hh, db_hh = ctx.ext.gru_recurrence_backward(grad, h_in, gates, w_hh, reset, valid)
        return None, dgi, dh0, dw_hh, db_hh, None, None


@register(
    "recurrent",
    family="absolute",
    summary="a GRU over the embeddings before the first layer, x + W h (RNN-Transformer)",
    paper="Neishi & Yoshinaga 2019, On the Relation between Position Information and Sentence Length in NMT",
    claims={
        "absolute": (UNTRAINED, LEARNED),
        "relative": (UNTRAINED, LEARNED),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, "a recurrence runs at any length"),
        "linear_attention": (True, EMBEDDINGS_ONLY),
    },
)
class RecurrentEncoding(PositionalEncoding):
    """x + proj(GRU(x)): order from a recurrence that restarts at each document."""

    Config = RecurrentConfig

    def __init__(self, config: RecurrentConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        self.gru = nn.GRU(dims.d_model, config.hidden, batch_first=True)
        self.proj = nn.Linear(config.hidden, dims.d_model, bias=False)

    def embed(self, x: Tensor, seq: SequenceInfo, state: dict[str, Any] | None = None) -> Tensor:
        B, T, _ = x.shape
        if T == 0:
            return x
        last_seg = None if state is None else state.get("segment")
        reset = document_starts(seq, last_seg)  # (B, T)
        valid = torch.ones_like(reset) if seq.valid is None else seq.valid
        h0 = None if state is None else state.get("h")
        if h0 is None:
            h0 = x.new_zeros(B, self.config.hidden, dtype=torch.promote_types(x.dtype, torch.float32))
        ext = cpu_rope.kernel_on(x)
        plain = ext is None and seq.valid is None and not bool(reset[:, 1:].any())
        if ext is not None:
            h = kernel_scan(ext, self.gru, x, h0, reset, valid)
        elif plain and x.dtype == self.gru.weight_ih_l0.dtype and x.dtype in (torch.float32, torch.float64):
            h0 = h0.masked_fill(reset[:, :1], 0.0).to(x.dtype)
            h, _ = self.gru(x, h0[None].contiguous())  # (B, T, Hd)
        else:
            h = gru_scan(self.gru, x, h0, reset, valid)  # (B, T, Hd)
        if state is not None:
            # Padding keeps h, so the last column is each row's running state.
            state["h"] = h[:, -1]
            if seq.segment_ids is not None:
                state["segment"] = seq.segment_ids[:, -1]
        return x + self.proj(h.to(x.dtype))  # (B, T, C)
