"""A task a checkpoint is evaluated on as it is, without training, and the registry of them.

A :class:`ModelTask` is a :class:`posenc.bench.tasks.Task` built on the checkpoint's tokenizer,
with the bench's own vocabulary for what it runs (``train_length``: L; ``eval_lengths``;
``eval_depths``; ``eval_examples``) and what ``bench --model`` adds: the forwards a length
costs (:meth:`ModelTask.cells`), one length's evaluation of the model as currently patched
(:meth:`ModelTask.evaluate_at`: the runner switches the RoPE scaling of each row in place and
resumes per row), and how its values read in tables, summaries and figures. The runner, the
table and the report ask the task; none of them knows a task by name.

A new task is one subclass decorated with :func:`register_model_task`; ``posenc bench --model
M --tasks NAME`` then runs it and its rows appear in every table and figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Iterator, TypeVar

from ...bench.tasks import Task

if TYPE_CHECKING:
    from torch import nn

    from ...bench.data import ByteCorpus
    from ..bench_settings import ModelBenchSettings
    from ..evaluation import HFCausalLM

__all__ = ["ModelTask", "default_model_task_names", "model_task", "model_task_names", "register_model_task"]


class ModelTask(Task):
    """A task of ``bench --model``: one value per (row, length, depth), depth None where the task has none.

    Class attributes say how its values read (without a tokenizer, e.g. for the report):
    ``metric`` (results.json's name for it), ``value_label`` (an axis or summary label),
    ``higher_is_better``, ``scale`` (a value as shown: 100 for a fraction in %),
    ``value_format`` (a shown value in a summary) and ``value_range`` (a figure's y limits, or None);
    ``default``: whether ``bench --model`` runs it when ``--tasks`` is not given (False: a task
    asked for by name, so that a new task does not change what a plain run costs and measures).
    """

    default: ClassVar[bool] = True
    value_label: ClassVar[str] = ""
    higher_is_better: ClassVar[bool] = True
    scale: ClassVar[float] = 1.0
    value_format: ClassVar[str] = "{:.2f}"
    value_range: ClassVar[tuple[float, float] | None] = None

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.vocab_size = tokenizer.vocab_size  # Task.sample checks every token against it

    @classmethod
    def check_inputs(cls, corpus: str, data: str | None) -> None:
        """Refuse, before any model is loaded, inputs the task will not find (a missing package)."""

    def train_length(self, s: ModelBenchSettings) -> int:
        """L: the checkpoint's trained length, or the shorter one stated."""
        return s.trained_length

    def eval_lengths(self, s: ModelBenchSettings) -> list[int]:
        """The lengths evaluated, in tokens, ascending."""
        raise NotImplementedError

    def prepare(self, s: ModelBenchSettings, lengths: list[int], device: str) -> None:
        """Read what the evaluation needs (a corpus) once, before any forward."""

    def corpus(self, s: ModelBenchSettings) -> ByteCorpus | None:
        """The text the task reads for ``s`` (recorded in results.json), or None: it reads none."""
        return None

    def cells(self, s: ModelBenchSettings, n: int) -> list[tuple[int, int, int]]:
        """(tokens, batch, scored positions) of every forward one row runs at length ``n``
        (for :func:`posenc.hf.cost.estimate_cost`)."""
        raise NotImplementedError

    def evaluate_at(self, lm: HFCausalLM, s: ModelBenchSettings, n: int
                    ) -> Iterator[tuple[float | None, float] | tuple[float | None, float, dict[str, Any]]]:
        """(depth, value) or (depth, value, extras) of each point at length ``n`` of ``lm`` as it is
        patched now, as each is measured; ``extras``: the optional fields of a point
        (:data:`posenc.results.POINT_EXTRAS`: its 95 % interval ``low``/``high``, the ``count`` it
        rests on, a perplexity's ``beyond`` L)."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, s: Any, corpus: Any) -> list:
        raise TypeError(f"task {self.name!r} evaluates a checkpoint one row and length at a time "
                        "(evaluate_at, run by posenc.hf.bench_model), not a trained bench model")

    @classmethod
    def title(cls, settings: dict[str, Any]) -> str:
        """What a table of this task's values shows, from results.json's settings."""
        return cls.value_label

    @classmethod
    def shown(cls, values: list[float | None]) -> str:
        """A table cell: the values of one (row, length), one per depth."""
        if any(v is None for v in values):
            return "nan"
        return f"{cls.scale * sum(values) / len(values):.0f}"


_MODEL_TASKS: dict[str, type[ModelTask]] = {}

M = TypeVar("M", bound=type[ModelTask])


def register_model_task(cls: M) -> M:
    """Class decorator: make a :class:`ModelTask` subclass available to ``bench --model`` by its ``name``."""
    if not (isinstance(cls, type) and issubclass(cls, ModelTask)):
        raise TypeError(f"register_model_task needs a subclass of posenc.hf.tasks.ModelTask, got {cls!r}")
    if not isinstance(cls.name, str) or not cls.name or cls.name in _MODEL_TASKS:
        raise ValueError(f"model task name {cls.name!r} of {cls.__qualname__} is empty or already registered")
    _MODEL_TASKS[cls.name] = cls
    return cls


def model_task_names() -> tuple[str, ...]:
    """Every task ``bench --model`` can run, in registration order (the built-ins first)."""
    return tuple(_MODEL_TASKS)


def default_model_task_names() -> tuple[str, ...]:
    """The tasks ``bench --model`` runs without ``--tasks``: those whose ``default`` is True."""
    return tuple(name for name, cls in _MODEL_TASKS.items() if cls.default)


def model_task(name: str) -> type[ModelTask]:
    """The registered task class named ``name``; an unknown name lists the valid ones."""
    if name not in _MODEL_TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(_MODEL_TASKS)}")
    return _MODEL_TASKS[name]
