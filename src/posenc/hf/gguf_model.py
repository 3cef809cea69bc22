"""What transformers will build from a GGUF file, known and checked before it builds it.

transformers does not size a GGUF model from the file's tensors: it builds the model from the
file's *metadata* (``from_pretrained(dir, gguf_file=name)`` reads a config from keys such as
``llama.embedding_length``), a key the metadata lacks takes the config class's default (Llama's
defaults are the 6.7B model), and then fills the parameters from the tensors, initialising any
parameter no tensor maps to at random and only logging it. So neither "the file is small" nor
"the file loaded" says that the model is the file. Two checks close that:

* :func:`plan_gguf`, before anything is allocated: the config transformers reads from the
  metadata (the same ``AutoConfig.from_pretrained(..., gguf_file=)`` call ``from_pretrained``
  makes), the model built from it on the ``meta`` device (shapes, no storage) and its parameter
  count. A model with more parameters than the file's tensors hold values cannot be filled by
  them and is refused with one line naming the sizes and which ones came from defaults; the
  memory check then uses the model's float32 size, not the file's.
* :func:`check_loaded`, after loading: transformers' own loading report (``missing_keys``,
  ``mismatched_keys``) must be empty: a tensor renamed in the file leaves its parameter at random
  init with the same total size, which only the report shows.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GGUFPlan", "MAX_LAYERS", "check_loaded", "gguf_float32_bytes", "plan_gguf", "read_gguf_header"]

#: a bound on num_hidden_layers before the meta model is built (the largest published decoders
#: have under 130 layers); a crafted value of 10**9 would otherwise build 10**9 meta modules
MAX_LAYERS = 1024
#: the config fields a message names when it says how large the model is
_SIZING = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim")


def _install_hint() -> str:
    return f"{Path(sys.executable).name} -m pip install --no-deps gguf accelerate"


def read_gguf_header(path: Path) -> tuple[str, list[tuple[str, tuple[int, ...]]]]:
    """(architecture, [(tensor name, shape)]) from a GGUF file's header; ValueError naming the
    file when it is not a readable GGUF (wrong magic, truncated, corrupt)."""
    from .._optional import MissingExtra
    from ..engines.gguf_meta import open_gguf

    path = Path(path)
    try:
        reader = open_gguf(path)
    except MissingExtra:
        raise ValueError(f"reading a .gguf file needs the gguf package: {_install_hint()}") from None
    try:
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
        tensors = [(t.name, tuple(int(s) for s in t.shape)) for t in reader.tensors]
    except (ValueError, KeyError, IndexError, OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: the GGUF file is unreadable (truncated or corrupt): "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not tensors:
        raise ValueError(f"{path}: the GGUF file holds no tensors")
    return arch, tensors


def gguf_float32_bytes(tensors: list[tuple[str, tuple[int, ...]]]) -> int:
    """Bytes of the tensors once dequantized to float32."""
    return 4 * sum(math.prod(shape) for _, shape in tensors)


@dataclass(frozen=True)
class GGUFPlan:
    """What loading ``path`` with transformers will build: ``config`` (a PretrainedConfig, as
    transformers reads it from the metadata), ``params`` (the model's parameter count, tied
    weights once) and ``float32_bytes`` (the model's parameters and buffers in float32)."""

    path: Path
    architecture: str
    tensors: list[tuple[str, tuple[int, ...]]]
    config: Any
    params: int
    float32_bytes: int

    @property
    def file_values(self) -> int:
        """How many values the file's tensors hold."""
        return sum(math.prod(s) for _, s in self.tensors)


def _check_architecture(path: Path, arch: str) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        known = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not one transformers can load; it loads: {known}")


def _metadata_keys(path: Path) -> set[str]:
    """The config keys the file's metadata sets (the rest are the config class's defaults)."""
    import transformers

    try:
        got, _ = transformers.PretrainedConfig.get_config_dict(str(path.parent), gguf_file=path.name)
    except Exception:  # only used to word a refusal; the refusal itself stands without it
        return set()
    return set(got)


def _sizes(path: Path, config: Any) -> str:
    given = _metadata_keys(path)
    parts, defaulted = [], []
    for key in _SIZING:
        value = getattr(config, key, None)
        if value is not None:
            parts.append(f"{key} {value}")
            if key not in given:
                defaulted.append(key)
    said = ", ".join(parts)
    if defaulted:
        said += f"; the file's metadata lacks {', '.join(defaulted)}, so these are transformers' defaults"
    return said


def _config(path: Path, arch: str) -> Any:
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # noqa: BLE001 - transformers raises KeyError/TypeError/OSError on odd metadata
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path}: transformers cannot read a {arch} config from the GGUF metadata: "
                         f"{first[:200]}") from None


def plan_gguf(path: str | Path) -> GGUFPlan:
    """Read ``path``'s header and the config transformers reads from its metadata, build that
    model on the meta device, and refuse (ValueError, one line naming the file) a model the
    file's tensors cannot fill. Allocates no weight."""
    import torch

    path = Path(path)
    arch, tensors = read_gguf_header(path)
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loading needs it)
        import transformers
    except ImportError as e:
        raise ValueError(f"converting a GGUF file needs transformers, gguf and accelerate ({e.name} is missing): "
                         f"{_install_hint()}") from None
    _check_architecture(path, arch)
    config = _config(path, arch)
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and not 1 <= layers <= MAX_LAYERS:
        raise ValueError(f"{path}: the GGUF metadata gives num_hidden_layers {layers}; a model has 1 to "
                         f"{MAX_LAYERS} layers (a corrupt or crafted file)")
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - an inconsistent config (heads not dividing the width, ...)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path}: transformers cannot build a {arch} model from the GGUF metadata "
                         f"({_sizes(path, config)}): {first[:200]}") from None
    params = sum(p.numel() for p in model.parameters())
    size = 4 * params + 4 * sum(b.numel() for b in model.buffers())
    plan = GGUFPlan(path, arch, tensors, config, params, size)
    if params > plan.file_values:
        raise ValueError(f"{path}: transformers would build a {getattr(config, 'model_type', arch)} model of "
                         f"{_count(params)} parameters from the GGUF metadata ({_sizes(path, config)}), but the "
                         f"file's {len(tensors)} tensor(s) hold {_count(plan.file_values)} values: the rest would be "
                         "initialised at random (a truncated, mislabelled or crafted file)")
    return plan


def _count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def check_loaded(path: Path, architecture: str, info: dict[str, Any]) -> None:
    """Refuse a GGUF load whose loading report (``from_pretrained(..., output_loading_info=True)``)
    has parameters left at random init (``missing_keys``) or of the wrong shape."""
    for key, what in (("missing_keys", "the file does not provide (transformers initialised them at random)"),
                      ("mismatched_keys", "whose shape in the file differs from the model's")):
        names = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(key) or ())
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise ValueError(f"{path}: the {architecture} model transformers builds from it has {len(names)} "
                             f"weight(s) {what}: {shown}; the file is incomplete or its tensors are misnamed")
