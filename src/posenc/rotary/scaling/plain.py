"""The two scalings without a length-dependent shape: ``default`` (theta_i as trained) and
``linear`` (Position Interpolation: every theta_i divided by s)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .schema import HFSpec, Scaling, ScalingConfig, check_factor, factor_rule

__all__ = ["DEFAULT", "DefaultScaling", "LINEAR", "LinearScaling"]


@dataclass
class DefaultScaling(ScalingConfig):
    """No scaling: theta_i as trained (Su et al. 2021)."""


@dataclass
class LinearScaling(ScalingConfig):
    """Position Interpolation (Chen et al. 2023): theta_i / s, i.e. positions divided by s."""

    factor: float | None = None

    def validate(self) -> None:
        check_factor(self.factor)


def _default(inv_freq: Tensor, cfg: DefaultScaling, *, base: float, seq_len: int | None = None):
    return inv_freq.clone(), 1.0


def _linear(inv_freq: Tensor, cfg: LinearScaling, *, base: float, seq_len: int | None = None):
    return inv_freq / cfg.factor, 1.0


DEFAULT = Scaling("default", DefaultScaling, _default, "theta_i = base^(-2i/d), as trained", "Su et al. 2021, RoFormer",
                  label="no scaling", hf=HFSpec("default"))
LINEAR = Scaling("linear", LinearScaling, _linear, "theta_i / s: positions divided by s",
                 "Chen et al. 2023, Position Interpolation", label="PI", hf=HFSpec("linear", required=("factor",)),
                 extension=factor_rule)
