"""What each inference engine computes as RoPE from a model file, re-derived from its source:
:class:`EngineRope` and the rules registered in :data:`ENGINES` (transformers, vLLM, SGLang,
llama.cpp, mlx-lm), and where they disagree. No engine needs to be installed."""

from .base import ENGINES, EngineRope, EngineRule, Unsupported, engine_names, engine_rule, register_engine
from . import transformers as _transformers  # noqa: F401  (registers the rule)
from . import vllm as _vllm  # noqa: F401  (registers the rule)
from . import llamacpp as _llamacpp  # noqa: F401  (registers the rule)
from . import mlx_lm as _mlx_lm  # noqa: F401  (registers the rule)
from . import sglang as _sglang  # noqa: F401  (registers the rule)

__all__ = ["ENGINES", "EngineRope", "EngineRule", "Unsupported", "engine_names", "engine_rule", "register_engine"]
