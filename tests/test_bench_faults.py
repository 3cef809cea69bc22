"""posenc bench under faults: a second writer, lost bench.json, damaged checkpoints and weights,
an interrupted evaluation. Nothing is lost, nothing damaged is trained from or deleted."""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posenc import ModelConfig, Transformer
from posenc.bench import runner
from posenc.results import settings_hash
from posenc.bench.settings import run_settings, settings_for
from posenc.bench.data import TaskBatches
from posenc.files import OutDirLock, finite_or_none, load_tensors, save_tensors, tensors_checksum, write_json
from posenc.bench.tasks import Task, get_task
from posenc.bench.tokens import VOCAB_SIZE
from posenc.bench.train import TrainConfig, train
from posenc.cli import main

REPO = Path(__file__).resolve().parents[1]
FAST = ["bench", "--preset", "micro", "--tasks", "copy", "--encodings", "none", "--no-progress"]


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = main(argv)
    err = capsys.readouterr().err
    return code, [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("usage:", " ", "posenc bench: corpus"))]


def strict_json(path: Path):
    """Parse as strict JSON: NaN/Infinity literals are an error."""
    def refuse(token):
        raise AssertionError(f"{path} holds the non-standard JSON literal {token}")
    return json.loads(path.read_text(), parse_constant=refuse)


def _ctrl_c(*args, **kwargs):
    """Stands in for Task.evaluate: a Ctrl-C during the evaluation."""
    raise KeyboardInterrupt


# --------------------------------------------------------------------------- files.py units


def test_checksum_is_of_names_dtypes_shapes_and_bytes():
    a = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.zeros(2, dtype=torch.bfloat16)}
    h = tensors_checksum(a)
    assert tensors_checksum({"b": a["b"].clone(), "w": a["w"].clone()}) == h  # order-free
    assert tensors_checksum(dict(a, w=a["w"].reshape(3, 2))) != h  # same bytes, other shape
    assert tensors_checksum(dict(a, w=a["w"].to(torch.int32).view(torch.float32))) != h  # other bytes
    assert tensors_checksum({"v": a["w"], "b": a["b"]}) != h  # other name
    flipped = a["w"].clone()
    flipped.view(torch.int32)[0, 0] ^= 1  # one bit of the first float
    assert tensors_checksum(dict(a, w=flipped)) != h


def test_checksum_is_sha256_of_the_little_endian_bytes_written_out_by_hand():
    import hashlib

    w = torch.tensor([[1.5, -2.0], [0.25, 3.0]]).t()  # non-contiguous: hashed in its logical order
    b = torch.tensor([1.0, -0.5], dtype=torch.bfloat16)
    e = torch.zeros(0, 3)
    h = hashlib.sha256()
    h.update(b"b|torch.bfloat16|(2,)|" + struct.pack("<2H", 0x3F80, 0xBF00))  # bfloat16 = float32's top 16 bits
    h.update(b"e|torch.float32|(0, 3)|")
    h.update(b"w|torch.float32|(2, 2)|" + struct.pack("<4f", 1.5, 0.25, -2.0, 3.0))
    assert tensors_checksum({"w": w, "b": b, "e": e}) == h.hexdigest()
    # a lazy conjugate or negative view is hashed by its values, not by the memory under it
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert tensors_checksum({"z": z.conj()}) == tensors_checksum({"z": z.conj().resolve_conj()}) != tensors_checksum({"z": z})


def test_strict_json_writes_null_for_non_finite(tmp_path):
    obj = {"loss": math.nan, "ppl": [1.5, math.inf, -math.inf], "n": 3, "t": (0.5,)}
    assert finite_or_none(obj) == {"loss": None, "ppl": [1.5, None, None], "n": 3, "t": [0.5]}
    write_json(tmp_path / "x.json", obj)
    assert strict_json(tmp_path / "x.json") == {"loss": None, "ppl": [1.5, None, None], "n": 3, "t": [0.5]}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary left


def test_lock_is_exclusive_and_released(tmp_path):
    with OutDirLock(tmp_path / "o"):
        assert (tmp_path / "o" / ".lock").read_text().strip() == str(os.getpid())
        with pytest.raises(ValueError, match=rf"--out {tmp_path / 'o'} is in use by another posenc bench \(pid {os.getpid()}\)"):
            with OutDirLock(tmp_path / "o"):  # a second open file description: flock refuses it
                pass
    with OutDirLock(tmp_path / "o"):  # released on exit
        pass


# --------------------------------------------------------------------------- damaged checkpoints


def _tiny() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=VOCAB_SIZE, d_model=16, n_layer=1, n_head=2, encoding="none"))


