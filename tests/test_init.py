"""posenc/__init__.py: ``import posenc`` imports nothing, and the library never imports the CLI.

``python -m posenc`` imports the package before posenc/__main__.py puts the console script's
Ctrl-C guard on (posenc_entry), so the package must not import torch; and no library module
may load the command line (``posenc.cli``) or the console script (``posenc_entry``).
Checked in fresh interpreters, run as ``python -c`` and as ``python -m`` of another module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import posenc

ROOT = Path(__file__).resolve().parents[1]

# Prints the posenc, CLI and torch modules loaded after running BODY.
PROBE = """
import json, sys
{body}
loaded = sorted(m for m in sys.modules if m == "torch" or m == "posenc_entry" or m.startswith("posenc"))
print(json.dumps(loaded))
"""


def _loaded(body: str, tmp_path: Path, as_module: bool) -> list[str]:
    code = PROBE.format(body=body)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    if as_module:  # python -m probe: sys.argv[0] is '-m' while the import runs
        (tmp_path / "probe_imports.py").write_text(code)
        argv = [sys.executable, "-m", "probe_imports"]
    else:
        argv = [sys.executable, "-c", code]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _cli(loaded: list[str]) -> list[str]:
    return [m for m in loaded if m == "posenc_entry" or m == "posenc.cli" or m.startswith("posenc.cli.")]


@pytest.mark.parametrize("as_module", [False, True], ids=["python -c", "python -m"])
def test_import_posenc_imports_nothing(tmp_path, as_module):
    assert _loaded("import posenc", tmp_path, as_module) == ["posenc"]


@pytest.mark.parametrize("as_module", [False, True], ids=["python -c", "python -m"])
def test_the_public_names_load_no_cli(tmp_path, as_module):
    body = "import posenc\nfor name in posenc.__all__: getattr(posenc, name)\nposenc.list_encodings()"
    loaded = _loaded(body, tmp_path, as_module)
    assert "torch" in loaded and "posenc.registry" in loaded
    assert not _cli(loaded)


def test_no_library_module_imports_the_cli(tmp_path):
    """Every module outside posenc.cli (the ones an optional extra missing here cannot import
    aside) imports no CLI module."""
    body = """
import importlib, posenc
from pathlib import Path
from posenc._optional import MissingExtra
src = Path(posenc.__file__).parent
for path in sorted(src.rglob("*.py")):
    parts = ("posenc", *path.relative_to(src).with_suffix("").parts)
    if parts[1] in ("cli", "__main__"):
        continue
    try:
        importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    except MissingExtra:
        pass
    except ModuleNotFoundError as e:  # an optional package not installed here
        if (e.name or "posenc").startswith("posenc"):
            raise
"""
    loaded = _loaded(body, tmp_path, as_module=False)
    assert len([m for m in loaded if m.startswith("posenc.")]) > 50
    assert not _cli(loaded)


def test_public_names_and_dir():
    assert posenc.__all__ == sorted(posenc.__all__)
    for name in posenc.__all__:
        assert getattr(posenc, name).__module__.startswith("posenc."), name
        assert name in dir(posenc)
    assert {"rotary", "bench", "__version__"} <= set(dir(posenc))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        posenc.nope  # noqa: B018
