"""``posenc probe MODEL_DIR``: a real checkpoint's attention score against relative distance.

The experiment of Liu et al. 2023 ("Scaling Laws of RoPE-based Extrapolation", Fig. 1) and
of the RoPE-base discussions around Llama 2 / 3 (see docs/hf.md): take the real q and k of
a layer, re-rotate them at every distance d (also past the trained length L), and read the
logit against d. Here:

1. the checkpoint runs on a text (a file, or the Python standard library's sources) once;
   forward hooks take the *pre-rotation* q and k of the chosen layers (the outputs of
   ``q_proj``/``k_proj``, or of ``q_norm``/``k_norm`` where the family normalises per head,
   Qwen 3 / Gemma 3). Pre-rotation, so posenc's RoPE from :func:`posenc.rotary.from_hf` can
   place them at any distance, with any base or scaling, without running the model again;
   the forward stops after the last chosen layer (:func:`layer_taps`: Llama, Mistral, Qwen 2/3,
   Gemma, Phi-3, GPT-NeoX, GPT-J).
2. Notation: q_t (H, D), k_t (Hkv, D) at tokens t = 1..T-1 (token 0, often BOS, an
   attention sink with outsized keys, is left out); R(d) rotates each pair j by d * theta_j
   (and scales by the scaling's attention factor). The curve of head h is

       s_h(d) = scale * mean_{i, j} q_i,h . R(d) k_j,g(h)  =  scale * qbar_h . R(d) kbar_g(h)

   (the mean over every pair of real tokens, equal to the means' score because the score
   is bilinear; g(h) is the key head of query head h under GQA; scale is the attention's
   own, 1/sqrt(D) for Llama). The figure shows the mean of s_h over the chosen heads.
3. The same split into the high-frequency half of the rotated pairs (the r/4 largest
   theta_j) and the low-frequency half: ``full = high + low + unrotated`` (channels past
   ``rotary_dim`` do not depend on d).
4. The same curve with the base raised (x16 by default) and with each training-free scaling
   (linear, NTK, dynamic NTK, YaRN, Llama 3) set for the probed length ``extend * L``.

Outputs in ``--out``: ``probe.json`` (every curve's data) and ``probe_layer<L>.png``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from ..rotary import RotaryEmbedding, from_hf
from .checkpoint import DTYPES, check_fits, load_model, load_tokenizer, open_checkpoint, trained_length

__all__ = [
    "PROBE_SCALINGS",
    "ProbeSettings",
    "QKTaps",
    "layer_taps",
    "capture_qk",
    "probe",
    "probe_text_ids",
    "score_curves",
    "variant_ropes",
]

PROBE_FORMAT = "posenc-probe-1"
#: training-free scalings drawn (LongRoPE is left out: its per-pair factors are searched per model).
PROBE_SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3")
_MAX_POINTS = 1 << 16


@dataclass(frozen=True)
class ProbeSettings:
    """What a probe computes (stored in probe.json).

    Attributes:
        layers: decoder layers to probe (0-based).
        heads: query heads averaged in the figure; None = all.
        tokens: tokens of text the model reads (capped at the trained length L, so q and k come
            from positions the model was trained at).
        extend: curves run to ``extend * L`` (L the trained length); also the scalings' factor.
        base_factor: the "base raised" curve uses ``base * base_factor``.
        points: at most this many distances, evenly spaced from 0 (every distance when fewer).
        scalings: training-free scalings drawn (a subset of PROBE_SCALINGS).
        dtype: the model's dtype while it reads the text (q and k are analysed in float32).
    """

    layers: tuple[int, ...] = (0,)
    heads: tuple[int, ...] | None = None
    tokens: int = 512
    extend: float = 4.0
    base_factor: float = 16.0
    points: int = 2048
    scalings: tuple[str, ...] = PROBE_SCALINGS
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        from ..config import check_choice, check_int, check_positive

        if not self.layers:
            raise ValueError("layers must name at least one layer, got none")
        for layer in self.layers:
            check_int("layer", layer, minimum=0)
        for h in self.heads or ():
            check_int("head", h, minimum=0)
        if self.heads is not None and not self.heads:
            raise ValueError("heads must name at least one head or be None (all), got none")
        check_int("tokens", self.tokens, minimum=2)
        check_positive("extend", self.extend)
        if self.extend < 1:
            raise ValueError(f"extend must be >= 1 (curves reach extend * the trained length), got {self.extend}")
        check_positive("base_factor", self.base_factor)
        check_int("points", self.points, minimum=2, maximum=_MAX_POINTS)
        for s in self.scalings:
            check_choice("scalings", s, PROBE_SCALINGS)
        check_choice("dtype", self.dtype, tuple(DTYPES))


# --------------------------------------------------------------------------- text


def probe_text_ids(tokenizer: Any, text: str | Path | None, tokens: int) -> list[int]:
    """``tokens`` token ids of the text file ``text`` (None: the Python standard library's
    sources, the bench's lm corpus), with the tokenizer's BOS first when it has one."""
    if text is None:
        from ..bench.data import load_corpus

        # validation is 1/9 of max_bytes; 8 bytes per token covers any real tokenizer
        raw = bytes(load_corpus(None, max_bytes=9 * 8 * tokens + 9).val.tolist())
        where = "the standard library sources"
    else:
        p = Path(text)
        if not p.is_file():
            raise FileNotFoundError(f"--text: no such file: {str(p)!r}")
        raw, where = p.read_bytes(), f"--text {str(p)!r}"
    ids = tokenizer.encode(raw.decode("utf-8", errors="replace"))
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id] + ids
    if len(ids) < 2:
        raise ValueError(f"{where} gives {len(ids)} tokens; the probe needs at least 2")
    return ids[:tokens]


# --------------------------------------------------------------------------- capture


@dataclass(frozen=True)
class QKTaps:
    """Where one decoder layer's pre-rotation q and k can be read.

    ``taps``: (module, split) pairs; a forward hook on ``module`` passes its output to
    ``split``, which returns ``{"q": (H, T, D)}``, ``{"k": (Hkv, T, D)}`` or both.
    ``scale``: the layer's logit scale (1/sqrt(D), Gemma's query_pre_attn_scalar^-1/2, ...).
    """

    taps: tuple[tuple[Any, Any], ...]
    scale: float


def _heads(x: Tensor, n: int, d: int) -> Tensor:
    """(1, T, n*d) or (1, T, n, d) -> (n, T, d), float32."""
    return x.float().reshape(x.shape[0], x.shape[1], n, d)[0].transpose(0, 1).contiguous()


def layer_taps(model: Any) -> list[QKTaps]:
    """One :class:`QKTaps` per decoder layer of a transformers causal LM:

    * Llama, Mistral, Qwen 2/3, Gemma (``model.layers[i].self_attn``): ``q_proj``/``k_proj``,
      or ``q_norm``/``k_norm`` where RoPE follows a per-head norm (Qwen 3);
    * Phi-3: the fused ``qkv_proj`` (q, then k, then v);
    * GPT-NeoX: ``query_key_value``, per head [q | k | v];
    * GPT-J (``transformer.h[i].attn``): ``q_proj``/``k_proj``, logits divided by sqrt(D).
    """
    cfg = model.config
    H = cfg.num_attention_heads
    Hkv = getattr(cfg, "num_key_value_heads", None) or H
    out = []
    body = getattr(model, "model", None)
    if body is not None and hasattr(body, "layers") and all(hasattr(x, "self_attn") for x in body.layers):
        for layer in body.layers:
            a = layer.self_attn
            d = a.head_dim
            scale = float(getattr(a, "scaling", d**-0.5))
            if hasattr(a, "qkv_proj"):  # Phi-3
                split = lambda o, d=d: {"q": _heads(o[..., : H * d], H, d), "k": _heads(o[..., H * d : (H + Hkv) * d], Hkv, d)}
                out.append(QKTaps(((a.qkv_proj, split),), scale))
            elif hasattr(a, "q_proj") and hasattr(a, "k_proj"):
                qm = getattr(a, "q_norm", None) or a.q_proj
                km = getattr(a, "k_norm", None) or a.k_proj
                out.append(QKTaps(((qm, lambda o, d=d: {"q": _heads(o, H, d)}), (km, lambda o, d=d: {"k": _heads(o, Hkv, d)})),
                                  scale))
            else:
                break
        else:
            return out
    neox = getattr(model, "gpt_neox", None)
    if neox is not None:
        for layer in neox.layers:
            a = layer.attention
            d = a.head_size

            def split(o, d=d):
                q, k, _ = o.reshape(o.shape[0], o.shape[1], H, 3 * d).chunk(3, dim=-1)  # per head [q | k | v]
                return {"q": _heads(q, H, d), "k": _heads(k, H, d)}

            out.append(QKTaps(((a.query_key_value, split),), float(getattr(a, "scaling", d**-0.5))))
        return out
    gptj = getattr(model, "transformer", None)
    if gptj is not None and hasattr(gptj, "h") and all(hasattr(b.attn, "q_proj") for b in gptj.h):
        for block in gptj.h:
            a = block.attn
            d = a.head_dim
            out.append(QKTaps(((a.q_proj, lambda o, d=d: {"q": _heads(o, H, d)}),
                               (a.k_proj, lambda o, d=d: {"k": _heads(o, H, d)})), float(1.0 / a.scale_attn)))
        return out
    raise ValueError(
        f"{type(model).__name__} ({getattr(cfg, 'model_type', None)!r}) has no q/k projections the probe knows; "
        "it reads Llama, Mistral, Qwen2/3, Gemma, Phi-3, GPT-NeoX and GPT-J-style checkpoints"
    )


class _Stop(Exception):
    """Raised by the last hook to end the forward once every chosen layer is captured."""


@torch.no_grad()
def capture_qk(model: Any, input_ids: Tensor, layers: Sequence[int]) -> dict[int, tuple[Tensor, Tensor]]:
    """Pre-rotation q (H, T, D) and k (Hkv, T, D), float32, of ``layers`` on ``input_ids`` (1, T)
    (see :func:`layer_taps` for where they are read). The forward stops once the last one is in."""
    taps = layer_taps(model)
    for layer in layers:
        if not 0 <= layer < len(taps):
            raise ValueError(f"--layer must be in [0, {len(taps) - 1}] (the model has {len(taps)} layers), got {layer}")
    want = {(layer, w) for layer in layers for w in ("q", "k")}
    found: dict[tuple[int, str], Tensor] = {}
    handles = []

    def hook(layer: int, split):
        def fn(module, args, output):
            for which, x in split(output).items():
                found[(layer, which)] = x
            if want <= found.keys():
                raise _Stop
        return fn

    try:
        for layer in set(layers):
            for module, split in taps[layer].taps:
                handles.append(module.register_forward_hook(hook(layer, split)))
        try:
            model(input_ids=input_ids, use_cache=False)
        except _Stop:
            pass
    finally:
        for h in handles:
            h.remove()
    return {layer: (found[(layer, "q")], found[(layer, "k")]) for layer in layers}


# --------------------------------------------------------------------------- curves


def _pair_channels(rope: RotaryEmbedding, pairs: Tensor) -> Tensor:
    """Channel indices of rotated ``pairs`` in the rope's layout."""
    half = rope.rotary_dim // 2
    if rope.config.layout == "half":
        return torch.cat([pairs, pairs + half])
    return torch.cat([2 * pairs, 2 * pairs + 1])


