"""The benchmark's tasks: :class:`Task` (what the bench asks of one), its registry, and the
built-in synthetic sequence tasks and passkey retrieval.

A task is an object found by name (:func:`get_task`); the bench never branches on a name. It
says what it measures (:attr:`Task.metric`, in :attr:`Task.unit`), its training length and
evaluation lengths for given settings, its training batches, and how a trained model is
evaluated (:meth:`Task.evaluate`). The defaults are those of an *example task*: problems
written as ``prompt + target`` (:class:`~posenc.bench.tokens.Example`), the loss taken on the
target only. An example's *length* is the size of the problem (the number of input symbols);
a model trained on lengths ``1..L`` is tested on ``1..2L`` with greedy decoding and exact
match. Byte-level language modelling is a task too (:mod:`posenc.bench.language`).

The synthetic tasks follow Kazemnejad et al. 2023 ("The Impact of Positional Encoding on
Length Generalization in Transformers", NeurIPS), section 3 and appendix C:

============  ==============================  ===========================================
task          prompt (length n)               target
============  ==============================  ===========================================
copy          x_1 .. x_n SEP                  x_1 .. x_n
reverse       x_1 .. x_n SEP                  x_n .. x_1
sort          x_1 .. x_n SEP                  the x_i in ascending order
addition      a_1..a_n PLUS b_1..b_n SEP      the n+1 digits of a + b
parity        bits x_1 .. x_n SEP             x_1 xor .. xor x_n
summation     x_1 .. x_n SEP                  (x_1 + .. + x_n) mod 10
============  ==============================  ===========================================

Numbers in ``addition`` are written least-significant digit first (operands and sum),
the order in which a left-to-right decoder can carry; the sum always has n+1 digits.

Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention"): a context of ``n``
tokens of repeating filler with ``KEY k_1..k_5`` hidden at a chosen depth, then ``QUERY
SEP``; the target is the key. Depth 0 puts the key at the start, 1 at the end.

All sampling goes through a ``random.Random`` passed in, so a batch is a pure function of
its seed (see :mod:`posenc.bench.data`).
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Any, TypeVar

from torch import nn

from ..config import check_int, check_range
from .data import TaskBatches
from .evaluate import exact_match, variants_for
from .tokens import DIGITS, FILLER, KEY, PLUS, QUERY, SEP, VOCAB_SIZE, Example

if TYPE_CHECKING:
    from ..results import Point
    from .data import ByteCorpus
    from .train import Batches

__all__ = ["Task", "SYNTHETIC_TASKS", "PasskeyTask", "PASSKEY_DIGITS", "register_task", "get_task", "task_names",
           "builtin_task_names"]

MAX_TASK_VOCAB = 1 << 16  # a task's own vocabulary: an embedding table, kept small
PASSKEY_DIGITS = 5


class Task:
    """A family of problems indexed by length, and how the bench trains and tests a model on it.

    A new example task is one subclass with a ``name`` and :meth:`make`, decorated with
    :func:`register_task`; ``posenc bench --tasks NAME`` then trains on sizes
    ``1..synthetic_length`` (from ``min_length``) and tests up to twice that, like the
    synthetic tasks. Tokens must lie in ``[0, vocab_size)``; ``SEP`` ends the prompt by
    convention and ``PAD`` pads batches (it should not appear in targets). A task of another
    kind (language modelling) overrides :meth:`batches` and :meth:`evaluate` instead of
    :meth:`make`, and the lengths. ``s`` below is the bench's settings
    (:class:`~posenc.bench.settings.BenchSettings`).
    """

    name: str = ""
    metric: str = "accuracy"  # "accuracy" (exact match, higher is better) or "ppl" (lower is better)
    unit: str = "tokens"  # what a length counts
    min_length: int = 1
    vocab_size: int = VOCAB_SIZE
    batch_field: str = "batch_size"  # the setting holding its global batch (flag --batch-size)
    uses_corpus: bool = False  # trained and tested on the byte corpus (--data)

    # ------------------------------------------------------------------ the problems

    def sample(self, length: int, rng: random.Random, **kwargs) -> Example:
        """A random problem of size ``length``, checked: an Example with a non-empty target
        and every token an int in ``[0, vocab_size)`` (a task's bug is named here, not met
        as an index error inside the model)."""
        check_int("length", length, minimum=self.min_length)
        ex = self.make(length, rng, **kwargs)
        if not isinstance(ex, Example):
            raise TypeError(f"task {self.name!r}: make() must return an Example, got {type(ex).__name__}")
        if not ex.prompt or not ex.target:
            raise ValueError(f"task {self.name!r}: prompt and target must be non-empty, got {ex!r}")
        bad = [t for t in ex.tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"task {self.name!r}: tokens must be ints in [0, {self.vocab_size}), got {bad[0]!r} "
                             f"in an example of length {length}")
        return ex

    def make(self, length: int, rng: random.Random, **kwargs) -> Example:  # pragma: no cover
        raise NotImplementedError

    def prompt_length(self, length: int) -> int:
        """Tokens in the prompt of a problem of size ``length`` (for RoPE scaling factors)."""
        return length + 1

    def target_length(self, length: int) -> int:
        return length

    def describe(self) -> str:
        """One line for ``posenc list --tasks``."""
        doc = (type(self).__doc__ or "").strip().splitlines()
        return f"{doc[0] if doc else '(no docstring)'}  [{type(self).__module__}, min length {self.min_length}]"

    # ------------------------------------------------------------------ in the bench

    def train_length(self, s: Any) -> int:
        """The training length L (in :attr:`unit`): sizes ``min_length..L`` are trained on."""
        return s.synthetic_length

    def batch_size(self, s: Any) -> int:
        """The global batch of a training step."""
        return getattr(s, self.batch_field)

    def train_tokens(self, s: Any) -> int:
        """The longest training sequence: a size-L problem's prompt and target."""
        L = self.train_length(s)
        return self.prompt_length(L) + self.target_length(L)

    def eval_lengths(self, s: Any) -> list[int]:
        """The sizes tested: ``min_length..2L``."""
        return list(range(self.min_length, 2 * self.train_length(s) + 1))

    def eval_depths(self, s: Any) -> tuple[float | None, ...]:
        """Where a key sits in the context, for tasks that hide one (None: no depth)."""
        return (None,)

    def eval_examples(self, s: Any) -> int:
        """Problems per (length, depth)."""
        return s.eval_examples

    def max_positions(self, s: Any) -> int:
        """The longest sequence any evaluation feeds the model (sizes position tables)."""
        return max(self.prompt_length(n) + self.target_length(n) for n in self.eval_lengths(s))

    def check_settings(self, s: Any) -> None:
        """Refuse settings the task cannot run with, before any training."""
        if self.min_length > s.synthetic_length:
            raise ValueError(f"synthetic_length must be >= {self.min_length} (the min_length of task "
                             f"{self.name!r}), got {s.synthetic_length}")

    def settings_note(self, settings: dict[str, Any]) -> str | None:
        """What the table's settings line says of this task's batches beyond ``batch``, if anything."""
        return None

    def batches(self, s: Any, seed: int, corpus: ByteCorpus | None) -> Batches:
        """The training batches of one run: ``batches(step)`` is a pure function of ``(seed, step)``."""
        return TaskBatches(self, self.batch_size(s), self.train_length(s), seed)

    def evaluate(self, model: nn.Module, s: Any, corpus: ByteCorpus | None) -> list[Point]:
        """Exact match at every length and depth, for the model and (RoPE) each scaling of it set
        for the length's factor over the training sequence."""
        points: list[Point] = []
        L = self.train_length(s)
        variants = variants_for(model, s.scalings)
        train_tokens = self.prompt_length(L) + self.target_length(L)
        for n in self.eval_lengths(s):
            factor = (self.prompt_length(n) + self.target_length(n)) / train_tokens
            for variant, m in variants(factor, train_tokens):
                for d in self.eval_depths(s):
                    acc = exact_match(m, self, n, self.eval_examples(s), eval_seed=s.eval_seed, depth=d)
                    points.append(dict(variant=variant, length=n, depth=d, value=acc))
        return points


