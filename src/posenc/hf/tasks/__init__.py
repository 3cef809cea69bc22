"""The tasks ``posenc bench --model`` evaluates a checkpoint on (:class:`ModelTask`, found by
name in a registry): :class:`TextPasskey` (``passkey``) and :class:`TokenPerplexity` (``lm``)."""

from .base import ModelTask, model_task, model_task_names, register_model_task
from .passkey import TextPasskey
from .perplexity import TokenPerplexity

__all__ = ["ModelTask", "TextPasskey", "TokenPerplexity", "model_task", "model_task_names", "register_model_task"]
