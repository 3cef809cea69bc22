"""``posenc extend``'s grid and device flags, ``probe --device``, ``bench --model --methods`` /
``--dtype``, and the ETA helper: each refused in one line before a model is loaded."""

from __future__ import annotations

from . import Case

A = "cli: extend grid, devices and dtypes"


def _settings(**kw) -> object:
    from posenc.hf.extend import ExtendSettings

    return ExtendSettings(to=128, **kw)


def _methods_on(model_type: str) -> object:
    from posenc.hf.extend_grid import candidates

    return candidates(64, 128, (1.0,), methods=("self_extend",), model_type=model_type)


def _eta(total: float) -> object:
    from posenc.progress import Eta

    return Eta(total)


_X = ["extend", "/no/such/model", "--to", "256"]

CASES = [
    Case(A, "`posenc extend --scalings none yarn` (none beside a name)",
         r"--scalings: none drops the whole family; give it alone, got none yarn", argv=[*_X, "--scalings", "none", "yarn"]),
    Case(A, "`posenc extend --methods self-extend` (a misspelt method)",
         r"argument --methods: must be none or one of self_extend, rerope, dual_chunk, got 'self-extend'",
         argv=[*_X, "--methods", "self-extend"]),
    Case(A, "`posenc extend --scalings yarm`", r"argument --scalings: must be none or one of .*got 'yarm'",
         argv=[*_X, "--scalings", "yarm"]),
    Case(A, "`posenc extend --depths 1.5`", r"argument --depths: must be a float in \[0, 1\], got '?1\.5",
         argv=[*_X, "--depths", "1.5"]),
    Case(A, "`posenc extend --dtype float64`", r"argument --dtype: invalid choice: 'float64'",
         argv=[*_X, "--dtype", "float64"]),
    Case(A, "`posenc extend --device mps`", r"argument --device: must be cpu, cuda or cuda:N, got 'mps'",
         argv=[*_X, "--device", "mps"]),
    Case(A, "`posenc probe --device tpu`", r"argument --device: must be cpu, cuda or cuda:N, got 'tpu'",
         argv=["probe", "/no/such/model", "--out", "/no/such/dir/probe", "--device", "tpu"]),
    Case(A, "extend's methods named for a model type whose attention they cannot replace (Gemma 3)",
         r"--methods self_extend: model_type 'gemma3_text' is not one whose attention the methods can replace",
         lambda: _methods_on("gemma3_text")),
    Case(A, "ExtendSettings(depths=())", r"--depths must hold at least one depth in \[0, 1\], got none",
         lambda: _settings(depths=())),
    Case(A, "ExtendSettings(device='tpu')", r"--device must be cpu, cuda or cuda:N, got 'tpu'",
         lambda: _settings(device="tpu")),
    Case(A, "`posenc extend --method-grid large`", r"argument --method-grid: invalid choice: 'large'",
         argv=[*_X, "--method-grid", "large"]),
    Case(A, "ExtendSettings(method_grid='all')", r"--method-grid must be one of", lambda: _settings(method_grid="all")),
    Case(A, "ExtendSettings(dtype='float64')", r"--dtype must be one of", lambda: _settings(dtype="float64")),
    Case(A, "`posenc bench --model M --bf16 --dtype float32`", r"--bf16 and --dtype float32 contradict each other",
         argv=["bench", "--model", "/no/such/model", "--bf16", "--dtype", "float32", "--out", "/no/such/dir/b"]),
    Case(A, "`posenc bench --methods rerope` without --model", r"--methods applies to --model only",
         argv=["bench", "--methods", "rerope", "--out", "/no/such/dir/b"]),
    Case(A, "`posenc bench --model M --methods foo`", r"argument --methods: must be one of self_extend, rerope, "
         r"dual_chunk, got 'foo'", argv=["bench", "--model", "/no/such/model", "--methods", "foo", "--out", "/no/such/dir/b"]),
    Case(A, "posenc.progress.Eta(total=-1)", r"total must be", lambda: _eta(-1.0)),
]
