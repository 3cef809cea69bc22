"""M-RoPE: multimodal rotary position embedding (Wang et al. 2024, "Qwen2-VL: Enhancing
Vision-Language Model's Perception of the World at Any Resolution", §2.1; interleaved in
Qwen3-VL, Bai et al. 2025, "Qwen3-VL Technical Report"; VideoRoPE's frequency allocation, Wei et
al. 2025, "VideoRoPE: What Makes for Good Video Rotary Position Embedding?", arXiv 2502.05173).

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D); positions (B, T) or axes (3, B, T); r = rotary_dim,
P = r/2 rotated pairs.

Each token has three position ids, (time, height, width): text tokens the same id on all
three, an image's patches ``start + (i, y, x)``, a video's frames spaced in time by an
interval in Qwen2.5-VL (:func:`posenc.positions.multimodal_axes` builds them; VideoRoPE's
centred, diagonal layout: :func:`posenc.positions.video_rope_axes`). The P pairs
of RoPE's frequencies theta_j = base^(-2j/r) are split among the axes by ``mrope_section``
(s_t, s_h, s_w), s_t + s_h + s_w = P; pair j turns by
``pos[axis(j)] * theta_j``:

* chunked (Qwen2-VL, Qwen2.5-VL): pairs [0, s_t) take time, the next s_h height, the last
  s_w width (e.g. (16, 24, 24) for D = 128);
* interleaved (``mrope_interleaved=True``, Qwen3-VL): pair j takes height when j % 3 == 1 and
  j < 3 s_h, width when j % 3 == 2 and j < 3 s_w, time otherwise (e.g. (24, 20, 20)), so every
  axis has high and low frequencies;
* VideoRoPE (``video_rope=True``, its "low-frequency temporal allocation"): pair j takes height
  when j < s_h + s_w and j is even, width when j < s_h + s_w and j is odd, time on the last s_t
  pairs, the lowest frequencies (e.g. (16, 24, 24)); s_h = s_w. As SGLang's
  ``BailingMRotaryEmbedding`` (``rope_parameters`` ``{"mrope_section": [t, h, w], "video_rope":
  true}``) turns them: its Ernie 4.5 kernel ``_triton_ernie45_rope_qk_fused``
  (python/sglang/kernels/ops/attention/rotary_triton.py, commit 0d7ff71496) on the section
  reordered to (h, w, t), and vLLM's ``BailingMRotaryEmbedding.select_cos_sin``
  (vllm/model_executor/layers/rotary_embedding/bailing_mrope.py, commit 9c5b716395).

With equal axes (text only, or a sequence that carries no axes) every pair turns by
``pos * theta_j``: exactly :class:`~posenc.rotary.RotaryEmbedding`. Within one axis the
rotation is RoPE's, so q·k depends on the three differences of position only.

Everything else is RoPE's (this class is a :class:`RotaryEmbedding`): float64 angles, the
cos/sin table per axis, the scalings, the layouts, the rotation kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..config import check_int
from ..encoding import Dims
from ..literature import NORMS_PRESERVED, ROPE_FEATURES, SU
from ..positions import SequenceInfo
from ..registry import register
from .rope import RotaryConfig, RotaryEmbedding, TableRows

__all__ = ["MROPE_LAYOUTS", "MROPE_MODEL_TYPES", "MRopeConfig", "MRopeEmbedding", "default_mrope_section", "pairs_from_axes",
           "mrope_pair_axes", "mrope_from_hf"]

_QWEN2VL = "Wang et al. 2024 (Qwen2-VL, M-RoPE)"

AXES = ("time", "height", "width")
#: the ways pairs are assigned to axes: Qwen2-VL's chunks, Qwen3-VL's interleaving, VideoRoPE's.
MROPE_LAYOUTS = ("chunked", "interleaved", "video_rope")
#: transformers' model types whose text model uses M-RoPE (``posenc.rotary.from_hf`` reads them here).
MROPE_MODEL_TYPES = ("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_vl", "qwen3_vl_text")


def _layout(interleaved: bool, video_rope: bool) -> str:
    """The name in MROPE_LAYOUTS of the two config flags (at most one set: the config checks)."""
    return "video_rope" if video_rope else "interleaved" if interleaved else "chunked"


def default_mrope_section(pairs: int, interleaved: bool, video_rope: bool = False) -> tuple[int, int, int]:
    """Qwen2-VL's split (16, 24, 24) of 64 pairs, Qwen3-VL's (24, 20, 20) or VideoRoPE's (16, 24,
    24) (the paper's on Qwen2-VL, and Ming's (8, 12, 12) of 32 pairs), scaled to ``pairs``:
    chunked t = P // 4, h = (P - t) // 2; interleaved h = w = 5 P // 16; video_rope h = w =
    3 P // 8. Below 3 pairs an axis gets none (a tiny test model's head)."""
    check_int("pairs", pairs, minimum=1)
    if video_rope:
        h = w = 3 * pairs // 8
        return pairs - h - w, h, w
    if interleaved:
        h = w = 5 * pairs // 16
        return pairs - h - w, h, w
    t = pairs // 4
    h = (pairs - t) // 2
    return t, h, pairs - t - h


