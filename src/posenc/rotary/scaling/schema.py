"""The shape of a RoPE scaling: its typed config base and its registry entry.

A scaling is one :class:`Scaling`: a config dataclass (a :class:`ScalingConfig`: the
parameters, their defaults and bounds), a pure function of the signature below, a display
label, its transformers spelling (:class:`HFSpec`) and its rule for "this scaling at factor f
for a model trained at L". Nothing here knows which scalings exist: the entries are defined
in the modules beside this one and registered by :mod:`posenc.rotary.scaling`.

Every function is ``fn(inv_freq_base, cfg, *, base, seq_len=None)`` returning
``(inv_freq, attention_factor)``:

* ``inv_freq_base``: the float64 theta_i = base^(-2i/d) (length d/2);
* ``cfg``: the type's own typed config (it validates itself on construction);
* ``base``: the rotary base, needed by types defined in terms of it (NTK, YaRN);
* ``seq_len``: the current sequence length, used only by the length-dependent types
  (``dynamic``, ``longrope``); every function is pure: same inputs, same output, no state.
  It is an int, or a 0-dim integer tensor under ``torch.compile`` (where reading the
  length would be a host sync and a graph break): those types then use tensor ops only.

``attention_factor`` multiplies cos and sin (so rotated q and rotated k each carry it once,
and logits carry its square), as YaRN prescribes and as transformers does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from torch import Tensor

from ...config import EncodingConfig, check_int, check_range, field_types

__all__ = ["ExtensionRule", "HFSpec", "IllustrationRule", "Scaling", "ScalingConfig", "ScalingFn",
           "check_factor", "check_original", "factor_and_length_rule", "factor_rule"]


@dataclass
class ScalingConfig(EncodingConfig):
    """Base of the scaling configs. ``length_dependent``: the function reads ``seq_len``."""

    length_dependent: ClassVar[bool] = False


def check_factor(factor: Any) -> None:
    """The context extension ratio s, required by the types that scale by it: >= 1."""
    if factor is None:
        raise ValueError("factor is required for this rope type (the context extension ratio, >= 1), got None")
    check_range("factor", factor, 1.0, None)


def check_original(value: Any) -> None:
    """The trained length L, required by the types defined relative to it: an int >= 1."""
    if value is None:
        raise ValueError("original_max_position_embeddings is required for this rope type (the trained length), got None")
    check_int("original_max_position_embeddings", value, minimum=1)


ScalingFn = Callable[..., tuple[Tensor, float]]
ExtensionRule = Callable[[float, int], dict[str, Any]]
IllustrationRule = Callable[[float, int, int], dict[str, Any]]


def factor_rule(s: float, L: int) -> dict[str, Any]:
    """The extension rule of the types that take the ratio alone: ``factor = s``."""
    return {"factor": s}


def factor_and_length_rule(s: float, L: int) -> dict[str, Any]:
    """The extension rule of the types that also need the trained length: ``factor = s``, L."""
    return {"factor": s, "original_max_position_embeddings": L}


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
        ``illustration`` rule, which needs ``rotary_dim``. A ValueError when this one has
        none points to the scalings that do (an entry does not know the others)."""
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
                         "list_scalings(extends=True) names the scalings with one")
