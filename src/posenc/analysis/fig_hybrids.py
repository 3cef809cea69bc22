"""The layer patterns' figure: which layers rotate, which see every key, at which RoPE base, and
Llama 4's query temperature on its NoPE layers (Meta 2025, "The Llama 4 herd"; SmolLM3; Cohere
Command R7B; Gemma 3's sliding and global layers at their own bases).

The layers are :meth:`posenc.ModelConfig.layer_kinds` of each pattern in
:data:`posenc.hybrids.HYBRIDS` at its defaults; the temperature is the factor the registered
``nope_temperature`` encoding's ``rotate`` hook multiplies a query by, read at each position.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..hybrids import HYBRIDS
from ..model_config import ModelConfig
from ..registry import build
from .canvas import PlotResult, figure, save

__all__ = ["layer_table", "plot_hybrid_layers", "query_factor"]

_COLORS = {"rope": "C0", "nope_temperature": "C1", None: "0.75"}


def layer_table(n_layer: int) -> dict[str, list[tuple[str | None, str, int | None]]]:
    """Per named hybrid, each layer's (encoding name or None, attention kind, window / chunk)."""
    out = {}
    for name, pattern in HYBRIDS.items():
        kinds = ModelConfig(n_layer=n_layer, layer_pattern=pattern()).layer_kinds()
        out[name] = [(None if k.encoding is None else k.encoding.name, k.attention, k.size) for k in kinds]
    return out


def query_factor(positions: torch.Tensor, **config) -> torch.Tensor:
    """The factor ``nope_temperature``'s rotate hook gives a query at each position (float64)."""
    enc = build("nope_temperature", d_model=8, num_heads=1, **config)
    q = torch.ones(1, 1, positions.numel(), 8, dtype=torch.float64)
    with torch.no_grad():
        scaled, _ = enc.rotate(q, q, positions[None, :], positions[None, :])
    return scaled[0, 0, :, 0]


def plot_hybrid_layers(out_dir: Path, n_layer: int = 8, max_position: int = 2**20) -> PlotResult:
    """Layer patterns (Llama 4, SmolLM3, Cohere2, Gemma 3): each layer's encoding and attention span,
    and Llama 4's query temperature 1 + 0.1 log1p(floor((p + 1) / 8192)) on its NoPE layers."""
    table = layer_table(n_layer)
    specs = {name: ModelConfig(n_layer=n_layer, layer_pattern=pattern()).layer_kinds() for name, pattern in HYBRIDS.items()}
    pos = torch.unique(torch.logspace(0, torch.log10(torch.tensor(float(max_position))), 400).long())
    factor = query_factor(pos)
    plt, fig, (a0, a1) = figure(2)
    for row, (name, layers) in enumerate(table.items()):
        for i, (enc, attention, size) in enumerate(layers):
            a0.add_patch(plt.Rectangle((i, row), 0.95, 0.9, color=_COLORS.get(enc, "C2")))
            span = "all" if attention == "global" else f"{attention}\n{size}"
            base = dict(specs[name][i].encoding.config).get("base") if enc == "rope" else None
            if base is not None:  # Gemma 3: each layer type at its own RoPE base
                span += "\nbase " + f"{base:.0e}".replace("e+0", "e")  # 1e4, 1e6
            a0.text(i + 0.47, row + 0.45, span, ha="center", va="center", fontsize=6.5,
                    color="white" if enc == "rope" else "black")
    a0.set_xlim(0, n_layer)
    a0.set_ylim(len(table), 0)
    a0.set_yticks([r + 0.45 for r in range(len(table))], list(table))
    a0.set_xticks([i + 0.47 for i in range(n_layer)], [str(i) for i in range(n_layer)])
    a0.set_xlabel("layer (text: the keys a query sees)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()]
    a0.legend(handles, ["RoPE", "NoPE + temperature", "NoPE"], loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=3, fontsize=8)
    a0.set_title("layer patterns at their defaults", fontsize=10)
    a1.plot(pos.numpy(), factor.numpy(), color="C1")
    a1.set_xscale("log")
    a1.set_xlabel("query position p")
    a1.set_ylabel("query factor (NoPE layers)")
    a1.set_title("Llama 4's temperature: 1 below p + 1 = 8192, then log steps", fontsize=10)
    a1.grid(alpha=0.3, which="both")
    return save(plt, fig, out_dir, "hybrid-layers", "Layer patterns: per-layer encoding, span, RoPE base and temperature",
                {"layers": table, "positions": pos, "factor": factor})