def mrope_pair_axes(section: tuple[int, int, int], interleaved: bool, video_rope: bool = False) -> Tensor:
    """The axis (0 time, 1 height, 2 width) each of the P = sum(section) pairs takes: (P,) int64."""
    pairs = sum(section)
    if video_rope:  # height and width alternate on the first s_h + s_w pairs, time on the rest
        j = torch.arange(pairs)
        spatial = 1 + j % 2  # 1 height (even j), 2 width (odd j)
        return torch.where(j < section[1] + section[2], spatial, 0)
    if not interleaved:
        return torch.repeat_interleave(torch.arange(3), torch.tensor(section))
    j = torch.arange(pairs)
    axis = torch.zeros(pairs, dtype=torch.long)
    axis[(j % 3 == 1) & (j < 3 * section[1])] = 1
    axis[(j % 3 == 2) & (j < 3 * section[2])] = 2
    return axis


def _check_video_rope_section(section: tuple[int, ...]) -> None:
    # SGLang asserts it ("Ernie4.5 layout assumes section_h == section_w") and vLLM raises: the
    # alternation gives height and width (s_h + s_w) / 2 pairs each, whatever the split.
    if section[1] != section[2]:
        raise ValueError(f"mrope_section's height and width entries must be equal with video_rope=True (the pairs "
                         f"alternate height, width), got {list(section)}")


def _check_section(section: tuple[int, int, int], pairs: int, interleaved: bool) -> None:
    """Raise ``ValueError`` unless ``section`` splits ``pairs`` pairs (as transformers reads it)."""
    if sum(section) != pairs:
        raise ValueError(
            f"mrope_section must sum to the rotated pairs rotary_dim / 2 = {pairs}, got {list(section)} "
            f"(sum {sum(section)})"
        )
    if interleaved and (3 * section[1] > pairs + 1 or 3 * section[2] > pairs):
        raise ValueError(
            f"mrope_section {list(section)} does not fit {pairs} interleaved pairs: height takes pairs 1, 4, .. "
            f"< 3 * {section[1]} and width pairs 2, 5, .. < 3 * {section[2]}, all < {pairs}"
        )


