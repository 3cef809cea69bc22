"""posenc bench under faults: damaged checkpoints and weights, lost settings, non-finite
numbers (issue 10, part 2). Each case works in a fresh temporary folder (its current
directory while it runs), so the messages name short relative paths."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch

from . import Case

A = "bench"


def _in_tmp(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with a fresh temporary folder as the current directory."""

    def run() -> object:
        with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
            return fn()

    return run


def _saved(tensors: dict | None = None) -> Path:
    from posenc.files import save_tensors

    p = Path("ckpt.safetensors")
    save_tensors(p, tensors or {"w": torch.arange(8, dtype=torch.float32)}, {})
    return p


def _data_start(p: Path) -> int:
    return 8 + int.from_bytes(p.read_bytes()[:8], "little")


def _load(p: Path) -> object:
    from posenc.files import load_tensors

    return load_tensors(p)


def _flipped() -> object:
    p = _saved()
    raw = bytearray(p.read_bytes())
    raw[_data_start(p) + 5] ^= 0xFF
    p.write_bytes(bytes(raw))
    return _load(p)


def _nan_bytes() -> object:
    p = _saved()
    raw = bytearray(p.read_bytes())
    i = _data_start(p)
    raw[i : i + 4] = bytes.fromhex("0000c07f")  # float32 NaN, little-endian
    p.write_bytes(bytes(raw))
    return _load(p)


def _truncated() -> object:
    p = _saved()
    p.write_bytes(p.read_bytes()[:-10])
    return _load(p)


def _empty() -> object:
    p = _saved()
    p.write_bytes(b"")
    return _load(p)


def _no_checksum() -> object:
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, "ckpt.safetensors")
    return _load(Path("ckpt.safetensors"))


def _nan_saved() -> object:
    return _load(_saved({"w": torch.tensor([1.0, math.nan])}))


def _missing_weights() -> object:
    from posenc.bench.train import verify_weights

    return verify_weights("run/model.safetensors")


def _settings(**over):
    from posenc.bench.settings import run_settings, settings_for

    return run_settings(settings_for("micro", encodings=["none"], tasks=["copy"], **over), "copy", "none", 0)


def _other_settings() -> object:
    from posenc.results import check_run_dir

    run = Path("run")
    run.mkdir()
    check_run_dir(run, _settings(steps=3), trust_unrecorded=False)  # records run.json
    return check_run_dir(run, _settings(steps=5), trust_unrecorded=False)


def _unrecorded_run() -> object:
    from posenc.results import check_run_dir

    run = Path("run")
    run.mkdir()
    (run / "result.json").write_text("{}")
    return check_run_dir(run, _settings(), trust_unrecorded=False)


def _bad_bench_json() -> object:
    from posenc.results import check_out_dir
    from posenc.bench.settings import settings_for

    out = Path("out")
    out.mkdir()
    (out / "bench.json").write_text('{"steps": 3, ')
    return check_out_dir(out, settings_for("micro"), resume=True, overwrite=False)


def _refuse(literal: str) -> None:
    raise ValueError(f"non-standard JSON literal {literal}")


def _nan_loss_json() -> str:
    from posenc.files import write_json

    write_json("result.json", {"train_loss": math.nan, "ppl": [2.5, math.inf]})
    text = Path("result.json").read_text()
    json.loads(text, parse_constant=_refuse)  # strict: NaN/Infinity literals raise
    return f"strict JSON, non-finite as null: {text}"


def _final_loss_resumed() -> str:
    from posenc import ModelConfig, Transformer
    from posenc.bench.data import TaskBatches
    from posenc.bench.tasks import get_task
    from posenc.bench.tokens import VOCAB_SIZE
    from posenc.bench.train import TrainConfig, train

    def fit():
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=VOCAB_SIZE, d_model=8, n_layer=1, n_head=2, encoding="none"))
        return train(model, TaskBatches(get_task("copy"), 2, 3, 0), TrainConfig(steps=2, warmup_steps=1),
                     checkpoint="ckpt.safetensors", progress=False)

    first, again = fit(), fit()  # the second finds the finished checkpoint: no step is taken
    assert first.last_loss == again.last_loss and math.isfinite(again.last_loss)
    return "the loss of its last step, from the checkpoint (not NaN)"


def _lock_held() -> str:
    from posenc.files import OutDirLock

    with OutDirLock("out"):
        try:
            with OutDirLock("out"):
                pass
        except ValueError as e:  # the pid varies from run to run: the case shows it as PID
            return f"refused: {str(e).replace(str(os.getpid()), 'PID')}"
    return "not refused"


CASES = [
    Case(A, "checkpoint with bytes flipped in its tensor data", r"checkpoint ckpt.safetensors is corrupt: its sha256 does not match.*left in place",
         run=_in_tmp(_flipped)),
    Case(A, "checkpoint with NaN written over its tensor data", r"checkpoint ckpt.safetensors is corrupt: its sha256 does not match",
         run=_in_tmp(_nan_bytes)),
    Case(A, "truncated checkpoint", r"checkpoint ckpt.safetensors is unreadable \(truncated or corrupt", run=_in_tmp(_truncated)),
    Case(A, "empty checkpoint", r"checkpoint ckpt.safetensors is empty; it was left in place", run=_in_tmp(_empty)),
    Case(A, "checkpoint without a checksum (older posenc)", r"has no checksum", run=_in_tmp(_no_checksum)),
    Case(A, "checkpoint saved with NaN weights (valid checksum)", r"checkpoint ckpt.safetensors holds NaN or inf in w", run=_in_tmp(_nan_saved)),
    Case(A, "`--resume` where a finished run's model.safetensors is gone", r"weights run/model.safetensors is missing",
         run=_in_tmp(_missing_weights)),
    Case(A, "`--resume` of a run trained with other settings (bench.json gone)",
         r"run was trained with other settings \(earlier, now\): \{'steps': \(3, 5\)\}", run=_in_tmp(_other_settings)),
    Case(A, "`--resume` of a finished run with no run.json and no bench.json", r"no run.json recording its settings",
         run=_in_tmp(_unrecorded_run)),
    Case(A, "`--resume` with a corrupt bench.json", r"bench.json is not valid JSON; use --overwrite", run=_in_tmp(_bad_bench_json)),
    Case(A, "a NaN loss or infinite perplexity written to JSON", r'"train_loss": null', run=_in_tmp(_nan_loss_json), error=None),
    Case(A, "run resumed after its last step (evaluation interrupted): train_loss", r"not NaN",
         run=_in_tmp(_final_loss_resumed), error=None),
    Case(A, "a second `posenc bench` on the same --out", r"refused: --out out is in use by another posenc bench \(pid PID\)",
         run=_in_tmp(_lock_held), error=None),
]
