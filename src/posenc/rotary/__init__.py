"""The rotary family: RoPE and xPos (the ``rotate`` hook). Importing it registers both.

* :mod:`.scaling` — the registry ``SCALINGS``, one :class:`Scaling` entry per frequency scaling
  (:mod:`.scaling.schema`: typed config, pure function, label, transformers spelling, its rule
  at factor x the trained length), the built-in entries one module each in the package;
  ``ROPE_SCALINGS`` / ``SCALING_CONFIGS`` are views;
* :mod:`.functional` — ``apply_rotary`` / ``apply_rotary_qk`` and the rotation plan that picks a kernel;
  :mod:`.kernels` — the rotation arithmetic; :mod:`.angles` — the cos/sin tables;
  :mod:`.layout` — the two layouts and ``convert_qk_layout``;
* :mod:`.rope` — :class:`RotaryEmbedding` (``rope``); :mod:`.xpos` — :class:`XPos` (``xpos``);
* :mod:`.hf_config` — :func:`from_hf`, a RoPE module from a Hugging Face config.json (and
  ``layer_ropes``, one per decoder layer); :mod:`.hf_write` — :func:`to_hf`, back;
  :mod:`.hf_readings` — how each model_type describes its RoPE; :mod:`.hf_geometry` — the
  heads, rotated width, base and layout a config sets.
"""

from . import rope, xpos  # noqa: F401  (registers the encodings)
from . import pope  # noqa: F401
from . import fope  # noqa: F401  (FoPE: learned Fourier series over the kept frequencies)
from . import mrope  # noqa: F401  (M-RoPE: time / height / width axes)
from . import xdrope  # noqa: F401  (XD-RoPE: HunYuan-VL's position / width / height / image axes)
from . import axial  # noqa: F401  (2-D RoPE: rope_axial, rope_mixed)
from . import dinov3  # noqa: F401  (DINOv3's 2-D RoPE: rope_dinov3)
from .angles import angles_cos_sin
from .functional import KERNELS, apply_rotary, apply_rotary_qk
from .layout import LAYOUTS, convert_qk_layout
from .hf_config import from_hf
from .hf_write import to_hf
from .rope import RotaryConfig, RotaryEmbedding
from .scaling import (
    ROPE_SCALINGS,
    SCALING_CONFIGS,
    SCALINGS,
    list_scalings,
    register_scaling,
    unregister_scaling,
    base_inv_freq,
    make_scaling_config,
    rope_frequencies,
)
from .scaling.llama3 import Llama3Scaling
from .scaling.longrope import LongRopeScaling
from .scaling.ntk import DynamicNTKScaling, NTKScaling
from .scaling.plain import DefaultScaling, LinearScaling
from .scaling.schema import HFSpec, Scaling, ScalingConfig
from .scaling.yarn import YarnScaling
from .xpos import XPos, XPosConfig, xpos_scale

__all__ = [
    "KERNELS",
    "LAYOUTS",
    "ROPE_SCALINGS",
    "SCALING_CONFIGS",
    "SCALINGS",
    "HFSpec",
    "Scaling",
    "ScalingConfig",
    "list_scalings",
    "register_scaling",
    "unregister_scaling",
    "to_hf",
    "DefaultScaling",
    "DynamicNTKScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "RotaryConfig",
    "RotaryEmbedding",
    "XPos",
    "XPosConfig",
    "YarnScaling",
    "angles_cos_sin",
    "apply_rotary",
    "apply_rotary_qk",
    "base_inv_freq",
    "convert_qk_layout",
    "from_hf",
    "make_scaling_config",
    "rope_frequencies",
    "xpos_scale",
]