@dataclass(init=False, eq=False)
class MRopeConfig(RotaryConfig):
    """Config of :class:`MRopeEmbedding`: :class:`~posenc.rotary.RotaryConfig`'s fields (base,
    rotary_dim, layout, scaling and its parameters, kernel) and

    Attributes:
        mrope_section: pairs (time, height, width), three ints >= 0 summing to rotary_dim / 2
            (checked when the module knows rotary_dim); None = the layout's proportions
            (:func:`default_mrope_section`: (16, 24, 24) at rotary_dim 128; (24, 20, 20)
            interleaved; (16, 24, 24) video_rope).
        mrope_interleaved: Qwen3-VL's interleaved pairs instead of Qwen2-VL's chunks.
        video_rope: VideoRoPE's pairs instead (height and width alternating on the highest
            frequencies, time on the lowest; height and width entries equal), the key of the
            same name in SGLang's rope parameters. At most one of mrope_interleaved, video_rope.
    """

    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    video_rope: bool = False

    def validate(self) -> None:
        super().validate()
        if self.mrope_interleaved and self.video_rope:
            raise ValueError("mrope_interleaved and video_rope are two layouts of the pairs: set at most one, "
                             "got both True")
        sec = self.mrope_section
        if sec is not None:
            if len(sec) != 3:
                raise ValueError(f"mrope_section must have 3 entries (time, height, width), got {list(sec)}")
            for name, n in zip(AXES, sec):
                check_int(f"mrope_section's {name} entry", n, minimum=0)
            if self.video_rope:
                _check_video_rope_section(sec)

    @property
    def mrope_layout(self) -> str:
        """The pairs' layout, one of :data:`MROPE_LAYOUTS`."""
        return _layout(self.mrope_interleaved, self.video_rope)


