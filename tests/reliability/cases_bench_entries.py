"""posenc bench's encoding entries and CoPE's tasks (issue 30): a training option or an ``L`` value
that cannot be read, and a count whose answer would need a third digit."""

from __future__ import annotations

from . import Case

A = "bench entries and counting tasks"


def _bench(*specs: str, tasks=("copy",)) -> list[str]:
    return ["bench", "--preset", "micro", "--tasks", *tasks, "--encodings", *specs, "--out", "/tmp/never_written_h30"]


CASES = [
    Case(A, "randomized positions from a range of 0 times the evaluation", r"encoding spec 'rope:randomized_positions=0': "
         r"randomized_positions must be >= 1, got 0", argv=_bench("rope:randomized_positions=0")),
    Case(A, "randomized positions given a fraction", r"randomized_positions must be an int, got '1.5'",
         argv=_bench("rope:randomized_positions=1.5")),
    Case(A, "a training option without a value", r"randomized_positions needs a value",
         argv=_bench("rope:randomized_positions")),
    Case(A, "the training length L for a float config value", r"encoding spec 'rope:base=L': base=L needs an int "
         r"config key \(L is the training length in tokens\)", argv=_bench("rope:base=L")),
    Case(A, "HoPE without its trained length", r"original_max_position_embeddings is required for rope type 'hope'",
         argv=_bench("rope:scaling=hope")),
    Case(A, "a count tested past 99 ones", r"synthetic_length must be < 50 for task 'count' \(its count has 2 digits "
         r"and is tested up to 2L\), got 50", argv=[*_bench("rope", tasks=("count",)), "--synthetic-length", "50"]),
]
