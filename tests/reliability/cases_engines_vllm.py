"""vLLM's and SGLang's readings of a config.json (posenc.engines.vllm / .sglang): a file the engine
refuses is ``Unsupported`` with what the engine does, a malformed one a ValueError/TypeError."""

from __future__ import annotations

from posenc.engines import Unsupported, engine_rule
from posenc.engines.vllm import vllm_ropes

from . import Case

_MISTRAL = {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0}
_PHI3 = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "num_hidden_layers": 32,
         "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
         "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.0] * 3}}


def _rope(engine: str, rope_scaling, **extra):
    return lambda: engine_rule(engine)(_MISTRAL | {"rope_scaling": rope_scaling} | extra)


A = "engines: vLLM, SGLang"
CASES = [
    Case(A, "vLLM: rope_scaling that is not a dict", r"^rope_scaling must be a dict or null, got str 'yarn'$",
         run=_rope("vllm", "yarn"), error=TypeError),
    Case(A, "vLLM: a yarn rope_scaling without factor",
         r"^vLLM does not start: transformers' validate_rope raises KeyError for rope_scaling of rope_type 'yarn' "
         r"without 'factor'$", run=_rope("vllm", {"type": "yarn"}), error=Unsupported),
    Case(A, "vLLM: an unknown rope type",
         r"^vLLM refuses rope_type 'foo': get_rope raises 'Unknown RoPE scaling type foo'$",
         run=_rope("vllm", {"rope_type": "foo", "factor": 2.0}), error=Unsupported),
    Case(A, "vLLM: rope_type and legacy type that disagree",
         r"^vLLM refuses rope_scaling: rope_type='yarn' and type='linear' conflict",
         run=_rope("vllm", {"rope_type": "yarn", "type": "linear", "factor": 2.0}), error=Unsupported),
    Case(A, "vLLM: a type vLLM runs that posenc does not model (ntk)",
         r"^posenc's vLLM rule does not model rope_type 'ntk'", run=_rope("vllm", {"rope_type": "ntk", "factor": 2.0})),
    Case(A, "vLLM: a yarn factor that is a string", r"^rope_scaling\['factor'\] must be a finite number, got '4'$",
         run=_rope("vllm", {"rope_type": "yarn", "factor": "4"})),
    Case(A, "vLLM: a rope_theta that is a string",
         r"^rope_theta \(rope_parameters or the top level\) must be a finite number > 1, got '1e6'$",
         run=lambda: engine_rule("vllm")(_MISTRAL | {"rope_theta": "1e6"})),
    Case(A, "vLLM: partial_rotary_factor 0", r"^partial_rotary_factor must be in \(0, 1\], got 0$",
         run=_rope("vllm", None, partial_rotary_factor=0)),
    Case(A, "vLLM: LongRoPE long_factor of the wrong length",
         r"^rope_scaling\['long_factor'\] must have rotary_dim / 2 = 48 entries, got 3$",
         run=lambda: vllm_ropes(_PHI3, max_model_len=131072)),
    Case(A, "vLLM: max_model_len 0", r"^max_model_len must be an int >= 1 or None, got 0$",
         run=lambda: vllm_ropes(_MISTRAL, max_model_len=0)),
    Case(A, "vLLM: a model_type posenc's rule does not read",
         r"^model_type must be one of .* for posenc's vLLM rule, got 'bert'$",
         run=lambda: engine_rule("vllm")({"model_type": "bert", "num_hidden_layers": 2})),
    Case(A, "vLLM: a config that is not a dict", r"^config must be a dict \(a parsed config.json\), got list$",
         run=lambda: engine_rule("vllm")([]), error=TypeError),
    Case(A, "SGLang: an unknown rope type",
         r"^SGLang refuses rope_type 'foo': get_rope raises 'Unknown RoPE scaling type foo'$",
         run=_rope("sglang", {"rope_type": "foo"}), error=Unsupported),
    Case(A, "SGLang: a linear rope_scaling without factor",
         r"^SGLang does not start: transformers' validate_rope raises KeyError for rope_scaling of rope_type 'linear' "
         r"without 'factor'$", run=_rope("sglang", {"rope_type": "linear"}), error=Unsupported),
    Case(A, "SGLang: rope_scaling that is a list", r"^rope_scaling must be a dict or null, got list \[2.0\]$",
         run=_rope("sglang", [2.0]), error=TypeError),
    Case(A, "SGLang: yarn truncate that is not a bool", r"^rope_scaling\['truncate'\] must be a bool, got 'no'$",
         run=_rope("sglang", {"rope_type": "yarn", "factor": 2.0, "truncate": "no"}), error=TypeError),
]
