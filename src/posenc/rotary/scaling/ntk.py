"""NTK-aware scaling, static (``ntk``) and dynamic (``dynamic``): a larger base, so the
highest frequency is kept and the lowest divided by s, geometrically in between."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .schema import HFSpec, Scaling, ScalingConfig, check_factor, check_original, factor_rule

__all__ = ["DYNAMIC", "DynamicNTKScaling", "NTK", "NTKScaling"]


@dataclass
class NTKScaling(ScalingConfig):
    """NTK-aware scaling (bloc97, 2023): base' = base * s^(d/(d-2)).

    The highest frequency (i = 0) is unchanged and the lowest (i = d/2 - 1) is divided by s
    exactly, interpolating geometrically between them.
    """

    factor: float | None = None

    def validate(self) -> None:
        check_factor(self.factor)


@dataclass
class DynamicNTKScaling(ScalingConfig):
    """Dynamic NTK (emozilla, 2023): NTK with s' = s * n / L - (s - 1) for n > L, else none.

    n is the current sequence length (``seq_len``); at n <= L the frequencies are the
    trained ones bit for bit. A pure function of n: no state carried between calls.
    """

    factor: float | None = None
    original_max_position_embeddings: int | None = None
    length_dependent: ClassVar[bool] = True

    def validate(self) -> None:
        check_factor(self.factor)
        check_original(self.original_max_position_embeddings)


def _ntk_inv_freq(inv_freq: Tensor, alpha: float | Tensor) -> Tensor:
    # base' = base * alpha^(d/(d-2))  =>  theta'_i = theta_i * alpha^(-2i/(d-2)).
    d = 2 * inv_freq.numel()
    if d == 2:
        raise ValueError("NTK scaling needs rotary_dim >= 4 (its exponent is d/(d-2)), got 2")
    i = torch.arange(inv_freq.numel(), dtype=torch.float64, device=inv_freq.device)
    alpha = alpha if isinstance(alpha, Tensor) else float(alpha)  # a 0-dim tensor when traced
    return inv_freq * alpha ** (-2.0 * i / (d - 2))


def _ntk(inv_freq: Tensor, cfg: NTKScaling, *, base: float, seq_len: int | None = None):
    return _ntk_inv_freq(inv_freq, cfg.factor), 1.0


def _dynamic(inv_freq: Tensor, cfg: DynamicNTKScaling, *, base: float, seq_len: int | Tensor | None = None):
    L, s = cfg.original_max_position_embeddings, cfg.factor
    if isinstance(seq_len, Tensor):  # traced: the same formula with n as a tensor, no branch
        n = seq_len.to(device=inv_freq.device, dtype=torch.float64)
        alpha = torch.where(n > L, s * n / L - (s - 1.0), 1.0)  # exactly 1 (trained frequencies) at n <= L
        return _ntk_inv_freq(inv_freq, alpha), 1.0
    n = L if seq_len is None else max(int(seq_len), L)
    if n == L:  # exactly the trained frequencies, no rounding through alpha = 1
        return inv_freq.clone(), 1.0
    alpha = s * n / L - (s - 1.0)
    return _ntk_inv_freq(inv_freq, alpha), 1.0


def _ntk_base(cfg: NTKScaling, base: float, rotary_dim: int) -> float:
    return base * cfg.factor ** (rotary_dim / (rotary_dim - 2))  # bloc97's base' (see NTKScaling)


def _dynamic_at(s: float, L: int) -> dict:
    # dynamic NTK rescales by the current length n itself (s' = s n / L - (s - 1)), so s = 1
    # gives exactly n / L at every length (with s it would be s^2 - s + 1 at n = s L).
    return {"factor": 1.0, "original_max_position_embeddings": L}


NTK = Scaling("ntk", NTKScaling, _ntk, "base' = base * s^(d/(d-2)): theta_0 kept, theta_(d/2-1) / s",
              "bloc97 2023, NTK-aware scaled RoPE", label="NTK-aware", hf_default_base=_ntk_base, extension=factor_rule)
# transformers' L for dynamic is max_position_embeddings.
DYNAMIC = Scaling("dynamic", DynamicNTKScaling, _dynamic, "ntk with s' = s n / L - (s - 1) for n > L (n: current length)",
                  "emozilla 2023, dynamic NTK", label="dynamic NTK",
                  hf=HFSpec("dynamic", top_level={"original_max_position_embeddings": "max_position_embeddings"},
                            required=("factor",)),
                  extension=_dynamic_at)
