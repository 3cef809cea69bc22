"""posenc: Transformer positional encodings behind one interface.

>>> import posenc
>>> posenc.list_encodings()[:2]
['none', 'nope_temperature']
>>> model = posenc.Transformer(posenc.ModelConfig(encoding="sinusoidal"))
>>> rope = posenc.rotary.RotaryEmbedding   # family subpackages load on first use
"""

__version__ = "0.1.0"

# Every public name loads on first access (PEP 562), from the module that defines it:
# `import posenc` imports neither torch nor any submodule. So `python -m posenc` runs
# posenc/__main__.py, whose first act is the console script's Ctrl-C guard, before torch
# loads, without this package knowing about its command line; and a script pays for what it uses.
_NAMES: dict[str, str] = {
    "Attention": "attention",
    "AttentionContext": "context",
    "EncodingConfig": "config",
    "Dims": "encoding",
    "PositionalEncoding": "encoding",
    "KVCache": "kv_cache",
    "MLAConfig": "mla",
    "MultiHeadLatentAttention": "mla",
    "Transformer": "model",
    "EncodingSpec": "model_config",
    "ModelConfig": "model_config",
    "preset": "model_config",
    "SequenceInfo": "positions",
    "relative_positions": "positions",
    "EncodingInfo": "registry",
    "build": "registry",
    "get_info": "registry",
    "list_encodings": "registry",
    "register": "registry",
}
_SUBPACKAGES = ("absolute", "relative", "rotary", "analysis", "bench", "speed")

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (milliseconds before the guard)
if TYPE_CHECKING:  # what a type checker and an editor see
    from .attention import Attention
    from .config import EncodingConfig
    from .context import AttentionContext
    from .encoding import Dims, PositionalEncoding
    from .kv_cache import KVCache
    from .mla import MLAConfig, MultiHeadLatentAttention
    from .model import Transformer
    from .model_config import EncodingSpec, ModelConfig, preset
    from .positions import SequenceInfo, relative_positions
    from .registry import EncodingInfo, build, get_info, list_encodings, register


def __getattr__(name: str):
    import importlib

    if name in _NAMES:
        value = getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
        globals()[name] = value  # later reads find it without this function
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES) | set(_SUBPACKAGES))


__all__ = sorted(_NAMES)
