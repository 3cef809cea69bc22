"""``posenc probe``: the settings, and the run that ties capture, curves and rendering together.

:func:`probe` reads the checkpoint's config (a RoPE :func:`posenc.rotary.from_hf` understands,
the trained length L by :func:`posenc.hf.checkpoint.trained_length`), takes the ``--out``
lock that ``posenc bench`` takes (one writer per folder), captures q and k
(:mod:`.capture`), computes the curves (:mod:`.curves`) and the claims' verdicts
(:mod:`.verdicts`) and writes ``probe.json``, ``probe_layer<L>.png`` and, for several layers,
``probe_layers.png`` (:mod:`.render`).

Per-layer-type RoPE (Gemma 3: sliding layers base 10000, global layers base 1e6) is read per
layer (:func:`posenc.rotary.hf_config.layer_ropes`); a sliding-window layer's trained distance
is its window (it never attends farther), the others' is L. A NoPE/RoPE hybrid's NoPE layers
(SmolLM3, Llama 4, Cohere2) are not probed: by default the first RoPE layer of each type is,
and ``--layer`` naming a NoPE layer is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...rotary import hf_config
from ..checkpoint import DTYPES, check_fits, load_model, load_tokenizer, open_checkpoint, trained_length
from ..models import MODELS
from .capture import capture_qk, layer_taps, probe_text_ids
from .curves import distances, frequency_halves, probe_scalings, score_curves, variant_ropes
from .render import html_section, plot_layer, plot_layers
from .verdicts import dense_curve, dense_curves, judge, verdict_line, window_grid, window_means

__all__ = ["PROBE_FORMAT", "ProbeResult", "ProbeSettings", "default_layers", "layer_rope", "layer_trained_distance",
           "probe", "report_section", "summary_lines"]

PROBE_FORMAT = "posenc-probe-2"
_MAX_POINTS = 1 << 16


@dataclass(frozen=True)
class ProbeSettings:
    """What a probe computes (stored in probe.json).

    Attributes:
        layers: decoder layers to probe (0-based); None: the first layer of each layer type
            (:func:`default_layers`: layer 0, and Gemma 3's first global layer).
        heads: query heads averaged in the figure; None = all.
        tokens: tokens of text the model reads (capped at the trained length L, so q and k come
            from positions the model was trained at).
        extend: curves run to ``extend * L`` (L the trained length; a sliding layer's to
            ``extend * window``); also the scalings' factor. The verdicts read 0..extend * Ld.
        base_factor: the "base raised" curve uses ``base * base_factor``.
        points: at most this many distances, evenly spaced from 0 (every distance when fewer).
        scalings: training-free scalings drawn (a subset of :func:`~.curves.probe_scalings`);
            None: all of them, stored as their list.
        dtype: the model's dtype while it reads the text (q and k are analysed in float32).
    """

    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    tokens: int = 512
    extend: float = 8.0
    base_factor: float = 16.0
    points: int = 2048
    scalings: tuple[str, ...] | None = None
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        from ...config import check_choice, check_int, check_positive

        if self.layers is not None and not self.layers:
            raise ValueError("layers must name at least one layer or be None (one per layer type), got none")
        for layer in self.layers or ():
            check_int("layer", layer, minimum=0)
        for h in self.heads or ():
            check_int("head", h, minimum=0)
        if self.heads is not None and not self.heads:
            raise ValueError("heads must name at least one head or be None (all), got none")
        check_int("tokens", self.tokens, minimum=2)
        check_positive("extend", self.extend)
        if self.extend < 1.25:
            raise ValueError(f"extend must be >= 1.25 (curves reach extend * the trained length; the verdicts "
                             f"compare windows of L/8 past it), got {self.extend}")
        check_positive("base_factor", self.base_factor)
        check_int("points", self.points, minimum=2, maximum=_MAX_POINTS)
        offered = probe_scalings()
        if self.scalings is None:
            object.__setattr__(self, "scalings", offered)
        for s in self.scalings:
            check_choice("scalings", s, offered)
        check_choice("dtype", self.dtype, tuple(DTYPES))


def default_layers(config: dict[str, Any]) -> tuple[int, ...]:
    """The first rotating layer of each layer type of ``config["layer_types"]`` (Gemma 3: (0, 5);
    Llama 4: its first chunked layer, its full layers being NoPE); (0,) without layer types.
    A NoPE/RoPE hybrid's NoPE layers are passed over: the probe measures RoPE."""
    types = config.get("layer_types") or []
    first: dict[Any, int] = {}
    for i, rope in enumerate(hf_config.layer_ropes(config)):
        if rope is not None:
            first.setdefault(types[i] if i < len(types) else None, i)
    return tuple(sorted(first.values())) or (0,)


def layer_rope(config: dict[str, Any], layer: int) -> Any:
    """The RoPE of ``layer``, as :func:`posenc.rotary.hf_config.layer_ropes` reads it (Gemma 3:
    its layer type's own). A layer that does not rotate (SmolLM3's and Llama 4's
    ``no_rope_layers``, Cohere2's full layers) is refused rather than probed as NoPE: its score
    does not depend on the distance through any RoPE, and each of the probe's claims is about
    how RoPE shapes that dependence."""
    ropes = hf_config.layer_ropes(config)
    rope = ropes[layer]
    if rope is None:
        flags = config.get("no_rope_layers")
        types = config.get("layer_types") or []
        why = (f"no_rope_layers[{layer}] is 0" if isinstance(flags, list) and layer < len(flags)
               else f"its {types[layer]!r} layers do not rotate" if layer < len(types) else "its config")
        rotating = [i for i, r in enumerate(ropes) if r is not None]
        raise ValueError(f"--layer {layer} of model_type {config.get('model_type')!r} does not rotate (NoPE: {why}); "
                         f"the probe measures RoPE's score against distance: probe one of its RoPE layers "
                         f"{_spans(rotating)}")
    return rope


def _spans(layers: list[int]) -> str:
    """[0, 1, 2, 4, 5, 6] -> '0-2, 4-6'."""
    out, i = [], 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(str(layers[i]) if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ", ".join(out) or "(none)"


def layer_trained_distance(config: dict[str, Any], layer: int, L: int) -> int:
    """The farthest distance ``layer`` attended to in training: the window of a
    ``sliding_attention`` layer, the chunk of a ``chunked_attention`` one (Llama 4: a token
    sees only its own chunk of ``attention_chunk_size`` tokens), when smaller than L; else the
    trained length L."""
    types = config.get("layer_types") or []
    kind = types[layer] if layer < len(types) else None
    window = {"sliding_attention": config.get("sliding_window"),
              "chunked_attention": config.get("attention_chunk_size")}.get(kind)
    if isinstance(window, int) and 0 < window < L:
        return window
    return L


def summary_lines(data: dict[str, Any]) -> list[str]:
    """The printed summary: per layer, its RoPE and the three verdicts with their numbers."""
    out = []
    for layer, entry in data["layers"].items():
        r = entry["rope"]
        out.append(f"layer {layer} ({entry['layer_type'] or 'one RoPE'}, base {r['base']:g}, trained distance "
                   f"Ld = {entry['trained_distance']}; windows of {entry['verdicts']['rise']['window']} tokens, "
                   f"mean of {len(data['heads'])} heads):")
        out += [f"  {verdict_line(name, v)}" for name, v in entry["verdicts"].items()]
    return out


@dataclass
class ProbeResult:
    """probe.json's content (``data``) and the PNGs written."""

    data: dict[str, Any]
    figures: list[Path] = field(default_factory=list)


@contextlib.contextmanager
def _locked_out(out: str | Path):
    """``out`` created and held by bench's ``--out`` lock for the block: a second probe (or
    bench) writing there is refused instead of mixing its files with this one's."""
    from ...files import OutDirLock

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {str(path)!r} must be a directory, and is a file")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(OutDirLock(path))
        except OSError as e:  # a read-only parent, a full disk
            raise ValueError(f"--out {str(path)!r} cannot be written: {e.strerror or e}") from None
        yield path


def _display_name(folder: str) -> str:
    """A named model's cache folder (``<name>-<sha256[:12]>-v<format>``, posenc.hf.models) by its
    name; any other folder by its own name."""
    named = re.fullmatch(r"(.+)-[0-9a-f]{12}-v\d+", folder)
    return named.group(1) if named and named.group(1) in MODELS else folder


def probe(
    model_dir: str | Path, out: str | Path, settings: ProbeSettings | None = None, *,
    text: str | Path | None = None, progress: bool = True, model: Any = None, device: str = "cpu",
) -> ProbeResult:
    """Run the probe (see :mod:`posenc.hf.probe`) and write ``out/probe.json`` and
    ``out/probe_layer<L>.png``, holding ``out``'s lock meanwhile.

    ``model``: an already loaded transformers model of ``model_dir`` (tests); else it is
    loaded in ``settings.dtype`` on ``device`` after the memory check (q and k come back to the CPU).
    """
    from ...files import write_json
    from ...progress import bar as progress_bar

    s = ProbeSettings() if settings is None else settings
    ckpt = open_checkpoint(model_dir)
    layers = default_layers(ckpt.config) if s.layers is None else s.layers
    n_layers = ckpt.config.get("num_hidden_layers", ckpt.config.get("n_layer"))  # n_layer: GPT-J
    for layer in layers:
        if isinstance(n_layers, int) and layer >= n_layers:
            raise ValueError(f"--layer must be in [0, {n_layers - 1}] (the model has {n_layers} layers), got {layer}")
    # before loading: a config posenc cannot read fails fast
    layer_ropes = {layer: layer_rope(ckpt.config, layer) for layer in layers}
    rope = layer_ropes[layers[0]]
    if model is None:
        check_fits(ckpt, DTYPES[s.dtype])  # before anything is written
    L = trained_length(ckpt.config)
    trained = {layer: layer_trained_distance(ckpt.config, layer, L) for layer in layers}
    with _locked_out(out) as out_dir:
        n_heads = rope.dims.num_heads
        heads = tuple(range(n_heads)) if s.heads is None else s.heads
        for h in heads:
            if h >= n_heads:
                raise ValueError(f"--heads must be in [0, {n_heads - 1}] (the model has {n_heads} query heads), got {h}")
        tokenizer = load_tokenizer(ckpt)
        # at most L tokens: q and k are read where the model was trained (the curves then go past L)
        ids = probe_text_ids(tokenizer, text, min(s.tokens, L))
        if model is None:
            model = load_model(ckpt, DTYPES[s.dtype], device=device, progress=progress)
        taps = layer_taps(model)
        captured = capture_qk(model, torch.tensor([ids], device=next(model.parameters()).device), layers)
        captured = {layer: (q.cpu(), k.cpu()) for layer, (q, k) in captured.items()}

        # one grid for every layer: to extend * L, and as many points again to extend * Ld
        # for a layer whose trained distance Ld is shorter (a sliding window)
        d = torch.cat([distances(math.ceil(s.extend * ld), s.points) for ld in sorted(set(trained.values()) | {L})])
        d = d.unique()
        sel = torch.tensor(heads)
        types = ckpt.config.get("layer_types") or []
        data: dict[str, Any] = dict(
            format=PROBE_FORMAT, model=_display_name(ckpt.name), model_type=ckpt.config.get("model_type"),
            trained_length=L,
            settings={**dataclasses.asdict(s), "layers": list(layers)}, text="stdlib" if text is None else str(text),
            text_tokens=len(ids), tokenizer=tokenizer.kind, heads=list(heads), distances=d.tolist(), layers={},
        )
        all_ropes = {layer: variant_ropes(layer_ropes[layer], trained[layer], s.extend, s.base_factor, s.scalings)
                     for layer in layers}
        bar = progress_bar(sum(len(r) + 1 for r in all_ropes.values()), "probe", unit="curve", enabled=progress)
        for layer in layers:
            q, k = captured[layer]
            scale = taps[layer].scale
            ropes, lr = all_ropes[layer], layer_ropes[layer]
            halves = frequency_halves(lr)
            curves = {}
            for name, vr in ropes.items():
                c = score_curves(q, k, vr, d, scale, halves)
                curves[name] = {kind: c[kind][sel].mean(0).tolist() for kind in ("full", "high", "low", "unrotated")}
                bar.update()
            ld = trained[layer]
            dense = dense_curves(q, k, lr, ropes[f"base x{s.base_factor:g}"], scale, sel,
                                 window_grid(ld, s.extend)[2], halves)
            verdicts = judge(dense, ld, s.extend, s.base_factor)
            w, step, _ = window_grid(ld, s.extend)
            starts = window_means(dense["full"], w, step)[0]
            # the window means the verdicts read (drawn over the curves), at the windows' centres
            windows = dict(width=w, centres=(starts + (w - 1) / 2).tolist(),
                           **{kind: window_means(c, w, step)[1].tolist() for kind, c in dense.items()})
            # every variant's full curve as window means too (the HTML table's numbers)
            last = window_grid(ld, s.extend)[2]
            windows["variants"] = {
                name: window_means(dense_curve(q, k, vr, scale, sel, last, halves)["full"], w, step)[1].tolist()
                for name, vr in ropes.items()
            }
            bar.update()
            data["layers"][str(layer)] = dict(
                scale=scale, layer_type=types[layer] if layer < len(types) else None, trained_distance=ld,
                rope=dict(base=lr.config.base, rotary_dim=lr.rotary_dim, layout=lr.config.layout,
                          scaling=lr.config.scaling, **{k: v for k, v in lr.config.scaling_params().items()}),
                high_pairs=halves[0].tolist(), low_pairs=halves[1].tolist(), verdicts=verdicts, windows=windows,
                curves=curves,
            )
        bar.close()
        write_json(out_dir / "probe.json", data)
        figs = [plot_layer(data, layer, out_dir) for layer in layers]
        if len(layers) > 1:
            figs.append(plot_layers(data, out_dir))
    return ProbeResult(data, figs)


def report_section(model_dir: str | Path, out: str | Path, settings: ProbeSettings | None = None) -> str:
    """The ``posenc report --model MODEL_DIR`` section: the probe run into ``out`` (default
    settings: the first layer of each layer type, all heads), rendered as HTML by :func:`.render.html_section`."""
    result = probe(model_dir, out, settings, progress=False)
    return html_section(result.data, result.figures, Path(out) / "probe.json")
