"""The tasks ``posenc bench --model`` evaluates a checkpoint on (:class:`ModelTask`, found by
name in a registry): :class:`TextPasskey` (``passkey``) and :class:`TokenPerplexity` (``lm``),
run by default; RULER's :class:`MultiKeyNeedle` (``multikey``) and :class:`VariableTracking`
(``vartrack``), run when named in ``--tasks``."""

from .base import ModelTask, default_model_task_names, model_task, model_task_names, register_model_task
from .needle import NeedleTask
from .passkey import TextPasskey
from .perplexity import TokenPerplexity
from .multikey import MultiKeyNeedle
from .variable_tracking import VariableTracking

__all__ = ["ModelTask", "MultiKeyNeedle", "NeedleTask", "TextPasskey", "TokenPerplexity", "VariableTracking",
           "default_model_task_names", "model_task", "model_task_names", "register_model_task"]
