"""RoPE's two layouts (how the rotated channels pair up) and converting a checkpoint between them.

Two layouts pair the r rotated channels of a head differently (Su et al. 2021, RoFormer):

* ``"half"`` (GPT-NeoX, Hugging Face Llama ``rotate_half``): pair j is (x_j, x_{j + r/2});
* ``"interleaved"`` (GPT-J, Meta Llama, RoFormer): pair j is (x_{2j}, x_{2j+1}).

Both rotate pair j by angle m * theta_j at position m: (a, b) -> (a cos - b sin, b cos + a sin).
A model trained in one layout runs in the other once its q and k projections are permuted
(:func:`convert_qk_layout`): the attention scores are the same.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import check_choice, check_int

__all__ = ["LAYOUTS", "convert_qk_layout"]

LAYOUTS = ("half", "interleaved")


def _layout_permutation(head_dim: int, rotary_dim: int, to: str) -> Tensor:
    # interleaved channel 2j -> half channel j; 2j+1 -> j + r/2 (pass-through channels stay).
    to_half = torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2), torch.arange(rotary_dim, head_dim)])
    return to_half if to == "half" else torch.argsort(to_half)


def convert_qk_layout(
    weight: Tensor, num_heads: int, head_dim: int, rotary_dim: int | None = None, to: str = "half"
) -> Tensor:
    """Permute a q or k projection between RoPE layouts, so that attention scores are unchanged.

    ``weight``: (num_heads * head_dim, ...) — an ``nn.Linear`` weight (out, in) or bias (out,).
    ``to="half"`` converts a checkpoint trained with interleaved pairs (GPT-J, Meta's Llama
    release) to the half layout (GPT-NeoX, Hugging Face Llama); ``to="interleaved"`` is the
    inverse. Within each head, interleaved channel 2j becomes half channel j and 2j+1 becomes
    j + r/2; channels past ``rotary_dim`` stay. Apply it to both q and k projections.
    """
    check_choice("to", to, LAYOUTS)
    check_int("num_heads", num_heads, minimum=1)
    check_int("head_dim", head_dim, minimum=1)
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    check_int("rotary_dim", rotary_dim, minimum=2)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (it is split into pairs), got {rotary_dim}")
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be <= head_dim ({head_dim}), got {rotary_dim}")
    if weight.dim() < 1 or weight.shape[0] != num_heads * head_dim:
        raise ValueError(
            f"weight must have num_heads * head_dim = {num_heads * head_dim} rows, got shape {tuple(weight.shape)}"
        )
    perm = _layout_permutation(head_dim, rotary_dim, to).to(weight.device)
    w = weight.reshape(num_heads, head_dim, *weight.shape[1:])  # (H, D, ...)
    return w[:, perm].reshape(weight.shape)