class Copy(Task):
    """Write the input again."""

    name = "copy"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice(DIGITS) for _ in range(n))
        return Example(x + (SEP,), x)


class Reverse(Task):
    """Write the input reversed."""

    name = "reverse"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice(DIGITS) for _ in range(n))
        return Example(x + (SEP,), x[::-1])


class Sort(Task):
    """Write the input digits in ascending order."""

    name = "sort"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice(DIGITS) for _ in range(n))
        return Example(x + (SEP,), tuple(sorted(x)))


class Addition(Task):
    """Add two n-digit numbers (least-significant digit first)."""

    name = "addition"

    def make(self, n: int, rng: random.Random) -> Example:
        a = [rng.choice(DIGITS) for _ in range(n)]  # least-significant digit first
        b = [rng.choice(DIGITS) for _ in range(n)]
        out, carry = [], 0
        for da, db in zip(a, b):
            s = da + db + carry
            out.append(s % 10)
            carry = s // 10
        out.append(carry)
        return Example(tuple(a) + (PLUS,) + tuple(b) + (SEP,), tuple(out))

    def prompt_length(self, length: int) -> int:
        return 2 * length + 2

    def target_length(self, length: int) -> int:
        return length + 1


class Parity(Task):
    """The xor of n bits."""

    name = "parity"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice((0, 1)) for _ in range(n))
        return Example(x + (SEP,), (sum(x) % 2,))

    def target_length(self, length: int) -> int:
        return 1


