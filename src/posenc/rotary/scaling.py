"""RoPE frequency scalings: a registry of pure functions with one signature.

Notation: d = rotary_dim (even), i = 0 .. d/2 - 1 indexes the rotated pairs,
theta_i = base^(-2i/d) the base inverse frequencies (radians per position), L the trained
context length (``original_max_position_embeddings``), s = ``factor``.

Every entry of :data:`ROPE_SCALINGS` is ``fn(inv_freq_base, cfg, *, base, seq_len=None)``
returning ``(inv_freq, attention_factor)``:

* ``inv_freq_base``: the float64 theta_i (length d/2);
* ``cfg``: the type's own typed config dataclass below (it validates itself on construction);
* ``base``: the rotary base, needed by types defined in terms of it (NTK, YaRN);
* ``seq_len``: the current sequence length, used only by the length-dependent types
  (``dynamic``, ``longrope``); every function is pure: same inputs, same output, no state.
  It is an int, or a 0-dim integer tensor under ``torch.compile`` (where reading the
  length would be a host sync and a graph break): those types then use tensor ops only.

``attention_factor`` multiplies cos and sin (so rotated q and rotated k each carry it once,
and logits carry its square), as YaRN prescribes and as transformers does.

The semantics match ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (tested
against it); the differences are typed configs that fail loudly instead of warnings, float64
frequencies, a static ``ntk`` type, and a ``dynamic`` type with no hidden state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from ..config import EncodingConfig, check_choice, check_even, check_int, check_positive, check_range

__all__ = [
    "ROPE_SCALINGS",
    "SCALING_CONFIGS",
    "DefaultScaling",
    "LinearScaling",
    "NTKScaling",
    "DynamicNTKScaling",
    "YarnScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "base_inv_freq",
    "make_scaling_config",
    "rope_frequencies",
]


def base_inv_freq(rotary_dim: int, base: float) -> Tensor:
    """theta_i = base^(-2i/d) for i < d/2, float64 (Su et al. 2021, RoFormer, eq. 15)."""
    check_even("rotary_dim", rotary_dim)
    check_positive("base", base)
    if base == 1.0:
        raise ValueError("base must be != 1 (every pair would rotate at the same rate), got 1.0")
    i = torch.arange(0, rotary_dim, 2, dtype=torch.float64)
    return float(base) ** (-i / rotary_dim)  # (d/2,)


# ---- typed configs -----------------------------------------------------------------------
@dataclass
class ScalingConfig(EncodingConfig):
    """Base of the scaling configs. ``length_dependent``: the function reads ``seq_len``."""

    length_dependent: ClassVar[bool] = False


def _check_factor(factor: Any) -> None:
    if factor is None:
        raise ValueError("factor is required for this rope type (the context extension ratio, >= 1), got None")
    check_range("factor", factor, 1.0, None)


def _check_original(value: Any) -> None:
    if value is None:
        raise ValueError("original_max_position_embeddings is required for this rope type (the trained length), got None")
    check_int("original_max_position_embeddings", value, minimum=1)


@dataclass
class DefaultScaling(ScalingConfig):
    """No scaling: theta_i as trained (Su et al. 2021)."""


@dataclass
class LinearScaling(ScalingConfig):
    """Position Interpolation (Chen et al. 2023): theta_i / s, i.e. positions divided by s."""

    factor: float | None = None

    def validate(self) -> None:
        _check_factor(self.factor)


@dataclass
class NTKScaling(ScalingConfig):
    """NTK-aware scaling (bloc97, 2023): base' = base * s^(d/(d-2)).

    The highest frequency (i = 0) is unchanged and the lowest (i = d/2 - 1) is divided by s
    exactly, interpolating geometrically between them.
    """

    factor: float | None = None

    def validate(self) -> None:
        _check_factor(self.factor)


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
        _check_factor(self.factor)
        _check_original(self.original_max_position_embeddings)


@dataclass
class YarnScaling(ScalingConfig):
    """YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of LLMs").

    Per pair, r_i = L * theta_i / (2 pi) rotations over the trained length. Pairs with
    r_i > beta_fast keep theta_i (extrapolate), pairs with r_i < beta_slow use theta_i / s
    (interpolate), with a linear ramp over the pair index between them. attention_factor
    defaults to 0.1 ln(s) + 1 (or the ratio of mscale to mscale_all_dim forms, DeepSeek-V2).
    """

    factor: float | None = None
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def validate(self) -> None:
        _check_factor(self.factor)
        _check_original(self.original_max_position_embeddings)
        check_positive("beta_slow", self.beta_slow)
        check_positive("beta_fast", self.beta_fast)
        if self.beta_fast <= self.beta_slow:
            raise ValueError(f"beta_fast must be > beta_slow ({self.beta_slow}), got {self.beta_fast}")
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                check_range(name, getattr(self, name), 0.0, None)
        if self.attention_factor is not None:
            check_positive("attention_factor", self.attention_factor)
        if not isinstance(self.truncate, bool):
            raise TypeError(f"truncate must be a bool, got {self.truncate!r}")


@dataclass
class Llama3Scaling(ScalingConfig):
    """Llama 3.1 scaling (Meta 2024): wavelengths above L/low_freq_factor are divided by s,
    below L/high_freq_factor kept, with a smooth interpolation in between."""

    factor: float | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None

    def validate(self) -> None:
        _check_factor(self.factor)
        check_positive("low_freq_factor", self.low_freq_factor)
        check_positive("high_freq_factor", self.high_freq_factor)
        if self.low_freq_factor >= self.high_freq_factor:
            raise ValueError(
                f"low_freq_factor must be < high_freq_factor ({self.high_freq_factor}), got {self.low_freq_factor}"
            )
        _check_original(self.original_max_position_embeddings)


@dataclass
class LongRopeScaling(ScalingConfig):
    """LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million
    Tokens"): theta_i / lambda_i with searched per-pair factors, ``short_factor`` for
    sequences up to L and ``long_factor`` beyond. attention_factor defaults to
    sqrt(1 + ln(s) / ln(L)) (Phi-3)."""

    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    original_max_position_embeddings: int | None = None
    factor: float | None = None
    attention_factor: float | None = None
    length_dependent: ClassVar[bool] = True

    def __post_init__(self) -> None:
        # Accept lists (as in JSON configs) but store tuples of floats.
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)) or not value:
                raise ValueError(f"{name} must be a non-empty list of numbers (one per rotated pair), got {value!r}")
            for v in value:
                check_positive(name, v)
            setattr(self, name, tuple(float(v) for v in value))
        super().__post_init__()

    def validate(self) -> None:
        _check_original(self.original_max_position_embeddings)
        _check_factor(self.factor)
        if self.attention_factor is not None:
            check_positive("attention_factor", self.attention_factor)


# ---- the functions -----------------------------------------------------------------------
def _default(inv_freq: Tensor, cfg: DefaultScaling, *, base: float, seq_len: int | None = None):
    return inv_freq.clone(), 1.0


def _linear(inv_freq: Tensor, cfg: LinearScaling, *, base: float, seq_len: int | None = None):
    return inv_freq / cfg.factor, 1.0


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


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(inv_freq: Tensor, cfg: YarnScaling, *, base: float, seq_len: int | None = None):
    d = 2 * inv_freq.numel()
    L = cfg.original_max_position_embeddings
    s = cfg.factor

    def pair_index(rotations: float) -> float:
        # The (fractional) pair index i at which theta_i makes `rotations` turns over L:
        # L * base^(-2i/d) = 2 pi r  =>  i = d ln(L / (2 pi r)) / (2 ln base).
        return d * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(cfg.beta_fast), pair_index(cfg.beta_slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # a one-point ramp: avoid 0/0 (as the reference implementation does)
    i = torch.arange(d // 2, dtype=torch.float64, device=inv_freq.device)
    ramp = ((i - low) / (high - low)).clamp(0.0, 1.0)  # 0: extrapolate, 1: interpolate
    extrapolate = 1.0 - ramp
    out = (inv_freq / s) * (1.0 - extrapolate) + inv_freq * extrapolate

    if cfg.attention_factor is not None:
        factor = float(cfg.attention_factor)
    elif cfg.mscale and cfg.mscale_all_dim:
        factor = _yarn_mscale(s, cfg.mscale) / _yarn_mscale(s, cfg.mscale_all_dim)
    else:
        factor = _yarn_mscale(s)
    return out, factor


def _llama3(inv_freq: Tensor, cfg: Llama3Scaling, *, base: float, seq_len: int | None = None):
    L = cfg.original_max_position_embeddings
    s, lo, hi = cfg.factor, cfg.low_freq_factor, cfg.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen, high_freq_wavelen = L / lo, L / hi
    smooth = (L / wavelen - lo) / (hi - lo)  # 0 at L/lo, 1 at L/hi
    medium = (1 - smooth) * inv_freq / s + smooth * inv_freq
    out = torch.where(wavelen > low_freq_wavelen, inv_freq / s, inv_freq)
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, medium, out), 1.0


def _longrope(inv_freq: Tensor, cfg: LongRopeScaling, *, base: float, seq_len: int | Tensor | None = None):
    n = inv_freq.numel()
    for name in ("short_factor", "long_factor"):
        got = len(getattr(cfg, name))
        if got != n:
            raise ValueError(f"{name} must have rotary_dim/2 = {n} entries (one per rotated pair), got {got}")
    L = cfg.original_max_position_embeddings
    if isinstance(seq_len, Tensor):  # traced: select without a host sync
        long = torch.tensor(cfg.long_factor, dtype=torch.float64, device=inv_freq.device)
        short = torch.tensor(cfg.short_factor, dtype=torch.float64, device=inv_freq.device)
        ext = torch.where(seq_len.to(inv_freq.device) > L, long, short)
    else:
        factors = cfg.long_factor if seq_len is not None and seq_len > L else cfg.short_factor
        ext = torch.tensor(factors, dtype=torch.float64, device=inv_freq.device)
    if cfg.attention_factor is not None:
        factor = float(cfg.attention_factor)
    elif cfg.factor <= 1.0:
        factor = 1.0
    else:
        factor = math.sqrt(1 + math.log(cfg.factor) / math.log(L))
    return inv_freq / ext, factor


ScalingFn = Callable[..., tuple[Tensor, float]]

#: rope type -> pure function ``fn(inv_freq_base, cfg, *, base, seq_len=None) -> (inv_freq, attention_factor)``.
ROPE_SCALINGS: dict[str, ScalingFn] = {
    "default": _default,
    "linear": _linear,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
}

#: rope type -> its typed config class.
SCALING_CONFIGS: dict[str, type[ScalingConfig]] = {
    "default": DefaultScaling,
    "linear": LinearScaling,
    "ntk": NTKScaling,
    "dynamic": DynamicNTKScaling,
    "yarn": YarnScaling,
    "llama3": Llama3Scaling,
    "longrope": LongRopeScaling,
}


def make_scaling_config(rope_type: str, **params: Any) -> ScalingConfig:
    """The typed config of ``rope_type`` from keyword parameters (unknown keys: TypeError)."""
    check_choice("rope_type", rope_type, ROPE_SCALINGS)
    cls = SCALING_CONFIGS[rope_type]
    try:
        return cls(**params)
    except TypeError as e:
        raise TypeError(f"rope type {rope_type!r}: {e}") from None


def rope_frequencies(
    rope_type: str, rotary_dim: int, base: float, seq_len: int | None = None, **params: Any
) -> tuple[Tensor, float]:
    """``(inv_freq (rotary_dim/2,) float64, attention_factor)`` of a rope type.

    >>> inv_freq, af = rope_frequencies("yarn", 64, 10000.0, factor=4.0, original_max_position_embeddings=2048)
    """
    cfg = make_scaling_config(rope_type, **params)
    inv_freq = base_inv_freq(rotary_dim, base)
    return ROPE_SCALINGS[rope_type](inv_freq, cfg, base=float(base), seq_len=seq_len)