def _train(ckpt: Path, stop_after: int | None = None):
    model = _tiny()
    batches = TaskBatches(get_task("copy"), batch_size=4, max_length=5, seed=0)
    cfg = TrainConfig(steps=6, warmup_steps=1, checkpoint_every=2)
    return model, train(model, batches, cfg, checkpoint=ckpt, stop_after=stop_after, progress=False)


def _data_offset(path: Path) -> int:
    """Start of the tensor bytes: 8-byte little-endian header length, then the JSON header."""
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + n


def _flip_bytes(p: Path) -> None:
    raw = bytearray(p.read_bytes())
    i = _data_offset(p) + 16
    raw[i : i + 4] = bytes(b ^ 0xFF for b in raw[i : i + 4])
    p.write_bytes(bytes(raw))


def _write_nan(p: Path) -> None:
    raw = bytearray(p.read_bytes())
    header = json.loads(raw[8 : _data_offset(p)])
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
    start = _data_offset(p) + header[name]["data_offsets"][0]
    raw[start : start + 4] = struct.pack("<f", math.nan)
    p.write_bytes(bytes(raw))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _empty(p: Path) -> None:
    p.write_bytes(b"")


DAMAGE = {
    "bytes flipped": (_flip_bytes, "is corrupt: its sha256 does not match"),
    "NaN written": (_write_nan, "is corrupt: its sha256 does not match"),
    "truncated": (_truncate, r"is unreadable \(truncated or corrupt"),
    "empty": (_empty, "is empty"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_checkpoint_is_refused_and_kept(tmp_path, damage):
    ckpt = tmp_path / "ckpt.safetensors"
    _train(ckpt, stop_after=2)
    fn, message = DAMAGE[damage]
    fn(ckpt)
    before = ckpt.read_bytes()
    with pytest.raises(ValueError, match=rf"checkpoint {ckpt} {message}.*left in place"):
        _train(ckpt)
    assert ckpt.read_bytes() == before  # neither deleted nor overwritten


def test_checkpoint_with_a_valid_checksum_but_nan_is_refused(tmp_path):
    p = tmp_path / "w.safetensors"
    save_tensors(p, {"a": torch.tensor([1.0, math.nan]), "steps": torch.tensor([3])}, {})
    with pytest.raises(ValueError, match=rf"checkpoint {p} holds NaN or inf in a;"):
        load_tensors(p)
    # final weights of a run that diverged are its result, not damage: only the checksum counts
    from posenc.bench.train import verify_weights

    a = verify_weights(p)["a"]
    assert a[0].item() == 1.0 and a.isnan().tolist() == [False, True]
    save_tensors(p, {"a": torch.tensor([1.0, 2.0])}, {"k": "v"})
    tensors, meta = load_tensors(p)
    assert torch.equal(tensors["a"], torch.tensor([1.0, 2.0])) and meta == {"k": "v"}


def test_checkpoint_without_checksum_is_refused(tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "old.safetensors"
    save_file({"a": torch.ones(2)}, str(p))
    with pytest.raises(ValueError, match="has no checksum"):
        load_tensors(p)
    with pytest.raises(ValueError, match="checkpoint .*missing.safetensors is missing"):
        load_tensors(tmp_path / "missing.safetensors")


# --------------------------------------------------------------------------- the bench end to end


def _run_dir(out: Path) -> Path:
    return out / "runs" / "copy" / "none" / "seed0"


def test_damaged_checkpoint_in_a_bench_run_is_refused_by_the_cli(tmp_path, capsys, monkeypatch):
    out = tmp_path / "b"
    # stop the training after its first checkpoint, as a Ctrl-C would
    real_train = runner.train
    monkeypatch.setattr(runner, "train", lambda *a, **k: real_train(*a, **dict(k, stop_after=1)))
    monkeypatch.setattr(Task, "evaluate", _ctrl_c)
    code, lines = run_cli([*FAST, "--out", str(out)], capsys)
    assert code == 130 and lines == ["posenc: interrupted"]
    ckpt = _run_dir(out) / "checkpoint.safetensors"
    _flip_bytes(ckpt)
    before = ckpt.read_bytes()
    monkeypatch.undo()
    code, lines = run_cli([*FAST, "--out", str(out), "--resume"], capsys)
    assert code == 2 and len(lines) == 1
    assert lines[0] == (f"posenc bench: error: checkpoint {ckpt} is corrupt: its sha256 does not match the one "
                        "saved with it; it was left in place: delete it to retrain, or restore it")
    assert ckpt.read_bytes() == before
    assert not (_run_dir(out) / "result.json").exists()


def test_truncated_final_weights_are_refused_on_resume(tmp_path, capsys):
    out = tmp_path / "b"
    assert run_cli([*FAST, "--out", str(out)], capsys)[0] == 0
    weights = _run_dir(out) / "model.safetensors"
    intact = weights.read_bytes()
    _truncate(weights)
    before = weights.read_bytes()
    code, lines = run_cli([*FAST, "--out", str(out), "--resume"], capsys)
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(f"posenc bench: error: weights {weights} is unreadable (truncated or corrupt")
    assert weights.read_bytes() == before and (_run_dir(out) / "result.json").exists()
    # a damaged result.json (an editor, a full disk) is refused too, naming it
    weights.write_bytes(intact)
    result = _run_dir(out) / "result.json"
    result.write_text('{"task": "copy", ')
    code, lines = run_cli([*FAST, "--out", str(out), "--resume"], capsys)
    assert code == 2 and lines == [f"posenc bench: error: --resume: {result} is not valid JSON; "
                                   "delete it to evaluate that run again"]
    weights.unlink()  # gone entirely: refused too
    code, lines = run_cli([*FAST, "--out", str(out), "--resume"], capsys)
    assert code == 2 and lines == [f"posenc bench: error: weights {weights} is missing"]


def test_interrupted_evaluation_is_redone_with_strict_json(tmp_path, capsys, monkeypatch):
    ref = tmp_path / "ref"
    assert run_cli([*FAST, "--out", str(ref)], capsys)[0] == 0
    expected = strict_json(_run_dir(ref) / "result.json")

    out = tmp_path / "b"
    monkeypatch.setattr(Task, "evaluate", _ctrl_c)
    code, lines = run_cli([*FAST, "--out", str(out)], capsys)
    assert code == 130 and lines == ["posenc: interrupted"]
    assert (_run_dir(out) / "checkpoint.safetensors").exists() and not (_run_dir(out) / "result.json").exists()
    monkeypatch.undo()
    assert run_cli([*FAST, "--out", str(out), "--resume"], capsys)[0] == 0
    got = strict_json(_run_dir(out) / "result.json")
    assert math.isfinite(got["train_loss"])
    # the same numbers as the run that was never interrupted (training is bitwise resumable;
    # only the wall time differs)
    for record in (got, expected):
        record.pop("train_seconds")
    assert got == expected
    assert not (_run_dir(out) / "checkpoint.safetensors").exists()  # removed only once the result is safe
    for name in ("results.json", "bench.json", "runs/copy/none/seed0/run.json"):
        strict_json(out / name)


def test_results_with_non_finite_values_are_strict_and_read_back(tmp_path, capsys):
    out = tmp_path / "b"
    assert run_cli([*FAST, "--out", str(out)], capsys)[0] == 0
    # copy evaluates lengths 1..2L: in/beyond both exist; lm at factors (1, 2); make one NaN
    from posenc.results import read_results
    from posenc.bench.report import write_outputs
    from posenc.bench.summary import collect

    results = read_results(out)
    run = results["runs"][0]
    run["points"][0]["value"] = math.nan
    run["train_loss"] = math.inf
    write_outputs(collect(results["settings"], results["runs"]), out)
    raw = strict_json(out / "results.json")
    assert raw["runs"][0]["points"][0]["value"] is None and raw["runs"][0]["train_loss"] is None
    back = read_results(out)
    assert math.isnan(back["runs"][0]["points"][0]["value"]) and math.isnan(back["runs"][0]["train_loss"])


def test_resume_without_bench_json_never_reuses_other_settings(tmp_path, capsys):
    out = tmp_path / "b"
    assert run_cli([*FAST, "--steps", "3", "--out", str(out)], capsys)[0] == 0
    result = _run_dir(out) / "result.json"
    first = result.read_bytes()
    (out / "bench.json").unlink()
    code, lines = run_cli([*FAST, "--steps", "5", "--out", str(out), "--resume"], capsys)
    assert code == 2 and len(lines) == 1
    assert f"--resume: {_run_dir(out)} was trained with other settings (earlier, now): {{'steps': (3, 5)}}" in lines[0]
    assert result.read_bytes() == first
    # the same settings: the finished run is reused as it is
    assert run_cli([*FAST, "--steps", "3", "--out", str(out), "--resume"], capsys)[0] == 0
    assert result.read_bytes() == first
    # a run without its run.json (an older posenc) cannot be checked without bench.json: refused
    (out / "bench.json").unlink()
    (_run_dir(out) / "run.json").unlink()
    code, lines = run_cli([*FAST, "--steps", "3", "--out", str(out), "--resume"], capsys)
    assert code == 2 and "holds result.json, model.safetensors but no run.json recording its settings" in lines[0]
    assert result.read_bytes() == first


def test_resume_with_a_matching_bench_json_adopts_runs_without_run_json(tmp_path, capsys):
    out = tmp_path / "b"
    assert run_cli([*FAST, "--out", str(out)], capsys)[0] == 0
    (_run_dir(out) / "run.json").unlink()
    assert run_cli([*FAST, "--out", str(out), "--resume"], capsys)[0] == 0
    recorded = strict_json(_run_dir(out) / "run.json")
    assert recorded["settings"] == run_settings(settings_for("micro", encodings=["none"], tasks=["copy"]), "copy", "none", 0)
    assert recorded["hash"] == settings_hash(recorded["settings"])


# --------------------------------------------------------------------------- two processes


def test_second_bench_on_the_same_out_is_refused_while_the_first_runs(tmp_path):
    out = tmp_path / "b"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    # the first process parks inside its run (lock held), like a long training would
    park = ("import sys, time; from posenc.bench import runner; "
            "runner.run_one = lambda *a, **k: (print('parked', flush=True), time.sleep(300)); "
            "from posenc.cli import main; sys.exit(main(sys.argv[1:]))")
    first = subprocess.Popen([sys.executable, "-c", park, *FAST, "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout.readline().strip() == "parked", first.stderr.read() if first.poll() is not None else ""
        second = subprocess.run([sys.executable, "-m", "posenc_entry", *FAST, "--out", str(out), "--resume"],
                                capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 2
        assert second.stderr.splitlines() == [
            f"posenc bench: error: --out {out} is in use by another posenc bench (pid {first.pid}); "
            "wait for it to finish or choose another --out"
        ]
    finally:
        first.send_signal(signal.SIGKILL)  # kill -9: no cleanup runs, the kernel drops the flock
        first.wait(timeout=60)
    with OutDirLock(out):  # free again
        pass


# --------------------------------------------------------------------------- a write that fails


def _failing_save_file(real, fail_at: int, error: OSError, calls: list[str]):
    """safetensors' save_file (``real``), failing on its ``fail_at``-th call (from 1) with ``error``."""

    def save_file(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == fail_at:
            raise error
        return real(tensors, filename, metadata=metadata)

    return save_file


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES], ids=errno.errorcode.get)
@pytest.mark.parametrize("fail_at", [1, 2, "last"], ids=["first checkpoint", "second checkpoint", "final weights"])
def test_a_failed_write_is_one_line_loses_nothing_and_resume_finishes_identically(tmp_path, capsys, monkeypatch,
                                                                                code, fail_at):
    """A full disk or a read-only folder while bench writes a checkpoint or the final weights:
    one line naming the file and the cause, exit 2, no temporary file left, the earlier
    checkpoint intact; --resume then gives the result of a run that never failed."""
    import safetensors.torch

    real = safetensors.torch.save_file
    argv = [*FAST, "--steps", "8"]  # a checkpoint every 2 steps (build.train_config)
    ref = tmp_path / "ref"
    calls: list[str] = []
    monkeypatch.setattr(safetensors.torch, "save_file", _failing_save_file(real, 0, OSError(), calls))
    assert run_cli([*argv, "--out", str(ref)], capsys)[0] == 0
    writes = list(calls)
    assert len(writes) == 5, writes  # checkpoints at steps 2, 4, 6, 8 and the final weights
    expected = strict_json(_run_dir(ref) / "result.json")

    out = tmp_path / "b"
    n = len(writes) if fail_at == "last" else fail_at
    calls.clear()
    monkeypatch.setattr(safetensors.torch, "save_file", _failing_save_file(real, n, OSError(code, os.strerror(code)), calls))
    exit_code, lines = run_cli([*argv, "--out", str(out)], capsys)
    target = _run_dir(out) / Path(calls[-1]).name.split(".tmp")[0].lstrip(".")
    assert exit_code == 2 and lines == [
        f"posenc bench: error: cannot write file {target}: {os.strerror(code)}; the file it replaces is intact: "
        "free space or fix the folder's permissions, then rerun with --resume"
    ]
    assert not [p.name for p in _run_dir(out).iterdir() if ".tmp" in p.name]
    ckpt = _run_dir(out) / "checkpoint.safetensors"
    if n > 1:  # the checkpoint written before the failure is whole and verified
        load_tensors(ckpt)
    assert not (_run_dir(out) / "result.json").exists()
    monkeypatch.undo()
    assert run_cli([*argv, "--out", str(out), "--resume"], capsys)[0] == 0
    got = strict_json(_run_dir(out) / "result.json")
    for record in (got, expected):
        record.pop("train_seconds")
    assert got == expected
