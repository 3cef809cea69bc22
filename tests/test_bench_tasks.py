"""posenc.bench task generators and batches against reference solvers written here.

The solvers below are independent of posenc.bench.tasks: they decode the prompt from the
token layout stated in the docs (digits 0-9, SEP=10, PLUS=11, KEY=13, QUERY=14) and solve
it with plain Python arithmetic (int() on digit strings for addition).
"""

from __future__ import annotations

import random

import pytest
import torch

from posenc.bench.data import IGNORE, ByteCorpus, LMBatches, TaskBatches, collate, example_rng
from posenc.bench.tasks import SYNTHETIC_TASKS, PasskeyTask, get_task

SEP, PLUS, KEY, QUERY = 10, 11, 13, 14


def solve(task: str, prompt: tuple[int, ...]) -> tuple[int, ...]:
    assert prompt[-1] == SEP
    body = list(prompt[:-1])
    if task == "copy":
        return tuple(body)
    if task == "reverse":
        return tuple(reversed(body))
    if task == "sort":
        return tuple(sorted(body))
    if task == "parity":
        assert set(body) <= {0, 1}
        return (sum(body) % 2,)
    if task == "summation":
        return (sum(body) % 10,)
    if task == "addition":
        i = body.index(PLUS)
        a, b = body[:i], body[i + 1 :]
        assert len(a) == len(b)
        # numbers are written least-significant digit first
        total = int("".join(map(str, a[::-1]))) + int("".join(map(str, b[::-1])))
        digits = str(total).zfill(len(a) + 1)
        return tuple(int(c) for c in reversed(digits))
    if task == "selective_copy":  # the digits, in order, without the blanks (FILLER[0] = 15)
        assert body.count(15) == len(body) // 2
        return tuple(t for t in body if t != 15)
    if task == "count":  # the ones among bits, two digits least-significant first
        assert set(body) <= {0, 1}
        return (sum(body) % 10, sum(body) // 10)
    if task == "passkey":
        assert prompt[-2] == QUERY
        ctx = list(prompt[:-2])
        assert ctx.count(KEY) == 1
        k = ctx.index(KEY)
        return tuple(ctx[k + 1 : k + 6])
    raise AssertionError(task)


def problem_size(task: str, prompt: tuple[int, ...]) -> int:
    if task == "addition":
        return (len(prompt) - 2) // 2
    if task == "passkey":
        return len(prompt) - 2
    if task == "selective_copy":
        return (len(prompt) - 1) // 2
    return len(prompt) - 1


@pytest.mark.parametrize("name", [*SYNTHETIC_TASKS, "passkey", "selective_copy", "count"])
def test_every_example_is_solvable_and_sized(name):
    task = get_task(name)
    rng = random.Random(0)
    lo = task.min_length
    for n in range(lo, lo + 25):
        for _ in range(20):
            e = task.sample(n, rng)
            assert problem_size(name, e.prompt) == n
            assert len(e.prompt) == task.prompt_length(n)
            assert len(e.target) == task.target_length(n)
            assert all(isinstance(t, int) and 0 <= t < 20 for t in e.tokens)
            assert e.target == solve(name, e.prompt), (name, e)


def test_exact_formats_by_hand():
    # addition: 47 + 85 = 132, digits least-significant first: a = 7 4, b = 5 8, sum = 2 3 1
    rng = random.Random(3)
    found = (get_task("addition").sample(2, rng) for _ in range(100_000))
    e = next(x for x in found if x.prompt[:2] == (7, 4) and x.prompt[3:5] == (5, 8))
    assert e.prompt == (7, 4, PLUS, 5, 8, SEP) and e.target == (2, 3, 1)
    e = get_task("reverse").sample(3, random.Random(1))
    assert e.prompt[-1] == SEP and e.target == e.prompt[:3][::-1]


def test_passkey_depth_places_key():
    t = PasskeyTask()
    for depth, where in ((0.0, 0), (1.0, 30 - 6)):
        e = t.sample(30, random.Random(0), depth=depth)
        assert e.prompt.index(KEY) == where  # 24 filler tokens before the key at depth 1
        assert len(e.prompt) == 32 and e.prompt[-2:] == (QUERY, SEP)
    with pytest.raises(ValueError, match="depth"):
        t.sample(30, random.Random(0), depth=1.5)


def test_bad_length_and_unknown_task():
    with pytest.raises(ValueError, match="length must be >= 1"):
        get_task("copy").sample(0, random.Random(0))
    with pytest.raises(ValueError, match="valid tasks: copy, reverse, sort, addition, parity, summation, passkey"):
        get_task("multiply")


def test_collate_loss_on_target_only():
    e1 = get_task("copy").sample(2, random.Random(0))  # 2 digits SEP | 2 digits: 5 tokens
    e2 = get_task("copy").sample(3, random.Random(1))  # 7 tokens
    b = collate([e1, e2])
    assert b.inputs.shape == (2, 6)
    # row 0: inputs x1 x2 SEP y1 PAD PAD; labels predict y1 (at SEP) and y2 (at y1)
    assert b.inputs[0].tolist() == list(e1.tokens[:-1]) + [12, 12]
    assert b.labels[0].tolist() == [IGNORE, IGNORE, e1.target[0], e1.target[1], IGNORE, IGNORE]
    assert b.labels[1].tolist() == [IGNORE, IGNORE, IGNORE, *e2.target]
    assert b.num_targets == 5


def test_batches_are_a_function_of_seed_and_step():
    src = TaskBatches(get_task("sort"), 8, 6, seed=5)
    a, b, c = src(3), src(3), src(4)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.inputs[:, :3], c.inputs[:, :3])
    assert example_rng("x", 1).random() == example_rng("x", 1).random()
    sh = a.shard(1, 2)
    assert torch.equal(sh.inputs, a.inputs[1::2])
    with pytest.raises(ValueError, match="divisible"):
        a.shard(0, 3)


