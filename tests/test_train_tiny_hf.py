"""benchmarks/train_tiny_hf.py: trains a few steps, saves a loadable checkpoint, and the probe runs on it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "train_tiny_hf.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_trains_saves_and_probes(tmp_path):
    ckpt, probe = tmp_path / "ckpt", tmp_path / "probe"
    small = ("--steps", "6", "--layers", "1", "--width", "32", "--heads", "2", "--length", "32", "--batch", "4",
             "--train-bytes", "50000", "--eval-windows", "4", "--no-progress")
    r = _run("--out", str(ckpt), "--probe", str(probe), *small, "--probe-args", "--dtype", "float32", "--extend", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = json.loads((ckpt / "config.json").read_text())
    assert (cfg["model_type"], cfg["max_position_embeddings"], cfg["vocab_size"]) == ("llama", 32, 256)
    train = json.loads((ckpt / "train.json").read_text())
    assert len(train["loss_curve"]) == 6
    # the loss starts near ln 256 (uniform over bytes) and the step-6 mean stays finite
    assert abs(train["loss_curve"][0] - 5.545) < 0.5
    assert train["val_at_L"]["tokens"] == 4 * 31 and train["val_at_L"]["ppl"] > 1
    # seeded: the same command gives the same loss curve
    r2 = _run("--out", str(tmp_path / "again"), *small)
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert json.loads((tmp_path / "again" / "train.json").read_text())["loss_curve"] == train["loss_curve"]
    data = json.loads((probe / "probe.json").read_text())
    assert data["trained_length"] == 32 and data["training"]["parameters"] == train["parameters"]
    assert data["distances"][-1] == 64 and set(data["layers"]["0"]["curves"]) >= {"model", "base x16", "linear"}
    assert (probe / "probe_layer0.png").stat().st_size > 0


def test_bad_flag_is_one_line_error(tmp_path):
    r = _run("--out", str(tmp_path / "x"), "--width", "30", "--heads", "4")
    assert r.returncode == 2 and "--width must be a multiple of --heads, got 30 and 4" in r.stderr
