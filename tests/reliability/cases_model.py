"""The model's configuration: embed_scale (the embed hooks' scaled coordinates)."""

from __future__ import annotations

from posenc import ModelConfig

from . import Case

A = "model config"

CASES = [
    Case(A, "ModelConfig(embed_scale=0)", r"^embed_scale must be > 0, got 0.0$",
         run=lambda: ModelConfig(encoding="sinusoidal", embed_scale=0)),
    Case(A, "ModelConfig(embed_scale=-0.02)", r"^embed_scale must be > 0, got -0.02$",
         run=lambda: ModelConfig(encoding="sinusoidal", embed_scale=-0.02)),
    Case(A, "ModelConfig(embed_scale=nan)", r"^embed_scale must be finite",
         run=lambda: ModelConfig(encoding="sinusoidal", embed_scale=float("nan"))),
    Case(A, "ModelConfig(embed_scale='0.02')", r"^embed_scale must be a float or None, got str '0.02'$",
         run=lambda: ModelConfig(encoding="sinusoidal", embed_scale="0.02"), error=TypeError),
]
