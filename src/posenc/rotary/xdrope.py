"""XD-RoPE: RoPE on four position axes, HunYuan-VL's (Tencent HunyuanOCR / HunYuan-VL, 2025;
``"rope_scaling": {"type": "xdrope", "xdrope_section": [16, 16, 16, 16], "alpha": ...}``).

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D); positions (B, T) or axes (A, B, T), A = 4
(position, width, height, image) or 3 (width, height, image); r = rotary_dim, P = r/2 pairs.

Each token has A position ids (:func:`posenc.positions.xdrope_axes` builds them: the token's
index on every axis, an image's grid tokens at (index, column, row, image ordinal)). The P pairs
of RoPE's frequencies theta_j = base^(-2j/r) are split in order by ``xdrope_section`` (s_0, ..,
s_{A-1}), summing to P: pairs [0, s_0) turn by axis 0's id, the next s_1 by axis 1's, and so
on; pair j turns by ``pos[axis(j)] * theta_j``, its two channels (j and j + P, the half layout)
by the same angle. This is vLLM's ``XDRotaryEmbedding.forward_native``
(vllm/model_executor/layers/rotary_embedding/xdrope.py, commit b91ee1b47c): the cos and sin
halves of its ``cos_sin_cache`` (P columns each) split by the section, chunk i from axis i's
row, then ``is_neox_style`` rotation. Its frequencies are ``DynamicNTKAlphaRotaryEmbedding``'s,
posenc's ``ntk_alpha`` scaling (base * alpha^(r/(r-2))).

transformers' ``apply_multimodal_rotary_pos_emb`` for HunYuan-VL (modeling_hunyuan_vl.py)
computes something else on image tokens: it splits the full-width (D) cos / sin by the doubled
sections, so with (16, 16, 16, 16) at D = 128 channel j of pair j < 32 takes axis 0 and its
partner channel j + 64 axis 2 (pairs 32 .. 63: axes 1 and 3). The two channels of a pair then
turn by different angles, which is not a rotation; this class does not reproduce it. With equal
axes (text, and every token outside an image grid) both are RoPE, bit for bit.

Within one axis the rotation is RoPE's, so q·k depends on the A differences of position only.
Everything else is :class:`RotaryEmbedding`'s: float64 angles, the cos/sin tables, the
scalings, the layouts, the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..config import check_int
from ..encoding import Dims
from ..literature import NORMS_PRESERVED, ROPE_FEATURES, SU
from ..multimodal_positions import XDROPE_AXES
from ..positions import SequenceInfo
from ..registry import register
from .mrope import pairs_from_axes
from .rope import RotaryConfig, RotaryEmbedding, TableRows

__all__ = ["XDROPE_MODEL_TYPES", "XDRopeConfig", "XDRopeEmbedding", "default_xdrope_section", "xdrope_pair_axes",
           "xdrope_from_hf"]

_HUNYUAN = "HunYuan-VL (Tencent 2025, XD-RoPE)"
#: transformers' model types whose text model uses XD-RoPE (``posenc.rotary.from_hf`` reads them here).
XDROPE_MODEL_TYPES = ("hunyuan_vl",)


def default_xdrope_section(pairs: int, num_axes: int = 4) -> tuple[int, ...]:
    """HunYuan-VL's equal split ((16, 16, 16, 16) of 64 pairs) scaled to ``pairs``: P // A
    each, the first P % A axes one more."""
    check_int("pairs", pairs, minimum=1)
    check_int("num_axes", num_axes, minimum=3, maximum=4)
    return tuple(pairs // num_axes + (i < pairs % num_axes) for i in range(num_axes))


def xdrope_pair_axes(section: tuple[int, ...]) -> Tensor:
    """The axis (an index into the rows of :func:`~posenc.positions.xdrope_axes`) each of the
    P = sum(section) pairs takes, in order by section: (P,) int64."""
    return torch.repeat_interleave(torch.arange(len(section)), torch.tensor(section, dtype=torch.long))


@dataclass(init=False, eq=False)
class XDRopeConfig(RotaryConfig):
    """Config of :class:`XDRopeEmbedding`: :class:`~posenc.rotary.RotaryConfig`'s fields (base,
    rotary_dim, layout, scaling and its parameters, e.g. ``scaling="ntk_alpha", alpha=1000.0``
    as HunYuan-VL's ``alpha``) and

    Attributes:
        xdrope_section: pairs per axis, 4 ints >= 0 (position, width, height, image) or 3
            (width, height, image), summing to rotary_dim / 2 (checked when the module knows
            rotary_dim); None = 4 equal parts (:func:`default_xdrope_section`: (16, 16, 16, 16)
            at rotary_dim 128).
    """

    xdrope_section: tuple[int, ...] | None = None

    def validate(self) -> None:
        super().validate()
        sec = self.xdrope_section
        if sec is not None:
            if len(sec) not in XDROPE_AXES:
                raise ValueError(f"xdrope_section must have 4 entries (position, width, height, image) or 3 (width, "
                                 f"height, image), got {list(sec)}")
            for name, n in zip(XDROPE_AXES[len(sec)], sec):
                check_int(f"xdrope_section's {name} entry", n, minimum=0)


@register(
    "xdrope",
    family="rotary",
    summary="XD-RoPE (HunYuan-VL): position/width/height/image axes on consecutive sections of the pairs",
    paper="Tencent Hunyuan 2025, HunYuan-VL / HunyuanOCR (xdrope)",
    claims={
        "absolute": (True, _HUNYUAN + ": RoPE's rotation per position on text"),
        "relative": (True, _HUNYUAN + ": equal axes on text give RoPE, eq. 16 of " + SU),
        "linear_map": (True, SU + ": R_{p+k} = R_k R_p, per axis"),
        "bounded": (True, NORMS_PRESERVED),
        "decay": (True, "RoPE on text: " + SU + ", §3.4.3"),
        "extrapolation": (True, _HUNYUAN + ": defined at every position"),
        "linear_attention": (True, ROPE_FEATURES),
    },
)
class XDRopeEmbedding(RotaryEmbedding):
    """XD-RoPE as a ``rotate`` hook; see the module docstring. Positions are (A, B, T) axes
    (``SequenceInfo(pos, axes=xdrope_axes(blocks)[:, None])``) or (B, T), which is text: every
    axis at the position.

    >>> xd = posenc.build("xdrope", d_model=1024, num_heads=8, scaling="ntk_alpha", alpha=1000.0)
    >>> xd.section
    (16, 16, 16, 16)
    """

    Config = XDRopeConfig
    position_axes = 4  # position, width, height, image; 3 with a 3-item section (num_axes)

    def __init__(self, config: XDRopeConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        pairs = self.rotary_dim // 2
        section = default_xdrope_section(pairs) if config.xdrope_section is None else tuple(config.xdrope_section)
        if sum(section) != pairs:
            raise ValueError(f"xdrope_section must sum to the rotated pairs rotary_dim / 2 = {pairs}, got "
                             f"{list(section)} (sum {sum(section)})")
        self.section: tuple[int, ...] = section
        self._pair_axis = xdrope_pair_axes(section)  # (P,) CPU, not a buffer

    @property
    def num_axes(self) -> int:
        """A, the position axes the section names (4 or 3)."""
        return len(self.section)

    def position_ids(self, seq: SequenceInfo) -> Tensor:
        """``seq.axes`` (A, B, T) when given, else ``seq.positions`` (B, T) (text)."""
        if seq.axes is None:
            return seq.positions
        if seq.axes.shape[0] != self.num_axes:
            raise ValueError(f"xdrope reads {self.num_axes} position axes ({', '.join(XDROPE_AXES[self.num_axes])}), "
                             f"but seq.axes has {seq.axes.shape[0]}")
        return seq.axes

    def rows(self, positions: Tensor, seq_len: int | Tensor | None = None) -> TableRows:
        """cos and sin (B|1, T, r/2) float32 (:class:`~posenc.rotary.rope.TableRows`) at (B, T) positions (RoPE's) or (A, B, T) axes:
        pair j's from axis(j)'s table. ``seq_len`` (default: max over all axes + 1) selects the
        frequencies of length-dependent scalings, one length for every axis."""
        if positions.dim() != 3:
            return super().rows(positions, seq_len)
        if positions.shape[0] != self.num_axes:
            raise ValueError(f"xdrope positions must have shape (B, T) or ({self.num_axes}, B, T), got "
                             f"{tuple(positions.shape)}")
        if seq_len is None and positions.numel():
            seq_len = self.current_length(positions, positions)
        per_axis = [super(XDRopeEmbedding, self).rows(p, seq_len).columns for p in positions]  # A x 2 x (B|1, T, P)
        return TableRows(pairs_from_axes(per_axis, self._pair_axis))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, xdrope_section={list(self.section)}"


def _whole(n: Any) -> Any:
    """transformers 5 may write the section as floats (2.0): an int when whole, else as given (refused by the config)."""
    return int(n) if isinstance(n, float) and n.is_integer() else n


def xdrope_from_hf(config: Any) -> XDRopeEmbedding:
    # Reached from posenc.rotary.from_hf for the model types of XDROPE_MODEL_TYPES.
    """An :class:`XDRopeEmbedding` from a HunYuan-VL config (a transformers config object or its
    config.json dict; the text model's entries: ``text_config`` when present). Reads
    ``rope_scaling`` / ``rope_parameters``: ``xdrope_section`` (or ``mrope_section``, the name
    transformers 5 normalizes it to; else a top-level ``xdrope_section``, as vLLM's
    ``uses_xdrope_dim`` looks), ``alpha`` (the ``ntk_alpha`` scaling, as vLLM's ``get_rope``
    builds ``XDRotaryEmbedding`` for type "xdrope"), ``rope_theta``; the head dim from
    ``head_dim`` or ``attention_head_dim`` (HunyuanOCR: 128 with hidden 1024 and 16 heads).
    Types other than "xdrope", "dynamic" (transformers 5's spelling of it) and "default" are refused."""
    cfg = config if isinstance(config, dict) else config.to_dict()
    text = cfg.get("text_config") or cfg
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("xdrope", "dynamic", "default"):
        raise ValueError(f"rope_type must be 'xdrope' (or 'dynamic' / 'default') for an XD-RoPE model, got "
                         f"{rope_type!r}")
    section = params.get("xdrope_section", params.get("mrope_section", text.get("xdrope_section",
                                                                                 cfg.get("xdrope_section"))))
    if section is None:
        raise ValueError(f"the config has no xdrope_section in its rope parameters ({sorted(params)}) or at its top "
                         f"level")
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text.get("attention_head_dim") or text["hidden_size"] // heads
    base = params.get("rope_theta", text.get("rope_theta", 10000.0))
    alpha = params.get("alpha")
    scaling = {} if alpha is None else {"scaling": "ntk_alpha", "alpha": float(alpha)}
    from ..registry import build

    return build("xdrope", d_model=text["hidden_size"], num_heads=heads, head_dim=head_dim, base=float(base),
                 xdrope_section=[_whole(s) for s in section], **scaling)
