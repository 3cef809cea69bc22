"""RoPE frequency scalings: a registry of pure functions with one signature.

Notation: d = rotary_dim (even), i = 0 .. d/2 - 1 indexes the rotated pairs,
theta_i = base^(-2i/d) the base inverse frequencies (radians per position), L the trained
context length (``original_max_position_embeddings``), s = ``factor``.

Each scaling is one :class:`Scaling` entry of :data:`SCALINGS` (added with
:func:`register_scaling`): its typed config dataclass (the parameters, their defaults and
bounds), its pure function, its display label, its transformers spelling (:class:`HFSpec`)
and its rule for "this scaling at factor f for a model trained at L" (:meth:`Scaling.at_factor`).
Everything else is derived from the entries: the parameters ``RotaryConfig`` accepts,
``from_hf`` / ``to_hf``, the scalings ``posenc bench``, ``posenc bench --model`` and
``posenc probe`` evaluate and how they set them, the labels of their tables and figures, the
``rope-scaling`` plot, :data:`ROPE_SCALINGS` and :data:`SCALING_CONFIGS` (read-only views). Every function is
``fn(inv_freq_base, cfg, *, base, seq_len=None)`` returning ``(inv_freq, attention_factor)``:

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor

from ..config import EncodingConfig, check_choice, check_even, check_int, check_positive, check_range, field_types

__all__ = [
    "ROPE_SCALINGS",
    "SCALING_CONFIGS",
    "SCALINGS",
    "HFSpec",
    "Scaling",
    "ScalingConfig",
    "all_scaling_params",
    "get_scaling",
    "list_scalings",
    "register_scaling",
    "unregister_scaling",
    "DefaultScaling",
    "LinearScaling",
    "NTKScaling",
    "DynamicNTKScaling",
    "YarnScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "ProportionalScaling",
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
    beta_fast: float | None = None  # None: 32 (the paper's; transformers reads null as 32 too)
    beta_slow: float | None = None  # None: 1
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def validate(self) -> None:
        _check_factor(self.factor)
        _check_original(self.original_max_position_embeddings)
        for name in ("beta_fast", "beta_slow"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.fast <= self.slow:
            raise ValueError(f"beta_fast must be > beta_slow ({self.slow}), got {self.fast}")
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                check_range(name, getattr(self, name), 0.0, None)
        if self.attention_factor is not None:
            check_positive("attention_factor", self.attention_factor)
        if not isinstance(self.truncate, bool):
            raise TypeError(f"truncate must be a bool, got {self.truncate!r}")

    @property
    def fast(self) -> float:
        """beta_fast, or its default 32."""
        return 32.0 if self.beta_fast is None else self.beta_fast

    @property
    def slow(self) -> float:
        """beta_slow, or its default 1."""
        return 1.0 if self.beta_slow is None else self.beta_slow


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

    def validate(self) -> None:
        for name in ("short_factor", "long_factor"):  # tuples of floats by now (check_fields)
            value = getattr(self, name)
            if not value:
                raise ValueError(f"{name} must be a non-empty list of numbers (one per rotated pair), got {value!r}")
            for i, v in enumerate(value):
                check_positive(f"{name}[{i}]", v)
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

    low, high = pair_index(cfg.fast), pair_index(cfg.slow)
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


# ---- the schema: one entry per scaling -------------------------------------------------------
@dataclass(frozen=True)
class HFSpec:
    """How transformers (5.x ``rope_parameters``, legacy ``rope_scaling``) spells a scaling.

    Attributes:
        rope_type: transformers' ``rope_type``.
        keys: config field -> its key in the rope dict, where the two names differ (default: the
            field's own name, as for every scaling today).
        top_level: config field -> a key at the config's top level instead of the rope dict
            (``dynamic``: the trained length is ``max_position_embeddings``).
        required: fields the rope dict must give (transformers reads them without a default).
        implied_factor: an absent or null ``factor`` means ``max_position_embeddings /
            original_max_position_embeddings`` (transformers' yarn and longrope).
    """

    rope_type: str
    keys: Mapping[str, str] = field(default_factory=dict)
    top_level: Mapping[str, str] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    implied_factor: bool = False

    def key(self, name: str) -> str:
        """The HF key of config field ``name`` (in the rope dict or at the top level)."""
        return self.top_level.get(name) or self.keys.get(name, name)


ExtensionRule = Callable[[float, int], dict[str, Any]]
IllustrationRule = Callable[[float, int, int], dict[str, Any]]


@dataclass(frozen=True)
class Scaling:
    """One RoPE scaling type: everything posenc derives from it lives here.

    Attributes:
        name: the rope type (``RotaryConfig.scaling``, ``set_scaling``, ``rope_frequencies``).
        config: its typed config dataclass (fields, defaults, bounds in ``validate``); its fields
            are the parameters ``RotaryConfig`` / ``posenc.build("rope", ...)`` accept for it.
        fn: the pure function ``fn(inv_freq_base, cfg, *, base, seq_len=None) -> (inv_freq,
            attention_factor)``.
        summary: one line for listings and docs; ``source``: the paper or origin.
        label: its name in tables, legends and reports (``"PI"``, ``"YaRN"``); empty: ``name``.
        hf: its transformers spelling (:class:`HFSpec`); None: transformers has no such type.
        hf_default_base: for a type transformers lacks but that is plain RoPE with another base
            (static NTK), ``fn(cfg, base, rotary_dim) -> rope_theta``: ``to_hf`` writes it as
            ``rope_type="default"`` with that theta.
        extension: the training-free rule ``fn(factor, original) -> parameters`` that sets this
            scaling for a model trained on ``original`` tokens evaluated at ``factor`` times
            that length. The scalings with one are the ones ``posenc probe`` draws and
            ``posenc bench --model`` / ``posenc bench --scalings`` evaluate. None: not offered.
        bench: with an ``extension``, ``posenc bench`` evaluates it when its settings name no
            scalings (False for Llama 3: the committed bench tables were measured without it).
        illustration: for figures only, where the parameters are searched per model and no
            training-free rule exists (LongRoPE's per-pair factors): ``fn(factor, original,
            rotary_dim) -> parameters`` that stand in for them.
    """

    name: str
    config: type[ScalingConfig]
    fn: ScalingFn
    summary: str
    source: str
    label: str = ""
    hf: HFSpec | None = None
    hf_default_base: Callable[[ScalingConfig, float, int], float] | None = None
    extension: ExtensionRule | None = None
    bench: bool = True
    illustration: IllustrationRule | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"scaling name must be an identifier str, got {self.name!r}")
        if not (isinstance(self.config, type) and issubclass(self.config, ScalingConfig)):
            raise TypeError(f"config of scaling {self.name!r} must be a ScalingConfig subclass, got {self.config!r}")
        if not callable(self.fn):
            raise TypeError(f"fn of scaling {self.name!r} must be callable, got {self.fn!r}")
        if not isinstance(self.label, str):
            raise TypeError(f"label of scaling {self.name!r} must be a str, got {type(self.label).__name__}")
        object.__setattr__(self, "label", self.label or self.name)
        for attr in ("extension", "illustration"):
            rule = getattr(self, attr)
            if rule is not None and not callable(rule):
                raise TypeError(f"{attr} of scaling {self.name!r} must be callable or None, got {rule!r}")
        if not isinstance(self.bench, bool):
            raise TypeError(f"bench of scaling {self.name!r} must be a bool, got {self.bench!r}")
        names = set(self.params)
        if self.hf is not None:
            unknown = sorted((set(self.hf.keys) | set(self.hf.top_level) | set(self.hf.required)) - names)
            if unknown:
                raise ValueError(f"hf of scaling {self.name!r} names {', '.join(unknown)}, not fields of "
                                 f"{self.config.__name__} (its fields: {', '.join(sorted(names)) or 'none'})")

    @property
    def params(self) -> tuple[str, ...]:
        """The parameter names this type takes (its config's fields), in declaration order."""
        return tuple(field_types(self.config))

    def at_factor(self, factor: float, original: int, rotary_dim: int | None = None, *,
                  illustrate: bool = False) -> dict[str, Any]:
        """The parameters of this scaling for a model trained on ``original`` tokens and
        evaluated at ``factor * original``: its ``extension`` rule; a type without parameters
        (``default``) needs none. ``illustrate=True`` (figures) also takes the
        ``illustration`` rule, which needs ``rotary_dim``. A ValueError names the scalings
        that have a rule when this one has none."""
        if self.extension is not None:
            return dict(self.extension(float(factor), int(original)))
        if illustrate and self.illustration is not None:
            if rotary_dim is None:
                raise ValueError(f"rotary_dim is required to illustrate scaling {self.name!r} "
                                 "(its parameters are one per rotated pair)")
            return dict(self.illustration(float(factor), int(original), int(rotary_dim)))
        if not self.params:
            return {}
        raise ValueError(f"scaling {self.name!r} has no training-free rule for factor x the trained length; "
                         f"the scalings with one: {', '.join(list_scalings(extends=True))}")


#: rope type -> its :class:`Scaling` entry. Add one with :func:`register_scaling`.
SCALINGS: dict[str, Scaling] = {}


def register_scaling(entry: Scaling) -> Scaling:
    """Add a scaling type: ``RotaryConfig``, ``set_scaling``, ``rope_frequencies``, ``from_hf`` /
    ``to_hf`` (when ``entry.hf`` is set), the probe and the bench (when ``entry.extension`` is
    set), their labels and the ``rope-scaling`` plot take it from here; nothing else needs
    editing. A name already registered is an error; :func:`unregister_scaling` removes it."""
    if not isinstance(entry, Scaling):
        raise TypeError(f"entry must be a Scaling, got {type(entry).__name__}")
    if entry.name in SCALINGS:
        raise ValueError(f"rope type {entry.name!r} is already registered")
    if entry.hf is not None:
        taken = {e.hf.rope_type: n for n, e in SCALINGS.items() if e.hf is not None}
        if entry.hf.rope_type in taken:
            raise ValueError(f"HF rope_type {entry.hf.rope_type!r} already reads as {taken[entry.hf.rope_type]!r}")
    SCALINGS[entry.name] = entry
    return entry


def unregister_scaling(name: str) -> Scaling:
    """Remove the scaling ``name`` (one a test or plugin registered) and return its entry."""
    return SCALINGS.pop(get_scaling(name).name)


class _View(Mapping):
    """A read-only, always current view of one attribute of every entry of SCALINGS."""

    def __init__(self, attr: str, doc: str) -> None:
        self._attr, self.__doc__ = attr, doc

    def __getitem__(self, name: str) -> Any:
        return getattr(SCALINGS[name], self._attr)

    def __iter__(self):
        return iter(SCALINGS)

    def __len__(self) -> int:
        return len(SCALINGS)

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: {v!r}' for k, v in self.items())}}}"


#: rope type -> pure function ``fn(inv_freq_base, cfg, *, base, seq_len=None) -> (inv_freq, attention_factor)``.
ROPE_SCALINGS: Mapping[str, ScalingFn] = _View("fn", "rope type -> its pure frequency function")
#: rope type -> its typed config class.
SCALING_CONFIGS: Mapping[str, type[ScalingConfig]] = _View("config", "rope type -> its typed config class")


def list_scalings(*, extends: bool = False, training_free: bool = False) -> list[str]:
    """The registered rope types, in registration order.

    ``extends=True``: those with an ``extension`` rule (``posenc probe`` draws them; the
    choices of ``--scalings``). ``training_free=True``: those of them ``posenc bench``
    evaluates by default (``Scaling.bench``)."""
    return [n for n, e in SCALINGS.items()
            if (not (extends or training_free) or e.extension is not None) and (not training_free or e.bench)]


def all_scaling_params() -> tuple[str, ...]:
    """Every parameter some registered rope type takes (for listings and error messages)."""
    seen: dict[str, None] = {}
    for e in SCALINGS.values():
        seen.update(dict.fromkeys(e.params))
    return tuple(seen)


def get_scaling(rope_type: Any) -> Scaling:
    """The entry of ``rope_type``; an unknown one lists the registered types."""
    if not isinstance(rope_type, str):
        raise TypeError(f"scaling must be a str (one of {', '.join(map(repr, SCALINGS))}), "
                        f"got {type(rope_type).__name__} {rope_type!r}")
    check_choice("scaling", rope_type, SCALINGS)
    return SCALINGS[rope_type]


def _ntk_base(cfg: NTKScaling, base: float, rotary_dim: int) -> float:
    return base * cfg.factor ** (rotary_dim / (rotary_dim - 2))  # bloc97's base' (see NTKScaling)


def _factor(s: float, L: int) -> dict[str, Any]:
    return {"factor": s}


def _factor_and_length(s: float, L: int) -> dict[str, Any]:
    return {"factor": s, "original_max_position_embeddings": L}


def _dynamic_at(s: float, L: int) -> dict[str, Any]:
    # dynamic NTK rescales by the current length n itself (s' = s n / L - (s - 1)), so s = 1
    # gives exactly n / L at every length (with s it would be s^2 - s + 1 at n = s L).
    return {"factor": 1.0, "original_max_position_embeddings": L}


def _longrope_ramp(s: float, L: int, rotary_dim: int) -> dict[str, Any]:
    # LongRoPE's per-pair factors are searched per model: a ramp from 1 (highest frequency)
    # to s (lowest) stands in for them in figures.
    n = rotary_dim // 2
    return {"short_factor": (1.0,) * n, "long_factor": tuple(1.0 + (s - 1.0) * i / max(n - 1, 1) for i in range(n)),
            "factor": s, "original_max_position_embeddings": L}


@dataclass
class ProportionalScaling(ScalingConfig):
    """p-RoPE (Barbero et al. 2025, "Round and Round We Go! What makes Rotary Positional
    Encodings useful?", ICLR 2025; Gemma 4): the first int(p * d // 2) pairs (the highest
    frequencies) keep theta_i, the others get theta = 0 (not rotated: position-independent
    channels); every theta is then divided by ``factor`` (transformers' "proportional")."""

    proportion: float = 1.0  # p, in [0, 1]; transformers' rope-dict partial_rotary_factor
    factor: float = 1.0

    def validate(self) -> None:
        check_range("proportion", self.proportion, 0.0, 1.0)
        check_range("factor", self.factor, 1.0, None)


def _proportional(inv_freq: Tensor, cfg: ProportionalScaling, *, base: float, seq_len: int | None = None):
    kept = int(cfg.proportion * (2 * inv_freq.numel()) // 2)  # as transformers counts the rotated pairs
    out = inv_freq.clone()
    out[kept:] = 0.0
    return out / cfg.factor, 1.0


for _entry in (
    Scaling("default", DefaultScaling, _default, "theta_i = base^(-2i/d), as trained", "Su et al. 2021, RoFormer",
            label="no scaling", hf=HFSpec("default")),
    Scaling("linear", LinearScaling, _linear, "theta_i / s: positions divided by s",
            "Chen et al. 2023, Position Interpolation", label="PI", hf=HFSpec("linear", required=("factor",)),
            extension=_factor),
    Scaling("ntk", NTKScaling, _ntk, "base' = base * s^(d/(d-2)): theta_0 kept, theta_(d/2-1) / s",
            "bloc97 2023, NTK-aware scaled RoPE", label="NTK-aware", hf_default_base=_ntk_base, extension=_factor),
    # transformers' L for dynamic is max_position_embeddings.
    Scaling("dynamic", DynamicNTKScaling, _dynamic, "ntk with s' = s n / L - (s - 1) for n > L (n: current length)",
            "emozilla 2023, dynamic NTK", label="dynamic NTK",
            hf=HFSpec("dynamic", top_level={"original_max_position_embeddings": "max_position_embeddings"},
                      required=("factor",)),
            extension=_dynamic_at),
    Scaling("yarn", YarnScaling, _yarn, "theta_i kept above beta_fast turns over L, / s below beta_slow, ramp "
            "between; attention factor 0.1 ln s + 1", "Peng et al. 2023, YaRN", label="YaRN",
            hf=HFSpec("yarn", implied_factor=True), extension=_factor_and_length),
    Scaling("llama3", Llama3Scaling, _llama3, "wavelengths < L/high_freq_factor kept, > L/low_freq_factor / s, "
            "smooth between", "Meta 2024, Llama 3.1", label="Llama 3",
            hf=HFSpec("llama3", required=("factor", "low_freq_factor", "high_freq_factor")),
            extension=_factor_and_length, bench=False),
    Scaling("longrope", LongRopeScaling, _longrope, "theta_i / lambda_i, short_factor for n <= L, long_factor "
            "beyond; attention factor sqrt(1 + ln s / ln L)", "Ding et al. 2024, LongRoPE; Phi-3", label="LongRoPE",
            hf=HFSpec("longrope", required=("short_factor", "long_factor"), implied_factor=True),
            illustration=_longrope_ramp),
    Scaling("proportional", ProportionalScaling, _proportional, "theta_i kept for the first p of the pairs, 0 "
            "(not rotated) for the rest; all / s", "Barbero et al. 2025, Round and Round We Go (p-RoPE); Gemma 4",
            label="p-RoPE", illustration=lambda s, L, rotary_dim: {"proportion": 0.25},
            hf=HFSpec("proportional", keys={"proportion": "partial_rotary_factor"})),
):
    register_scaling(_entry)
del _entry


def make_scaling_config(rope_type: str, **params: Any) -> ScalingConfig:
    """The typed config of ``rope_type`` from keyword parameters.

    A parameter the type does not take is a ``ValueError`` listing the ones it does.
    """
    entry = get_scaling(rope_type)
    extra = [k for k in params if k not in entry.params]
    if extra:
        raise ValueError(
            f"{', '.join(map(str, extra))} not a parameter of rope type {rope_type!r} "
            f"(it takes: {', '.join(entry.params) or 'nothing'})"
        )
    return entry.config(**params)


def rope_frequencies(
    rope_type: str, rotary_dim: int, base: float, seq_len: int | None = None, **params: Any
) -> tuple[Tensor, float]:
    """``(inv_freq (rotary_dim/2,) float64, attention_factor)`` of a rope type.

    >>> inv_freq, af = rope_frequencies("yarn", 64, 10000.0, factor=4.0, original_max_position_embeddings=2048)
    """
    cfg = make_scaling_config(rope_type, **params)
    inv_freq = base_inv_freq(rotary_dim, base)
    return SCALINGS[rope_type].fn(inv_freq, cfg, base=float(base), seq_len=seq_len)
