"""Relative attention terms: skew/gather scores vs a materialized (T, T, D) table, and biased SDPA.

Side by side in one run, per length T (batch 1, 8 heads, head dim 64, float32 by default):

* every content-dependent encoding's logit terms, dense (``score``; found via the registry:
  encodings with ``has_terms``) against (a) HF BERT's ``relative_key_query``, which gathers a (T, T, D)
  distance-embedding tensor and contracts it with two einsums, and (b) plain q·k^T;
* every encoding with a ``logit_bias`` (``has_bias``: T5, ALiBi, ...), in two rows
  against plain causal SDPA: building the masked bias, which the model does once per forward
  and shares across layers ("per forward"), and causal attention with that bias, which every
  layer pays ("per layer", the model's SDPA path: ``causal_sdpa_with_bias``).

Goals: at T=2048 the score term needs >= 10x less peak memory and runs >= 3x faster than the
einsum, and costs <= 1.5x plain q·k^T; attention with a bias costs <= 1.3x causal SDPA per layer.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import Attention
from ..backends.sdpa import causal_sdpa_with_bias
from ..encoding import QKProjection
from ..registry import build, list_encodings
from .timing import describe_machine, peak_memory, time_fn

__all__ = ["DTYPES", "einsum_relative_key_query", "run_relative_speed", "format_table"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def einsum_relative_key_query(q: Tensor, k: Tensor, table: Tensor) -> Tensor:
    """HF BERT's relative_key_query terms, spelled as HF does: a (T, T, D) gathered tensor.

    q, k (B, H, T, D); table (2T - 1, D) with row d + T - 1 for distance d = i - j.
    """
    T = q.shape[2]
    pos = torch.arange(T, device=q.device)
    emb = table[pos[:, None] - pos[None, :] + T - 1]  # (T, T, D): the tensor the skew avoids
    return torch.einsum("bhld,lrd->bhlr", q, emb) + torch.einsum("bhrd,lrd->bhlr", k, emb)


def _measure(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    with torch.no_grad():
        t = time_fn(fn, warmup=1, repeat=repeat)
        mem = peak_memory(fn)
    return {"time_ms": 1e3 * t, "peak_mib": mem / 2**20}


def run_relative_speed(
    lengths: list[int],
    *,
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    repeat: int = 5,
    einsum_max_length: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Measure every row of the comparison at each length; returns a JSON-able dict. ``progress``:
    a line per row on stderr as it is measured (stdout keeps only what the caller prints)."""
    d_model = heads * head_dim
    score_names = [n for n in list_encodings() if build(n, d_model=d_model, num_heads=heads).has_terms]
    bias_names = [n for n in list_encodings() if build(n, d_model=d_model, num_heads=heads).has_bias]
    torch.manual_seed(0)
    layer = Attention(d_model, heads).to(device=device, dtype=dtype)  # share_att_key reads its q/k_proj
    results: list[dict[str, Any]] = []
    for T in lengths:
        g = torch.Generator(device=device).manual_seed(T)
        q = torch.randn(batch, heads, T, head_dim, generator=g, device=device, dtype=dtype)
        k = torch.randn(batch, heads, T, head_dim, generator=g, device=device, dtype=dtype)
        v = torch.randn(batch, heads, T, head_dim, generator=g, device=device, dtype=dtype)
        pos = torch.arange(T, device=device).expand(batch, T)
        x = torch.randn(batch, T, d_model, generator=g, device=device, dtype=dtype)  # the layer input (FoX's gates)
        proj = QKProjection.of(layer, x)
        scale = head_dim**-0.5
        rows: dict[str, dict[str, float]] = {}

        def add(label: str, fn: Callable[[], object]) -> None:
            rows[label] = _measure(fn, repeat)
            if progress:
                print(f"  T={T} {label}: {rows[label]['time_ms']:.2f} ms, {rows[label]['peak_mib']:.1f} MiB",
                      file=sys.stderr, flush=True)

        add("plain q·k^T", lambda: q @ k.transpose(-1, -2))
        if einsum_max_length is None or T <= einsum_max_length:
            table = torch.randn(2 * T - 1, head_dim, device=device, dtype=dtype)
            add("einsum (T,T,D) rkq", lambda: einsum_relative_key_query(q, k, table))
        for name in score_names:
            enc = build(name, d_model=d_model, num_heads=heads).to(device=device, dtype=dtype)
            add(f"score {name}", lambda enc=enc: enc.score(q, k, pos, pos, proj=proj))
        add("sdpa causal", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale))
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        for name in bias_names:
            enc = build(name, d_model=d_model, num_heads=heads).to(device=device, dtype=dtype)

            def masked_bias(enc=enc) -> Tensor:  # once per forward, shared by the layers
                return enc.score_bias(pos, pos).to(dtype).masked_fill(~causal, float("-inf"))

            add(f"bias {name} (per forward)", masked_bias)
            with torch.no_grad():
                bias = masked_bias()
            add(f"sdpa + bias {name} (per layer)", lambda bias=bias: causal_sdpa_with_bias(q, k, v, bias, scale))
            del bias
        results.append({"length": T, "rows": rows})
    return {
        "machine": describe_machine(),
        "batch": batch,
        "heads": heads,
        "head_dim": head_dim,
        "dtype": str(dtype).removeprefix("torch."),
        "results": results,
    }


def format_table(report: dict[str, Any]) -> str:
    """One block per length: time, peak memory, and ratios to plain q·k^T / the einsum."""
    lines = [f"machine: {report['machine']}; batch {report['batch']}, {report['heads']} heads, "
             f"head dim {report['head_dim']}, {report['dtype']}"]
    for res in report["results"]:
        rows = res["rows"]
        base = rows["plain q·k^T"]
        ein = rows.get("einsum (T,T,D) rkq")
        sdpa = rows["sdpa causal"]
        lines.append(f"\nT = {res['length']}")
        lines.append(f"  {'':<34} {'time ms':>10} {'peak MiB':>10} {'x q·k^T':>8} {'einsum/x time':>14} {'einsum/x mem':>13}")
        for label, r in rows.items():
            ref = sdpa if label.startswith(("sdpa + bias", "bias ")) else base
            et = f"{ein['time_ms'] / r['time_ms']:.1f}" if ein and label.startswith("score") else ""
            em = f"{ein['peak_mib'] / max(r['peak_mib'], 1e-9):.1f}" if ein and label.startswith("score") else ""
            lines.append(
                f"  {label:<34} {r['time_ms']:>10.2f} {r['peak_mib']:>10.1f} "
                f"{r['time_ms'] / ref['time_ms']:>8.2f} {et:>14} {em:>13}"
            )
        lines.append("  (x q·k^T: score rows vs plain q·k^T; 'bias' and 'sdpa + bias' rows vs plain causal SDPA;")
        lines.append("   a bias is built once per forward and shared by the layers, attention with it is paid per layer)")
    return "\n".join(lines)

