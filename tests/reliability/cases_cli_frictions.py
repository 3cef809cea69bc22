"""What a new user hit with ``bench --model`` and ``extend`` on a real checkpoint: a scaling the
default grid runs refused by the parser, a fractional length, a multimodal config read by the
wrong check, a check that waited for the weights, a demonstration written as if shipped, counts
without a bound, a length blamed on the corpus.

No case loads a model: each checkpoint is a config.json beside a safetensors file that holds no
model weight (loading it would fail), so a refusal here came before any weight was read.
"""

from __future__ import annotations

import contextlib
import json
import struct
import tempfile
from pathlib import Path
from typing import Callable

from . import Case

A = "cli: bench --model and extend"

_LLAMA = dict(model_type="llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
              intermediate_size=64, vocab_size=260, max_position_embeddings=64, rope_theta=10000.0)
# Qwen2-VL as transformers 5 writes it: the language model's M-RoPE in text_config, no rope key at the top
_QWEN2_VL = dict(model_type="qwen2_vl", vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2),
                 text_config=dict(model_type="qwen2_vl_text", hidden_size=32, num_attention_heads=4,
                                  num_key_value_heads=2, num_hidden_layers=2, intermediate_size=64, vocab_size=260,
                                  max_position_embeddings=64,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                   "mrope_section": [2, 1, 1]}))
_HEADER = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()


def _in_tmp(fn: Callable[[], object]) -> Callable[[], object]:
    """Run ``fn`` in a fresh folder."""

    def run() -> object:
        with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
            return fn()

    return run


def _folder(config: dict, name: str = "ckpt") -> Path:
    p = Path(name)
    p.mkdir()
    (p / "config.json").write_text(json.dumps(config))
    (p / "model.safetensors").write_bytes(struct.pack("<Q", len(_HEADER)) + _HEADER + b"\0" * 16)
    return p


def _extend(config: dict, to: int, out: str | None = None, data: str | None = None, **kw) -> Callable[[], object]:
    def run() -> object:
        from posenc.hf.extend import ExtendSettings, extend

        if data is not None:
            Path("small.txt").write_text(data)
        return extend(_folder(config), ExtendSettings(to=to, data=None if data is None else "small.txt", **kw), out,
                      progress=False)

    return _in_tmp(run)


def _bench_model(config: dict, **kw) -> Callable[[], object]:
    def run() -> object:
        from posenc.hf.bench_settings import model_settings

        return model_settings("micro", _folder(config), **kw)

    return _in_tmp(run)


def _fractional_lm_factor() -> object:
    """bench --model --lm-eval-factors 1.5 0.333: the lengths the lm task reads, rounded to whole tokens."""
    from posenc.hf.checkpoint import ByteTokenizer
    from posenc.hf.tasks import model_task

    s, _ = _bench_model(_LLAMA, overrides={"lm_eval_factors": (1.5, 0.333)})()
    lengths = model_task("lm")(ByteTokenizer(260)).eval_lengths(s)
    return f"L = {s.trained_length}: lm lengths {lengths} tokens"


def _stale_temporary() -> object:
    """A hidden folder a killed extend left beside --out (its writer, pid 2^22 + 1, is past Linux's
    largest pid: no such process)."""
    from posenc.hf.extend import clean_stale_temporaries

    stale = Path(f".out.tmp-{2**22 + 1}")
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x")
    gone = clean_stale_temporaries("out")
    return f"removed {[p.name for p in gone]}; left {sorted(p.name for p in Path().iterdir())}"


def _bench(*flags: str) -> list[str]:
    return ["bench", "--preset", "micro", *flags, "--out", "/no/such/dir/bench"]


