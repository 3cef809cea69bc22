"""posenc: Transformer positional encodings behind one interface.

>>> import posenc
>>> posenc.list_encodings()[:3]
['none', 'learned', 'sinusoidal']
>>> model = posenc.Transformer(posenc.ModelConfig(encoding="sinusoidal"))
"""

from .attention import Attention, AttentionContext, KVCache
from .config import EncodingConfig
from .encoding import Dims, PositionalEncoding
from .model import EncodingSpec, ModelConfig, Transformer, preset
from .positions import SequenceInfo, relative_positions
from .registry import EncodingInfo, build, get_info, list_encodings, register

__version__ = "0.1.0"

__all__ = [
    "Attention",
    "AttentionContext",
    "Dims",
    "EncodingConfig",
    "EncodingInfo",
    "EncodingSpec",
    "KVCache",
    "ModelConfig",
    "PositionalEncoding",
    "SequenceInfo",
    "Transformer",
    "build",
    "get_info",
    "list_encodings",
    "preset",
    "register",
    "relative_positions",
]