def test_lm_batches_are_windows_that_change_with_step():
    stream = torch.arange(1000) % 251
    src = LMBatches(ByteCorpus(stream.to(torch.uint8), stream[:10].to(torch.uint8), "t"), 4, 16, seed=0, key="lm")
    b = src(0)
    assert torch.equal(b.labels[:, :-1], b.inputs[:, 1:])  # labels are the next bytes
    # each row is a contiguous run of the stream
    assert all(torch.equal(torch.diff(row) % 251, torch.ones(15, dtype=torch.long)) for row in b.inputs)
    starts = {tuple(src(s).inputs[:, 0].tolist()) for s in range(20)}
    assert len(starts) == 20  # a new draw at every step
    assert torch.equal(src(7).inputs, src(7).inputs)


# ---- the task registry (register_task) ------------------------------------------------------

from posenc.bench import tasks as tasks_mod  # noqa: E402
from posenc.bench.tasks import Task, register_task, task_names  # noqa: E402
from posenc.bench.tokens import DIGITS, Example  # noqa: E402


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the task registry: tasks registered by a test vanish after it."""
    monkeypatch.setattr(tasks_mod, "_TASKS", dict(tasks_mod._TASKS))
    return tasks_mod._TASKS


def test_builtin_tasks_are_registered_in_order():
    assert task_names() == ("copy", "reverse", "sort", "addition", "parity", "summation", "passkey", "selective_copy",
                            "count", "lm")


def test_selective_copy_and_count_by_hand():
    """selective_copy puts its n digits among n blanks at random places; count writes 10 ones as 0 1."""
    rng = random.Random(0)
    places = {tuple(t == 15 for t in get_task("selective_copy").sample(3, rng).prompt[:-1]) for _ in range(300)}
    assert len(places) == 20  # every choice of 3 blank places among 6
    e = next(x for x in (get_task("count").sample(12, rng) for _ in range(10_000)) if sum(x.prompt[:-1]) == 10)
    assert e.target == (0, 1)


def test_count_refuses_sizes_with_a_three_digit_count():
    from posenc.bench.settings import settings_for

    with pytest.raises(ValueError, match="synthetic_length must be < 50 for task 'count'"):
        settings_for("micro", tasks=["count"], synthetic_length=50)
    with pytest.raises(ValueError, match="size must be < 100, got 100"):
        get_task("count").make(100, random.Random(0))


def test_a_custom_task_is_one_class_and_one_decorator(registry):
    @register_task
    class Double(Task):
        """Write each digit twice."""

        name = "double"
        min_length = 2

        def make(self, n, rng):
            x = tuple(rng.choice(DIGITS) for _ in range(n))
            return Example(x + (SEP,), tuple(d for d in x for _ in range(2)))

    assert task_names()[-2:] == ("lm", "double")
    t = get_task("double")
    assert isinstance(t, Double)
    e = t.sample(3, random.Random(0))
    body = e.prompt[:-1]
    assert e.target == (body[0], body[0], body[1], body[1], body[2], body[2])  # by hand from the rule
    with pytest.raises(ValueError, match="length must be >= 2, got 1"):
        t.sample(1, random.Random(0))
    # batches of the custom task: loss on its target tokens only
    b = TaskBatches(t, batch_size=4, max_length=3, seed=0)(0)
    assert b.inputs.shape[0] == 4 and b.num_targets > 0


def test_register_task_refuses_bad_classes(registry):
    class NoMake(Task):
        name = "nomake"

    with pytest.raises(TypeError, match="task 'nomake' \\(.*NoMake\\) must override make"):
        register_task(NoMake)
    with pytest.raises(TypeError, match="register_task needs a subclass of posenc.bench.tasks.Task, got <class 'int'>"):
        register_task(int)

    class Copy2(Task):
        name = "copy"

        def make(self, n, rng):
            return Example((SEP,), (1,))

    with pytest.raises(ValueError, match="task 'copy' is already registered"):
        register_task(Copy2)
    Copy2.name = "lm"
    with pytest.raises(ValueError, match="task 'lm' is already registered"):
        register_task(Copy2)
    Copy2.name = "Bad Name"
    with pytest.raises(ValueError, match="must be lowercase letters, digits and '_' starting with a letter, got 'Bad Name'"):
        register_task(Copy2)
    Copy2.name, Copy2.min_length = "ok", 0
    with pytest.raises(ValueError, match="min_length of task 'ok' must be >= 1, got 0"):
        register_task(Copy2)
    Copy2.min_length, Copy2.vocab_size = 1, 10
    with pytest.raises(ValueError, match=r"vocab_size of task 'ok' must be in \[20, 65536\], got 10"):
        register_task(Copy2)
    assert "ok" not in task_names()


def test_a_task_emitting_bad_tokens_is_named(registry):
    @register_task
    class Wild(Task):
        name = "wild"

        def make(self, n, rng):
            return Example((1, 2, SEP), (25,) if n == 1 else ())

    with pytest.raises(ValueError, match=r"task 'wild': tokens must be ints in \[0, 20\), got 25 in an example of length 1"):
        get_task("wild").sample(1, random.Random(0))
    with pytest.raises(ValueError, match="task 'wild': prompt and target must be non-empty"):
        get_task("wild").sample(2, random.Random(0))
    with pytest.raises(ValueError, match="^unknown task 'multiply'; valid tasks: copy, .*, passkey, selective_copy, count, lm, wild$"):
        get_task("multiply")


def test_every_task_is_a_task_object():
    """lm and passkey are registered Task objects: metric, unit, lengths and batches come from
    the task, so nothing branches on a task's name."""
    from posenc.bench.settings import settings_for

    s = settings_for("micro")
    lm, pk, copy = get_task("lm"), get_task("passkey"), get_task("copy")
    assert (lm.metric, lm.unit, lm.vocab_size, lm.uses_corpus) == ("ppl", "bytes", 256, True)
    assert (pk.metric, pk.unit, copy.metric) == ("accuracy", "tokens", "accuracy")
    assert lm.train_length(s) == s.lm_length == 16 and lm.eval_lengths(s) == [16, 32] and lm.max_positions(s) == 32
    assert pk.train_length(s) == 12 and pk.eval_lengths(s) == [12, 24] and pk.eval_depths(s) == (0.0, 1.0)
    assert pk.max_positions(s) == 24 + 2 + 5  # the longest context, QUERY SEP and the key
    assert copy.eval_lengths(s) == list(range(1, 9)) and copy.max_positions(s) == 9 + 8
    assert (lm.batch_size(s), pk.batch_size(s)) == (s.lm_batch_size, s.batch_size)
    assert lm.describe().startswith("byte-level language modelling")
    stream = torch.arange(200) % 256
    corpus = ByteCorpus(stream.to(torch.uint8), stream[:40].to(torch.uint8), "t")
    b = lm.batches(s, 0, corpus)(0)
    assert b.inputs.shape == (s.lm_batch_size, 16)
    with pytest.raises(ValueError, match="the lm task needs a corpus"):
        lm.batches(s, 0, None)