@register(
    "mrope",
    family="rotary",
    summary="multimodal RoPE: time/height/width position axes on sections of the pairs (chunked, interleaved "
            "or VideoRoPE's)",
    paper="Wang et al. 2024, Qwen2-VL (M-RoPE); Bai et al. 2025, Qwen3-VL (interleaved); Wei et al. 2025, "
          "VideoRoPE",
    claims={
        "absolute": (True, _QWEN2VL + ": RoPE's rotation per position on text"),
        "relative": (True, _QWEN2VL + ": equal axes on text give RoPE, eq. 16 of " + SU),
        "linear_map": (True, SU + ": R_{p+k} = R_k R_p, per axis"),
        "bounded": (True, NORMS_PRESERVED),
        "decay": (True, "RoPE on text: " + SU + ", §3.4.3"),
        "extrapolation": (True, _QWEN2VL + ": defined at every position"),
        "linear_attention": (True, ROPE_FEATURES),
    },
)
class MRopeEmbedding(RotaryEmbedding):
    """M-RoPE as a ``rotate`` hook; see the module docstring. Positions are (3, B, T) axes
    (``SequenceInfo.axes``, e.g. ``SequenceInfo(pos, axes=multimodal_axes(blocks)[:, None])``)
    or (B, T), which is text: every axis at the position.

    >>> mrope = posenc.build("mrope", d_model=1536, num_heads=12, base=1e6)  # Qwen2-VL-2B's heads
    >>> mrope.section
    (16, 24, 24)
    """

    Config = MRopeConfig
    position_axes = 3  # time, height, width

    def __init__(self, config: MRopeConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        pairs = self.rotary_dim // 2
        flags = config.mrope_interleaved, config.video_rope
        section = default_mrope_section(pairs, *flags) if config.mrope_section is None else tuple(config.mrope_section)
        _check_section(section, pairs, config.mrope_interleaved)  # video_rope's h = w: checked by the config
        self.section: tuple[int, int, int] = section
        self._pair_axis = mrope_pair_axes(section, *flags)  # (P,) CPU, not a buffer

    def position_ids(self, seq: SequenceInfo) -> Tensor:
        """``seq.axes`` (3, B, T) when given, else ``seq.positions`` (B, T) (text)."""
        if seq.axes is None:
            return seq.positions
        if seq.axes.shape[0] != 3:
            raise ValueError(f"mrope reads 3 position axes (time, height, width), but seq.axes has {seq.axes.shape[0]}")
        return seq.axes

    def rows(self, positions: Tensor, seq_len: int | Tensor | None = None) -> TableRows:
        """cos and sin (B|1, T, r/2) float32 (:class:`~posenc.rotary.rope.TableRows`) at (B, T) positions (RoPE's) or (3, B, T) axes:
        pair j's from axis(j)'s table. ``seq_len`` (default: max over all axes + 1) selects the
        frequencies of length-dependent scalings, one length for every axis."""
        if positions.dim() != 3:
            return super().rows(positions, seq_len)
        if positions.shape[0] != 3:
            raise ValueError(f"mrope positions must have shape (B, T) or (3, B, T), got {tuple(positions.shape)}")
        if seq_len is None and positions.numel():
            seq_len = self.current_length(positions, positions)
        per_axis = [super(MRopeEmbedding, self).rows(p, seq_len).columns for p in positions]  # 3 x 2 x (B|1, T, P)
        return TableRows(pairs_from_axes(per_axis, self._pair_axis))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mrope_section={list(self.section)} ({self.config.mrope_layout})"


def pairs_from_axes(per_axis: list[tuple[Tensor, Tensor]], pair_axis: Tensor) -> tuple[Tensor, Tensor]:
    """cos and sin (B|1, T, P) with pair j read from axis ``pair_axis[j]``'s tables: ``per_axis``
    holds RoPE's (cos, sin) at each axis's positions, ``pair_axis`` (P,) the axis of each pair
    (M-RoPE's sections and layouts, XD-RoPE's four sections)."""
    axis = pair_axis.to(per_axis[0][0].device)
    cos, sin = per_axis[0]
    for a in range(1, len(per_axis)):
        cos = torch.where(axis == a, per_axis[a][0], cos)  # (B|1, T, P)
        sin = torch.where(axis == a, per_axis[a][1], sin)
    return cos, sin


def mrope_from_hf(config: Any) -> MRopeEmbedding:
    # Reached from posenc.rotary.from_hf for the model types of MROPE_MODEL_TYPES.
    """An :class:`MRopeEmbedding` from a Qwen2-VL / Qwen2.5-VL / Qwen3-VL config, or a Bailing
    (Ling / Ming) one with VideoRoPE (a transformers config object or its config.json dict; the
    text model's entries: ``text_config``, or Bailing's ``llm_config``, when present). Reads
    ``rope_parameters`` (or the older ``rope_scaling``): ``rope_theta``, ``mrope_section``
    (absent: the outer config's, as Bailing keeps it, else the family's, as transformers),
    ``mrope_interleaved`` (Qwen3-VL's are interleaved even without the key), ``video_rope`` (as
    SGLang's ``get_rope`` reads it; a rope type "video_rope", Ming's config.json spelling, too);
    ``partial_rotary_factor`` (Bailing's 0.5) sets rotary_dim. Rope types other than "default"
    are refused: the Qwen families use none (SGLang also runs VideoRoPE with YaRN, which this
    reader does not take)."""
    cfg = config if isinstance(config, dict) else config.to_dict()
    model_type = cfg.get("model_type")
    text = cfg.get("text_config") or cfg.get("llm_config") or cfg
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type not in ("default", "mrope", "video_rope"):  # transformers' older configs spell it "mrope"
        raise ValueError(f"rope_type must be 'default' for an M-RoPE model, got {rope_type!r}")
    video_rope = bool(params.get("video_rope", rope_type == "video_rope"))
    qwen3 = str(model_type).startswith("qwen3_vl")
    # transformers' rotary embeddings default a missing mrope_section to their family's.
    default = (24, 20, 20) if qwen3 else (16, 24, 24) if model_type in MROPE_MODEL_TYPES else None
    section = params.get("mrope_section", cfg.get("mrope_section", default))
    if section is None:
        raise ValueError(f"the config has no mrope_section in its rope parameters ({sorted(params)}) and no "
                         f"model_type of {', '.join(MROPE_MODEL_TYPES)} to take the default from")
    base = params.get("rope_theta", text.get("rope_theta", 10000.0))
    interleaved = bool(params.get("mrope_interleaved", qwen3 and not video_rope))
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    partial = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
    rotary = {} if partial in (None, 1, 1.0) else {"rotary_dim": int(head_dim * partial)}  # as get_rope truncates it
    from ..registry import build

    return build(
        "mrope", d_model=text["hidden_size"], num_heads=heads, head_dim=head_dim, base=float(base),
        mrope_section=list(section), mrope_interleaved=interleaved, video_rope=video_rope, **rotary,
    )