class Summation(Task):
    """The sum of n digits mod 10."""

    name = "summation"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice(DIGITS) for _ in range(n))
        return Example(x + (SEP,), (sum(x) % 10,))

    def target_length(self, length: int) -> int:
        return 1


class PasskeyTask(Task):
    """Find the 5-digit key hidden at a depth in ``length`` tokens of filler.

    ``length`` counts the whole context before ``QUERY SEP`` (filler + KEY + digits).
    """

    name = "passkey"
    min_length = PASSKEY_DIGITS + 1

    def make(self, n: int, rng: random.Random, depth: float | None = None) -> Example:
        if depth is None:
            depth = rng.random()
        check_range("depth", depth, 0.0, 1.0)
        key = tuple(rng.choice(DIGITS) for _ in range(PASSKEY_DIGITS))
        n_filler = n - PASSKEY_DIGITS - 1
        at = round(depth * n_filler)  # filler tokens before the key
        phase = rng.randrange(len(FILLER))  # where in its cycle the filler starts
        filler = [FILLER[(phase + i) % len(FILLER)] for i in range(n_filler)]
        context = tuple(filler[:at]) + (KEY,) + key + tuple(filler[at:])
        return Example(context + (QUERY, SEP), key)

    def prompt_length(self, length: int) -> int:
        return length + 2

    def target_length(self, length: int) -> int:
        return PASSKEY_DIGITS

    def train_length(self, s: Any) -> int:
        return s.passkey_length

    def eval_lengths(self, s: Any) -> list[int]:
        """Multiples of L (``passkey_eval_factors``), raised to ``min_length`` where below it."""
        L = self.train_length(s)
        return sorted({max(self.min_length, round(f * L)) for f in s.passkey_eval_factors})

    def eval_depths(self, s: Any) -> tuple[float | None, ...]:
        return tuple(s.passkey_depths)

    def eval_examples(self, s: Any) -> int:
        return s.passkey_examples

    def check_settings(self, s: Any) -> None:
        """Nothing beyond what the settings check themselves (``passkey_length >= min_length``)."""


SYNTHETIC_TASKS: dict[str, type[Task]] = {
    t.name: t for t in (Copy, Reverse, Sort, Addition, Parity, Summation)
}

# Every registered Task class by name: the built-ins first, then user tasks (register_task).
_TASKS: dict[str, type[Task]] = {}
_NAME = re.compile(r"[a-z][a-z0-9_]*")  # a task name is a folder name in runs/TASK/...

T = TypeVar("T", bound=type[Task])


def register_task(cls: T) -> T:
    """Class decorator: make a :class:`Task` subclass available by its ``name``.

    Example (in a module loaded with ``posenc --import MODULE``)::

        @register_task
        class Repeat(Task):
            name = "repeat"                      # posenc bench --tasks repeat

            def make(self, n, rng):
                x = tuple(rng.choice(DIGITS) for _ in range(n))
                return Example(x + (SEP,), x + x)

            def target_length(self, n):          # tokens after SEP (RoPE scaling factors)
                return 2 * n

    Raises ``TypeError`` for a class that is not a Task subclass or lacks ``make`` (a task
    without examples overrides ``batches`` and ``evaluate`` instead), and ``ValueError`` for a
    bad or taken name or a bad ``min_length`` / ``vocab_size``.
    """
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"register_task needs a subclass of posenc.bench.tasks.Task, got {cls!r}")
    name = cls.name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"task name of {cls.__qualname__} must be lowercase letters, digits and '_' "
                         f"starting with a letter, got {name!r}")
    if name in _TASKS:
        raise ValueError(f"task {name!r} is already registered; choose another name")
    if cls.make is Task.make and (cls.batches is Task.batches or cls.evaluate is Task.evaluate):
        raise TypeError(f"task {name!r} ({cls.__qualname__}) must override make(self, length, rng)")
    check_int(f"min_length of task {name!r}", cls.min_length, minimum=1)
    # >= VOCAB_SIZE: batches are padded with the shared PAD token
    check_int(f"vocab_size of task {name!r}", cls.vocab_size, minimum=VOCAB_SIZE, maximum=MAX_TASK_VOCAB)
    _TASKS[name] = cls
    return cls


for _cls in (*SYNTHETIC_TASKS.values(), PasskeyTask):
    register_task(_cls)


def task_names() -> tuple[str, ...]:
    """Every task ``posenc bench`` can run: the registered tasks, built-ins first."""
    return tuple(_TASKS)


def builtin_task_names() -> tuple[str, ...]:
    """The tasks posenc itself registers (those of the presets that run every task)."""
    return tuple(n for n, cls in _TASKS.items() if cls.__module__.startswith("posenc."))


def get_task(name: str) -> Task:
    """A new instance of the registered :class:`Task` named ``name``; an unknown name lists
    the valid ones."""
    if not isinstance(name, str):
        raise TypeError(f"task name must be a str, got {type(name).__name__} {name!r}")
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(_TASKS)}")
    return _TASKS[name]()
