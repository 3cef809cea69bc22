"""`pip install posenc` needs torch alone: the library, its models and the CLI's light commands
run where numpy, tqdm, safetensors, matplotlib and transformers cannot be imported, and each
command that needs one of them names the extra that installs it.

The lean environment is a fresh interpreter without site-packages (``python -S``) whose path
holds links to torch and the distributions torch requires, and posenc's ``src``: what
``pip install torch`` then ``pip install --no-deps posenc`` gives. pyproject.toml's extras are
checked against :data:`posenc._optional.EXTRAS`, which names them in the errors.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest

from posenc._optional import EXTRAS, require
from posenc.registry import list_encodings

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("numpy", "tqdm", "safetensors", "matplotlib", "transformers", "gguf", "accelerate")

LEAN = textwrap.dedent(
    """
    import contextlib, importlib.util, io, json, sys, warnings

    BLOCKED = {blocked!r}
    sys.path[:0] = {path!r}
    present = [m for m in BLOCKED if importlib.util.find_spec(m) is not None]
    assert not present, f"not a lean environment: {{present}} can be imported"
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch's, without numpy

    import torch
    import posenc
    from posenc.cli import main

    out = {{"forward": {{}}, "cli": {{}}}}
    for name in posenc.list_encodings():
        torch.manual_seed(0)
        model = posenc.Transformer(posenc.ModelConfig(encoding=name, vocab_size=16, d_model=16, n_layer=1, n_head=2))
        try:
            y = model(torch.randint(0, 16, (2, 9)))
            out["forward"][name] = list(y.shape) if bool(torch.isfinite(y).all()) else "non-finite"
        except Exception as e:
            out["forward"][name] = f"{{type(e).__name__}}: {{e}}"

    for argv in {commands!r}:
        err, std = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
            code = main(argv)
        out["cli"][" ".join(argv)] = [code, err.getvalue().strip().splitlines()[-1:]]
    out["imported"] = sorted(m for m in BLOCKED if m in sys.modules)
    print(json.dumps(out))
    """
)


def torch_alone(site: Path) -> None:
    """Link torch and every distribution it requires (recursively) into ``site``."""
    todo, seen = ["torch"], set()
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        dist = distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
            if not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)))
        for req in dist.requires or ():
            if "extra ==" not in req:
                todo.append(re.split(r"[<>=!~;\[ (]", req, maxsplit=1)[0])
    assert {"torch", "sympy", "typing-extensions"} <= seen


def run_lean(commands: list[list[str]], site: Path) -> dict:
    code = LEAN.format(blocked=OPTIONAL, commands=commands, path=[str(site), str(ROOT / "src")])
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lean(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("lean")
    site = out / "site-packages"
    site.mkdir()
    torch_alone(site)
    return run_lean([
        ["list", "--short"],
        ["bench", "--help"],
        ["bench", "--preset", "micro", "--out", str(out / "bench")],
        ["plot", "alibi", "--out", str(out / "plots")],
    ], site)


def test_every_encoding_builds_and_runs_forward_with_torch_alone(lean):
    names = list_encodings()
    assert names and set(lean["forward"]) == set(names)
    assert {n: r for n, r in lean["forward"].items() if r != [2, 9, 16]} == {}
    assert lean["imported"] == []


def test_light_commands_run_with_torch_alone(lean):
    assert lean["cli"]["list --short"][0] == 0
    assert lean["cli"]["bench --help"][0] == 0


@pytest.mark.parametrize("command, extra", [("bench", "bench"), ("plot", "plot")])
def test_a_command_that_needs_an_extra_names_it_in_one_line(lean, command, extra):
    [(argv, (code, last))] = [(k, v) for k, v in lean["cli"].items() if k.startswith(command + " ") and "--help" not in k]
    assert code == 2, (argv, last)
    assert re.search(rf"is not installed; .*pip install 'posenc\[{extra}\]'", last[0]), last


def test_require_names_the_extra_and_passes_present_modules():
    assert require("json", extra="plot") is json
    with pytest.raises(ImportError, match=r"no_such_pkg_xyz is not installed; .*pip install 'posenc\[hf\]'"):
        require("no_such_pkg_xyz.sub", extra="hf")
    with pytest.raises(ValueError, match=r"extra must be one of plot, bench, hf, got 'gpu'"):
        require("json", extra="gpu")


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0] for r in requirements}


def test_pyproject_extras_match_the_table_the_errors_use():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _names(project["dependencies"]) == {"torch"}
    extras = project["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        assert _names(extras[extra]) == set(modules), extra
    assert extras["all"] == [f"posenc[{','.join(EXTRAS)}]"]
    assert "posenc[all]" in extras["test"]
    assert set(OPTIONAL) == {m for ms in EXTRAS.values() for m in ms}
