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
from dataclasses import dataclass

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
    "get_task",
    "TASK_NAMES",
]

# One small vocabulary for every synthetic task and passkey retrieval.
DIGITS = tuple(range(10))
SEP, PLUS, PAD, KEY, QUERY = 10, 11, 12, 13, 14
FILLER = tuple(range(15, 20))  # the passkey haystack cycles through these
VOCAB_SIZE = 20
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
    """A family of problems indexed by length. Subclasses implement :meth:`make`."""

    name: str = ""
    metric: str = "accuracy"
    min_length: int = 1

    def sample(self, length: int, rng: random.Random, **kwargs) -> Example:
        """A random problem of size ``length``."""
        check_int("length", length, minimum=self.min_length)
        return self.make(length, rng, **kwargs)

    def make(self, length: int, rng: random.Random, **kwargs) -> Example:  # pragma: no cover
        raise NotImplementedError

    def prompt_length(self, length: int) -> int:
        """Tokens in the prompt of a problem of size ``length`` (for RoPE scaling factors)."""
        return length + 1

    def target_length(self, length: int) -> int:
        return length


class Copy(Task):
    name = "copy"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice(DIGITS) for _ in range(n))
        return Example(x + (SEP,), x)


class Reverse(Task):
    name = "reverse"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice(DIGITS) for _ in range(n))
        return Example(x + (SEP,), x[::-1])


class Sort(Task):
    name = "sort"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice(DIGITS) for _ in range(n))
        return Example(x + (SEP,), tuple(sorted(x)))


class Addition(Task):
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
    name = "parity"

    def make(self, n: int, rng: random.Random) -> Example:
        x = tuple(rng.choice((0, 1)) for _ in range(n))
        return Example(x + (SEP,), (sum(x) % 2,))

    def target_length(self, length: int) -> int:
        return 1


class Summation(Task):
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
TASK_NAMES: tuple[str, ...] = (*SYNTHETIC_TASKS, "passkey", "lm")


def get_task(name: str) -> Task:
    """The :class:`Task` named ``name``; an unknown name lists the valid ones."""
    if name == "passkey":
        return PasskeyTask()
    if name not in SYNTHETIC_TASKS:
        valid = ", ".join(t for t in TASK_NAMES if t != "lm")
        raise ValueError(f"unknown task {name!r}; valid tasks: {valid}")
    return SYNTHETIC_TASKS[name]()
