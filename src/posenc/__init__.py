"""posenc: Transformer positional encodings behind one interface.

>>> import posenc
>>> posenc.list_encodings()[:3]
['none', 'learned', 'sinusoidal']
>>> model = posenc.Transformer(posenc.ModelConfig(encoding="sinusoidal"))
>>> rope = posenc.rotary.RotaryEmbedding   # family subpackages load on first use
"""

import sys as _sys

if getattr(_sys, "orig_argv", None) and _sys.argv[:1] == ["-m"]:  # python -m ...: maybe posenc itself
    from posenc_entry import guard_interrupts as _guard, run_as_main as _run_as_main

    if _run_as_main(_sys.argv[0], _sys.orig_argv):  # Ctrl-C while torch imports: one line, exit 130
        _guard()
    del _guard, _run_as_main
del _sys

from .attention import Attention
from .context import AttentionContext
from .config import EncodingConfig
from .encoding import Dims, PositionalEncoding
from .kv_cache import KVCache
from .model import Transformer
from .model_config import EncodingSpec, ModelConfig, preset
from .positions import SequenceInfo, relative_positions
from .registry import EncodingInfo, build, get_info, list_encodings, register

__version__ = "0.1.0"

# Subpackages load on first attribute access (PEP 562), so `import posenc` stays light and
# `posenc.rotary.RotaryEmbedding` works in a fresh interpreter without a registry call first.
_SUBPACKAGES = ("absolute", "relative", "rotary", "analysis", "bench", "speed")


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBPACKAGES))

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