CASES = [
    Case(A, "`posenc bench --scalings llama3` without --model (the synthetic bench does not run Llama 3)",
         r"--scalings llama3: the synthetic bench evaluates linear, ntk, dynamic, yarn; every scaling of linear, ntk, "
         r"dynamic, yarn, llama3 applies with --model", argv=_bench("--scalings", "llama3")),
    Case(A, "`posenc bench --scalings nope`", r"argument --scalings: must be one of linear, ntk, dynamic, yarn, llama3, "
         r"got 'nope'", argv=_bench("--scalings", "nope")),
    Case(A, "`posenc bench --lm-eval-factors 1.5` without --model (lm lengths are whole multiples of L bytes)",
         r"--lm-eval-factors 1\.5: the synthetic bench's lm lengths are whole multiples of L \(bytes\); a fraction of "
         r"L applies with --model", argv=_bench("--lm-eval-factors", "1.5")),
    Case(A, "`posenc bench --lm-eval-factors 2000`", r"argument --lm-eval-factors: must be a float in \(0, 1024\], "
         r"got 2000", argv=_bench("--lm-eval-factors", "2000")),
    Case(A, "`posenc bench --model --lm-eval-factors 1.5 0.333` (L = 64)",
         r"L = 64: lm lengths \[21, 96\] tokens", _in_tmp(_fractional_lm_factor), error=None),
    Case(A, "`posenc bench --model` on Qwen2-VL (M-RoPE in text_config)",
         r"MODEL 'ckpt': model_type 'qwen2_vl' rotates with M-RoPE \(time, height and width sections\): bench --model "
         r"evaluates text models with a 1-D RoPE", _bench_model(_QWEN2_VL)),
    Case(A, "`posenc extend` on Qwen2-VL (M-RoPE in text_config, no rope key at the top)",
         r"model_type 'qwen2_vl' rotates with M-RoPE \(time, height and width sections\): extend cannot write a "
         r"scaled M-RoPE", _extend(_QWEN2_VL, 128)),
    Case(A, "`posenc extend --trained-length 32 --out DIR` (a demonstration written as a checkpoint)",
         r"--out with --trained-length 32, shorter than the model's own 64: a demonstration's config\.json would "
         r"look like a shipped extension; drop --out \(the table is the result\) or --trained-length",
         _extend(_LLAMA, 64, out="out", trained_length=32)),
    Case(A, "`posenc extend --to 4096` with a corpus of ~900 tokens (the length blamed, not the corpus)",
         r"^--to 4096 with --windows 1 \(windows of N tokens, and one more\) needs 4097 tokens of text; the validation "
         r"part of --data 'small\.txt' is \d+: ask for fewer tokens, or give a larger corpus with --data$",
         _extend(_LLAMA, 4096, data="alpha beta gamma delta\n" * 400)),
    Case(A, "`posenc extend --to 10000000`", r"argument --to: must be an int in \[2, 1048576\], got 10000000",
         argv=["extend", "smollm2-135m", "--to", "10000000"]),
    Case(A, "`posenc extend --passkey-examples 1000000000`",
         r"argument --passkey-examples: must be an int in \[1, 1000\], got 1000000000",
         argv=["extend", "smollm2-135m", "--to", "16384", "--passkey-examples", "1000000000"]),
    Case(A, "`posenc extend --passkey-examples 1e9`", r"argument --passkey-examples: must be an int in \[1, 1000\], "
         r"got '1e9'", argv=["extend", "smollm2-135m", "--to", "16384", "--passkey-examples", "1e9"]),
    Case(A, "`posenc extend --windows 5000`", r"argument --windows: must be an int in \[1, 1000\], got 5000",
         argv=["extend", "smollm2-135m", "--to", "16384", "--windows", "5000"]),
    Case(A, "`posenc extend --threads 100000`", r"argument --threads: must be an int in \[1, 4096\], got 100000",
         argv=["extend", "smollm2-135m", "--to", "16384", "--threads", "100000"]),
    Case(A, "ExtendSettings(passkey_examples=10**9)", r"--passkey-examples must be in \[1, 1000\], got 1000000000",
         lambda: __import__("posenc.hf.extend", fromlist=["x"]).ExtendSettings(to=128, passkey_examples=10**9)),
    Case(A, "`posenc probe --tokens 10000000`", r"argument --tokens: must be an int in \[2, 1048576\], got 10000000",
         argv=["probe", "smollm2-135m", "--tokens", "10000000", "--out", "/no/such/dir/probe"]),
    Case(A, "a hidden temporary folder a killed `extend` left beside --out (its writer gone)",
         r"removed \['\.out\.tmp-4194305'\]; left \[\]", _in_tmp(_stale_temporary), error=None),
]