def frequency_halves(rope: RotaryEmbedding) -> tuple[Tensor, Tensor]:
    """(high, low): pair indices of the r/4 largest theta_j and of the rest."""
    order = torch.argsort(rope.inv_freq, descending=True)
    n_high = (rope.rotary_dim // 2) // 2
    return order[:n_high].sort().values, order[n_high:].sort().values


@torch.no_grad()
def score_curves(
    q: Tensor, k: Tensor, rope: RotaryEmbedding, distances: Tensor, scale: float,
    halves: tuple[Tensor, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Score against distance per head: ``{"full", "high", "low", "unrotated"}``, each (H, N) float32.

    q (H, T, D), k (Hkv, T, D) pre-rotation; ``distances`` (N,) ints >= 0. qbar (mean over
    tokens 1..T-1) is rotated at position d and kbar at position 0 by ``rope``: the logit of
    a query d tokens after its key. ``halves``: the (high, low) pair indices (default: this
    rope's own, :func:`frequency_halves`).
    """
    H, Hkv, D = q.shape[0], k.shape[0], q.shape[-1]
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of key heads ({Hkv})")
    skip = 1 if q.shape[1] > 1 else 0
    qbar = q[:, skip:].mean(1).float()  # (H, D)
    kbar = k[:, skip:].mean(1).float()  # (Hkv, D)
    N = distances.numel()
    qpos = distances.reshape(1, N).long()
    kpos = torch.zeros(1, 1, dtype=torch.long)
    # For length-dependent scalings (dynamic NTK) the current length is max(d) + 1: the
    # frequencies a context of the curve's full length would use.
    q_rot, k_rot = rope.rotate(qbar[None, :, None, :].expand(1, H, N, D).contiguous(),
                               kbar[None, :, None, :].contiguous(), qpos, kpos)
    k_rot = k_rot[0, :, 0].repeat_interleave(H // Hkv, dim=0)  # (H, D): key head of each query head
    prod = q_rot[0] * k_rot[:, None, :] * scale  # (H, N, D)
    high, low = frequency_halves(rope) if halves is None else halves
    r = rope.rotary_dim
    out = {
        "full": prod.sum(-1),
        "high": prod[..., _pair_channels(rope, high)].sum(-1),
        "low": prod[..., _pair_channels(rope, low)].sum(-1),
        "unrotated": prod[..., r:].sum(-1),
    }
    return out


def variant_ropes(rope: RotaryEmbedding, L: int, extend: float, base_factor: float,
                  scalings: Sequence[str]) -> dict[str, RotaryEmbedding]:
    """The checkpoint's own RoPE ("model"), its base times ``base_factor`` (its own scaling
    kept) and each training-free scaling set for ``extend * L`` (factor ``extend``,
    ``original_max_position_embeddings`` L; dynamic NTK: factor 1, as it scales by the
    current length itself, s' = n / L)."""
    out = {"model": rope}
    out[f"base x{base_factor:g}"] = RotaryEmbedding(rope.config.replace(base=rope.config.base * base_factor),
                                                    rope.dims)
    for s in scalings:
        params: dict[str, Any] = {"factor": 1.0 if s == "dynamic" else float(extend)}
        if s != "linear" and s != "ntk":
            params["original_max_position_embeddings"] = L
        v = RotaryEmbedding(rope.config, rope.dims)
        try:
            v.set_scaling(s, **params)
        except (TypeError, ValueError) as e:
            print(f"posenc probe: skipping scaling {s!r}: {e}", file=sys.stderr)
            continue
        out[s] = v
    return out


def _distances(max_d: int, points: int) -> Tensor:
    if max_d + 1 <= points:
        return torch.arange(max_d + 1)
    return torch.linspace(0, max_d, points).round().long().unique()


# --------------------------------------------------------------------------- the command


@dataclass
class ProbeResult:
    """probe.json's content (``data``) and the PNGs written."""

    data: dict[str, Any]
    figures: list[Path] = field(default_factory=list)


def probe(
    model_dir: str | Path, out: str | Path, settings: ProbeSettings | None = None, *,
    text: str | Path | None = None, progress: bool = True, model: Any = None,
) -> ProbeResult:
    """Run the probe (module docstring) and write ``out/probe.json`` and ``out/probe_layer<L>.png``.

    ``model``: an already loaded transformers model of ``model_dir`` (tests); else it is
    loaded in ``settings.dtype`` after the memory check.
    """
    from ..progress import bar as progress_bar

    from ..analysis.plots import prepare_out_dir
    from ..bench.files import write_json

    s = ProbeSettings() if settings is None else settings
    ckpt = open_checkpoint(model_dir)
    rope = from_hf(ckpt.config)  # before loading: a config posenc cannot read fails fast
    if model is None:
        check_fits(ckpt, DTYPES[s.dtype])  # before anything is written
    L = trained_length(ckpt.config)
    out_dir = prepare_out_dir(out)
    n_heads = rope.dims.num_heads
    heads = tuple(range(n_heads)) if s.heads is None else s.heads
    for h in heads:
        if h >= n_heads:
            raise ValueError(f"--heads must be in [0, {n_heads - 1}] (the model has {n_heads} query heads), got {h}")
    n_layers = ckpt.config.get("num_hidden_layers")
    for layer in s.layers:
        if isinstance(n_layers, int) and layer >= n_layers:
            raise ValueError(f"--layer must be in [0, {n_layers - 1}] (the model has {n_layers} layers), got {layer}")
    tokenizer = load_tokenizer(ckpt)
    # at most L tokens: q and k are read where the model was trained (the curves then go past L)
    ids = probe_text_ids(tokenizer, text, min(s.tokens, L))
    if model is None:
        model = load_model(ckpt, DTYPES[s.dtype], progress=progress)
    taps = layer_taps(model)
    captured = capture_qk(model, torch.tensor([ids]), s.layers)

    max_d = math.ceil(s.extend * L)
    distances = _distances(max_d, s.points)
    ropes = variant_ropes(rope, L, s.extend, s.base_factor, s.scalings)
    halves = frequency_halves(rope)
    sel = torch.tensor(heads)
    data: dict[str, Any] = dict(
        format=PROBE_FORMAT, model=ckpt.name, model_type=ckpt.config.get("model_type"), trained_length=L,
        rope=dict(base=rope.config.base, rotary_dim=rope.rotary_dim, layout=rope.config.layout,
                  scaling=rope.config.scaling, **{k: v for k, v in rope.config.scaling_params().items()}),
        settings=dataclasses.asdict(s), text="stdlib" if text is None else str(text), text_tokens=len(ids),
        tokenizer=tokenizer.kind, heads=list(heads), distances=distances.tolist(),
        high_pairs=halves[0].tolist(), low_pairs=halves[1].tolist(), layers={},
    )
    bar = progress_bar(len(s.layers) * len(ropes), "probe", unit="curve", enabled=progress)
    for layer in s.layers:
        q, k = captured[layer]
        scale = taps[layer].scale
        curves = {}
        for name, vr in ropes.items():
            c = score_curves(q, k, vr, distances, scale, halves)
            curves[name] = {kind: c[kind][sel].mean(0).tolist() for kind in ("full", "high", "low", "unrotated")}
            bar.update()
        data["layers"][str(layer)] = dict(scale=scale, curves=curves)
    bar.close()
    write_json(out_dir / "probe.json", data)
    figs = [_plot_layer(data, layer, out_dir) for layer in s.layers]
    return ProbeResult(data, figs)


def _plot_layer(data: dict, layer: int, out_dir: Path) -> Path:
    """Three panels: the checkpoint's curve; its high/low-frequency halves; base and scalings."""
    from .._optional import require

    matplotlib = require("matplotlib", extra="plot")

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    d = data["distances"]
    L = data["trained_length"]
    curves = data["layers"][str(layer)]["curves"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharex=True)
    heads = data["heads"]
    who = f"all {len(heads)} heads" if data["settings"]["heads"] is None else f"heads {', '.join(map(str, heads))}"
    axes[0].plot(d, curves["model"]["full"], lw=0.8, color="C0", label=f"base {data['rope']['base']:g}")
    axes[0].set_title("(a) real q·k against distance")
    axes[1].plot(d, curves["model"]["high"], lw=0.8, color="C3", label=f"high-frequency half ({len(data['high_pairs'])} pairs)")
    axes[1].plot(d, curves["model"]["low"], lw=0.8, color="C2", label=f"low-frequency half ({len(data['low_pairs'])} pairs)")
    axes[1].set_title("(b) the two halves of the rotary pairs")
    for i, (name, c) in enumerate(curves.items()):
        axes[2].plot(d, c["full"], lw=0.8, color=f"C{i}", label=name, alpha=0.9)
    axes[2].set_title(f"(c) raised base and scalings (factor {data['settings']['extend']:g}), no training")
    for ax in axes:
        ax.axvline(L, color="gray", ls="--", lw=1, label=f"trained length L={L}")
        ax.set_xlabel("relative distance d = m - n (tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("attention logit  scale · q̄·R(d)·k̄")
    fig.suptitle(f"{data['model']}: layer {layer}, mean over {who}, q/k from {data['text_tokens']} tokens of {data['text']}")
    fig.tight_layout()
    path = out_dir / f"probe_layer{layer}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report_section(model_dir: str | Path, out: str | Path, settings: ProbeSettings | None = None) -> str:
    """The ``posenc report --model MODEL_DIR`` section: the probe run into ``out`` (default
    settings: layer 0, all heads), a table of the curves at d = 0, L and the farthest
    distance, and the figures, as HTML (images embedded as base64)."""
    import base64
    import html

    r = probe(model_dir, out, settings, progress=False)
    data = r.data
    d = data["distances"]
    L = data["trained_length"]
    at = {"d = 0": 0, f"d = L = {L}": min(range(len(d)), key=lambda i: abs(d[i] - L)), f"d = {d[-1]}": len(d) - 1}
    rows = []
    for layer, entry in data["layers"].items():
        for name, c in entry["curves"].items():
            cells = "".join(f"<td>{c['full'][i]:.4g}</td>" for i in at.values())
            rows.append(f"<tr><td>{html.escape(layer)}</td><td>{html.escape(name)}</td>{cells}</tr>")
    head = "".join(f"<th>{html.escape(k)}</th>" for k in at)
    figs = "".join(
        f'<figure><img src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode("ascii")}" '
        f'alt="{html.escape(p.stem)}"><figcaption>{html.escape(p.name)}: mean over the chosen heads of '
        f"scale · q̄·R(d)·k̄ (see docs/hf.md)</figcaption></figure>"
        for p in r.figures
    )
    return (
        f"<h2>Checkpoint probe: {html.escape(data['model'])}</h2>"
        f"<p class='note'>model_type {html.escape(str(data['model_type']))}, trained length L = {L}, "
        f"RoPE base {data['rope']['base']:g} ({html.escape(data['rope']['scaling'])}), q/k from "
        f"{data['text_tokens']} tokens of {html.escape(data['text'])}; data in {html.escape(str(Path(out) / 'probe.json'))}.</p>"
        f'<table id="probe"><tr><th>layer</th><th>RoPE</th>{head}</tr>{"".join(rows)}</table>{figs}'
    )
