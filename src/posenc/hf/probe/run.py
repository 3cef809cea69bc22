"""``posenc probe``: the settings, and the run that ties capture, curves and rendering together.

:func:`probe` reads the checkpoint's config (a RoPE :func:`posenc.rotary.from_hf` understands,
the trained length L by :func:`posenc.hf.checkpoint.trained_length`), takes the ``--out``
lock that ``posenc bench`` takes (one writer per folder), captures q and k
(:mod:`.capture`), computes the curves (:mod:`.curves`) and writes ``probe.json`` and
``probe_layer<L>.png`` (:mod:`.render`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...rotary import from_hf
from ..checkpoint import DTYPES, check_fits, load_model, load_tokenizer, open_checkpoint, trained_length
from .capture import capture_qk, layer_taps, probe_text_ids
from .curves import distances, frequency_halves, probe_scalings, score_curves, variant_ropes
from .render import html_section, plot_layer

__all__ = ["PROBE_FORMAT", "ProbeResult", "ProbeSettings", "probe", "report_section"]

PROBE_FORMAT = "posenc-probe-1"
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
        scalings: training-free scalings drawn (a subset of :func:`~.curves.probe_scalings`);
            None: all of them, stored as their list.
        dtype: the model's dtype while it reads the text (q and k are analysed in float32).
    """

    layers: tuple[int, ...] = (0,)
    heads: tuple[int, ...] | None = None
    tokens: int = 512
    extend: float = 4.0
    base_factor: float = 16.0
    points: int = 2048
    scalings: tuple[str, ...] | None = None
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        from ...config import check_choice, check_int, check_positive

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
        offered = probe_scalings()
        if self.scalings is None:
            object.__setattr__(self, "scalings", offered)
        for s in self.scalings:
            check_choice("scalings", s, offered)
        check_choice("dtype", self.dtype, tuple(DTYPES))


@dataclass
class ProbeResult:
    """probe.json's content (``data``) and the PNGs written."""

    data: dict[str, Any]
    figures: list[Path] = field(default_factory=list)


@contextlib.contextmanager
def _locked_out(out: str | Path):
    """``out`` created and held by bench's ``--out`` lock for the block: a second probe (or
    bench) writing there is refused instead of mixing its files with this one's."""
    from ...bench.files import OutDirLock

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {str(path)!r} must be a directory, and is a file")
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(OutDirLock(path))
        except OSError as e:  # a read-only parent, a full disk
            raise ValueError(f"--out {str(path)!r} cannot be written: {e.strerror or e}") from None
        yield path


def probe(
    model_dir: str | Path, out: str | Path, settings: ProbeSettings | None = None, *,
    text: str | Path | None = None, progress: bool = True, model: Any = None,
) -> ProbeResult:
    """Run the probe (see :mod:`posenc.hf.probe`) and write ``out/probe.json`` and
    ``out/probe_layer<L>.png``, holding ``out``'s lock meanwhile.

    ``model``: an already loaded transformers model of ``model_dir`` (tests); else it is
    loaded in ``settings.dtype`` after the memory check.
    """
    from ...bench.files import write_json
    from ...progress import bar as progress_bar

    s = ProbeSettings() if settings is None else settings
    ckpt = open_checkpoint(model_dir)
    rope = from_hf(ckpt.config)  # before loading: a config posenc cannot read fails fast
    if model is None:
        check_fits(ckpt, DTYPES[s.dtype])  # before anything is written
    L = trained_length(ckpt.config)
    with _locked_out(out) as out_dir:
        n_heads = rope.dims.num_heads
        heads = tuple(range(n_heads)) if s.heads is None else s.heads
        for h in heads:
            if h >= n_heads:
                raise ValueError(f"--heads must be in [0, {n_heads - 1}] (the model has {n_heads} query heads), got {h}")
        n_layers = ckpt.config.get("num_hidden_layers", ckpt.config.get("n_layer"))  # n_layer: GPT-J
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

        d = distances(math.ceil(s.extend * L), s.points)
        ropes = variant_ropes(rope, L, s.extend, s.base_factor, s.scalings)
        halves = frequency_halves(rope)
        sel = torch.tensor(heads)
        data: dict[str, Any] = dict(
            format=PROBE_FORMAT, model=ckpt.name, model_type=ckpt.config.get("model_type"), trained_length=L,
            rope=dict(base=rope.config.base, rotary_dim=rope.rotary_dim, layout=rope.config.layout,
                      scaling=rope.config.scaling, **{k: v for k, v in rope.config.scaling_params().items()}),
            settings=dataclasses.asdict(s), text="stdlib" if text is None else str(text), text_tokens=len(ids),
            tokenizer=tokenizer.kind, heads=list(heads), distances=d.tolist(),
            high_pairs=halves[0].tolist(), low_pairs=halves[1].tolist(), layers={},
        )
        bar = progress_bar(len(s.layers) * len(ropes), "probe", unit="curve", enabled=progress)
        for layer in s.layers:
            q, k = captured[layer]
            scale = taps[layer].scale
            curves = {}
            for name, vr in ropes.items():
                c = score_curves(q, k, vr, d, scale, halves)
                curves[name] = {kind: c[kind][sel].mean(0).tolist() for kind in ("full", "high", "low", "unrotated")}
                bar.update()
            data["layers"][str(layer)] = dict(scale=scale, curves=curves)
        bar.close()
        write_json(out_dir / "probe.json", data)
        figs = [plot_layer(data, layer, out_dir) for layer in s.layers]
    return ProbeResult(data, figs)


def report_section(model_dir: str | Path, out: str | Path, settings: ProbeSettings | None = None) -> str:
    """The ``posenc report --model MODEL_DIR`` section: the probe run into ``out`` (default
    settings: layer 0, all heads), rendered as HTML by :func:`.render.html_section`."""
    result = probe(model_dir, out, settings, progress=False)
    return html_section(result.data, result.figures, Path(out) / "probe.json")
