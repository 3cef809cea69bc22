"""posenc.speed.rope: the device's default settings, and one tiny block timed with the copy."""

from __future__ import annotations

import json

import pytest

from posenc.cli import main
from posenc.speed.rope import CUDA_TOKENS, batch_for, measure, resolve


def test_settings_default_by_device_type_unless_given():
    cpu = resolve("cpu", lengths=None, batch=None, heads=2, head_dim=None, modes=None)
    assert cpu == dict(lengths=[512, 2048, 8192], batch=4, heads=2, head_dim=64, modes=["fwd"])
    cuda = resolve("cuda:1", lengths=[1024, 1 << 20], batch=None)  # torch.device needs no GPU
    assert cuda["heads"] == 32 and cuda["modes"] == ["fwd", "fwd+bwd"]
    assert [batch_for(cuda["batch"], T) for T in cuda["lengths"]] == [CUDA_TOKENS // 1024, 1]
    assert batch_for(3, 1024) == 3
    with pytest.raises(TypeError, match="unknown settings \\['dtype'\\]"):
        resolve("cpu", dtype="float32")


def test_a_block_is_timed_against_the_copy():
    rows = measure("cpu", lengths=[8], batch=1, heads=2, head_dim=4, modes=["fwd", "fwd+bwd"], dtypes=["float32"],
                   impls=["posenc-eager"], repeat=1)
    assert [(r["mode"], r["impl"]) for r in rows] == [("fwd", "copy"), ("fwd", "posenc-eager"),
                                                       ("fwd+bwd", "copy"), ("fwd+bwd", "posenc-eager")]
    assert all(r["ms"] > 0 and r["B"] == 1 for r in rows)


def test_the_command_prints_json(capsys):
    argv = ["speed", "rope", "--device", "cpu", "--lengths", "8", "--heads", "2", "--head-dim", "4",
            "--dtypes", "float32", "--impls", "posenc-eager", "--repeat", "1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["target"], out["B"], out["H"], out["D"]) == ("rope", 4, 2, 4)
    assert [r["impl"] for r in out["rows"]] == ["copy", "posenc-eager"]
