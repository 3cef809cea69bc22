"""The RULER tasks of ``bench --model`` (multikey, vartrack) on lengths too short for their prompts.

Byte-level tokenizer (no files, no model): a multi-key prompt needs 597 tokens, a variable
tracking prompt 474, so a tiny model's micro lengths (256 and 512 at L = 256) are short.
"""

from __future__ import annotations

import contextlib
import io

from . import Case

A = "hf tasks (RULER)"


def _task(name: str):
    from posenc.hf.checkpoint import ByteTokenizer
    from posenc.hf.tasks import model_task

    return model_task(name)(ByteTokenizer(260))


def _sample(name: str, n: int):
    def run() -> object:
        from posenc.bench.data import example_rng

        return _task(name).sample(n, example_rng("x"), depth=0.5)

    return run


def _lengths(name: str, factors: tuple[float, ...]):
    def run() -> object:
        from posenc.hf.bench_settings import ModelBenchSettings

        s = ModelBenchSettings(model="m", fingerprint="f", trained_length=256, passkey_eval_factors=factors)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            lengths = _task(name).eval_lengths(s)
        return f"lengths {lengths}; stderr: {err.getvalue().strip()}"

    return run


def _no_names_fit() -> object:
    """A tokenizer that spells the widest reference names in one token and every other name in
    bytes: no sampled name fits the width min_length was computed for."""
    from posenc.bench.data import example_rng
    from posenc.hf.checkpoint import ByteTokenizer
    from posenc.hf.tasks import VariableTracking

    class Odd(ByteTokenizer):
        def encode(self, text: str) -> list[int]:
            return [81] if text.strip() in ("QZXJV", "XJQZK", "VKXQJ") else super().encode(text)

    task = VariableTracking(Odd(260))
    return task.sample(task.min_length, example_rng("x"), depth=0.5)


CASES = [
    Case(A, "a multikey example shorter than its prompt", r"^length must be >= 597, got 596$", _sample("multikey", 596)),
    Case(A, "a vartrack example shorter than its prompt", r"^length must be >= 474, got 100$", _sample("vartrack", 100)),
    Case(A, "`bench --model --tasks multikey` where every length is shorter than a prompt",
         r"^every multikey length \(256, 512\) is shorter than a multikey prompt \(597 tokens\); use --tasks lm$",
         _lengths("multikey", (1.0, 2.0))),
    Case(A, "`bench --model --tasks vartrack` where some lengths are shorter than a prompt",
         r"^lengths \[512\]; stderr: posenc bench: vartrack lengths \[256\] are shorter than a vartrack prompt "
         r"\(474 tokens\): skipped$", _lengths("vartrack", (1.0, 2.0)), error=None),
    Case(A, "a tokenizer that spells every sampled variable name wider than min_length allows",
         r"^the tokenizer encodes too few sampled 5-letter names in at most 1 tokens$", _no_names_fit),
]
