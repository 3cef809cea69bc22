"""Hugging Face interop (the optional extra ``posenc[hf]``: transformers is imported only when a
function here needs it, never by ``import posenc``).

* :func:`patch_model` / :func:`unpatch_model` (:mod:`posenc.hf.patch`): a loaded transformers
  causal LM rotates with posenc's RoPE, its scaling switchable at evaluation time.
* :func:`relative_from_bert` / :func:`relative_from_deberta` (:mod:`posenc.hf.loaders`): BERT
  relative_key(_query) and DeBERTa-v2 position weights loaded into posenc's encodings.
* :mod:`posenc.hf.checkpoint`: the checked reads every entry here uses (:func:`read_checkpoint`,
  ``read_config``, ``check_safetensors``: a bad file is one line naming it) and
  :func:`trained_length`, the one reading of a config's trained length.

See docs/hf.md.
"""

from .checkpoint import read_checkpoint, trained_length
from .loaders import relative_from_bert, relative_from_deberta
from .patch import SUPPORTED_MODEL_TYPES, PosencRotary, patch_model, patched_rope, unpatch_model

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "PosencRotary",
    "patch_model",
    "patched_rope",
    "read_checkpoint",
    "relative_from_bert",
    "relative_from_deberta",
    "trained_length",
    "unpatch_model",
]

# a checkpoint's q·k against distance (posenc probe), and its scores past the trained length on
# each task of posenc.hf.tasks (posenc bench --model)
from .bench_model import run_model_bench  # noqa: E402
from .bench_settings import ModelBenchSettings, model_settings  # noqa: E402
from .probe import ProbeSettings  # noqa: E402
from .probe import probe as run_probe  # noqa: E402  (not `probe`: that name is the subpackage)

__all__ += ["ModelBenchSettings", "ProbeSettings", "model_settings", "run_model_bench", "run_probe"]
