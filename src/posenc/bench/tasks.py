"""Length-generalization tasks: synthetic sequence tasks and passkey retrieval.

Every task writes an example as a decoder-only sequence ``prompt + target`` where the
prompt ends with the separator ``SEP`` and the loss is taken on the target only.
An example's *length* is the size of the problem (the number of input symbols); a model
trained on lengths ``1..L`` is tested on ``L+1..2L`` with greedy decoding and exact match.

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
from dataclasses import dataclass
from typing import TypeVar

from ..config import check_int, check_range

__all__ = [
    "DIGITS",
    "SEP",
    "PLUS",
    "PAD",
    "KEY",
    "QUERY",
    "FILLER",
    "VOCAB_SIZE",
    "Example",
    "Task",
    "SYNTHETIC_TASKS",
    "PasskeyTask",
    "register_task",
    "get_task",
    "task_names",
    "TASK_NAMES",
]

# One small vocabulary for every synthetic task and passkey retrieval.
DIGITS = tuple(range(10))
SEP, PLUS, PAD, KEY, QUERY = 10, 11, 12, 13, 14
FILLER = tuple(range(15, 20))  # the passkey haystack cycles through these
VOCAB_SIZE = 20
MAX_TASK_VOCAB = 1 << 16  # a task's own vocabulary: an embedding table, kept small
PASSKEY_DIGITS = 5


@dataclass(frozen=True)
class Example:
    """One problem: the model reads ``prompt`` and must produce ``target``."""

    prompt: tuple[int, ...]
    target: tuple[int, ...]

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.prompt + self.target


class Task:
    """A family of problems indexed by length. Subclasses implement :meth:`make`.

    A new task is one subclass with a ``name`` and :meth:`make`, decorated with
    :func:`register_task`; ``posenc bench --tasks NAME`` then trains on sizes
    ``1..synthetic_length`` (from ``min_length``) and tests up to twice that, like the
    synthetic tasks. Tokens must lie in ``[0, vocab_size)``; ``SEP`` ends the prompt by
    convention and ``PAD`` pads batches (it should not appear in targets).
    """

    name: str = ""
    metric: str = "accuracy"
    min_length: int = 1
    vocab_size: int = VOCAB_SIZE

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


SYNTHETIC_TASKS: dict[str, type[Task]] = {
    t.name: t for t in (Copy, Reverse, Sort, Addition, Parity, Summation)
}
# "lm" is byte-level language modelling (posenc.bench.data.ByteCorpus), not a Task.
TASK_NAMES: tuple[str, ...] = (*SYNTHETIC_TASKS, "passkey", "lm")  # the built-in tasks

# Every registered Task class by name: the built-ins below, then user tasks (register_task).
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

    Raises ``TypeError`` for a class that is not a Task subclass or lacks ``make``, and
    ``ValueError`` for a bad or taken name or a bad ``min_length`` / ``vocab_size``.
    """
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"register_task needs a subclass of posenc.bench.tasks.Task, got {cls!r}")
    name = cls.name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"task name of {cls.__qualname__} must be lowercase letters, digits and '_' "
                         f"starting with a letter, got {name!r}")
    if name in _TASKS or name == "lm":
        raise ValueError(f"task {name!r} is already registered; choose another name")
    if cls.make is Task.make:
        raise TypeError(f"task {name!r} ({cls.__qualname__}) must override make(self, length, rng)")
    check_int(f"min_length of task {name!r}", cls.min_length, minimum=1)
    # >= VOCAB_SIZE: batches are padded with the shared PAD token
    check_int(f"vocab_size of task {name!r}", cls.vocab_size, minimum=VOCAB_SIZE, maximum=MAX_TASK_VOCAB)
    _TASKS[name] = cls
    return cls


for _cls in (*SYNTHETIC_TASKS.values(), PasskeyTask):
    register_task(_cls)


def task_names() -> tuple[str, ...]:
    """Every task ``posenc bench`` can run: the registered tasks (built-ins first), then ``lm``."""
    return (*_TASKS, "lm")


def get_task(name: str) -> Task:
    """A new instance of the registered :class:`Task` named ``name``; an unknown name lists
    the valid ones (``lm`` is not a Task: it has no examples)."""
    if not isinstance(name, str):
        raise TypeError(f"task name must be a str, got {type(name).__name__} {name!r}")
    if name not in _TASKS:
        valid = ", ".join(_TASKS)
        hint = " ('lm' is language modelling, not an example task)" if name == "lm" else ""
        raise ValueError(f"unknown task {name!r}; valid tasks: {valid}{hint}")
    return _TASKS[name]()
