"""The benchmark's files, written so that a fault never loses or silently corrupts a result.

* **Strict JSON.** :func:`write_json` writes atomically (temporary file + rename) with
  ``allow_nan=False``; a non-finite float (a diverged loss, an overflowing perplexity) is
  written as ``null``, so every file parses with any strict JSON reader.
* **Verified tensors.** :func:`save_tensors` stores a sha256 of the tensors in the safetensors
  metadata; :func:`load_tensors` refuses a missing, empty, truncated or corrupted file, a file
  whose checksum does not match (flipped bytes), and non-finite values, with one line naming
  the file. A refused file is left where it is: nothing here deletes.
* **Failed writes say which file and why.** A write that fails (a full disk, a read-only
  folder) raises :class:`WriteFailed`, an OSError whose one line names the file and the cause;
  the file it was to replace is untouched (writes go to a temporary file renamed over it), and
  the temporary file is removed.
* **One writer per output folder.** :class:`OutDirLock` holds an exclusive ``flock`` on
  ``OUT/.lock`` for the whole run; the kernel drops it when the process ends, even on kill -9.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ._optional import require

__all__ = ["write_json", "finite_or_none", "tensors_checksum", "save_tensors", "load_tensors", "OutDirLock", "WriteFailed"]

CHECKSUM_KEY = "sha256"


class WriteFailed(OSError):
    """Writing ``path`` failed; the message names it and the cause, and says nothing was lost."""

    def __init__(self, what: str, path: Path, cause: BaseException):
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else " ".join(str(cause).split())
        errno_ = cause.errno if isinstance(cause, OSError) and cause.errno else errno.EIO
        super().__init__(errno_, f"cannot write {what} {path}: {reason or type(cause).__name__}; the file it "
                                 "replaces is intact: free space or fix the folder's permissions, then rerun with --resume")
        self.path = path


def _replace_atomically(path: Path, what: str, write) -> None:
    """``write(tmp)`` then rename ``tmp`` over ``path``; any failure is :class:`WriteFailed` with
    ``tmp`` removed and ``path`` as it was."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    except Exception as e:  # OSError, or safetensors' own SafetensorError wrapping one
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise WriteFailed(what, path, e) from None


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every NaN/inf float replaced by None (recursively through dicts, lists, tuples)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = None) -> None:
    """Write ``obj`` as strict JSON (non-finite floats -> null), atomically."""
    path = Path(path)
    text = json.dumps(finite_or_none(obj), indent=indent, allow_nan=False)
    _replace_atomically(path, "file", lambda tmp: tmp.write_text(text))


def _raw_bytes(t: Tensor) -> bytes:
    """The bytes of a contiguous CPU tensor of any dtype, in one copy and without numpy.

    (bfloat16 has no numpy dtype, and ``bytes(tensor.untyped_storage())`` reads one byte per
    Python call: about a second per 100k floats, paid at every checkpoint.)
    """
    if t.device.type != "cpu" or not t.is_contiguous() or t.is_conj() or t.is_neg():
        raise ValueError(f"expected a contiguous CPU tensor with its values in memory, got {t.device} "
                         f"(contiguous={t.is_contiguous()}, conj={t.is_conj()}, neg={t.is_neg()})")
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


def tensors_checksum(tensors: dict[str, Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().resolve_conj().resolve_neg().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(_raw_bytes(t))
    return h.hexdigest()


def save_tensors(path: str | os.PathLike, tensors: dict[str, Tensor], metadata: dict[str, str],
                 what: str = "file") -> None:
    """Write a safetensors file with a checksum in its metadata, atomically (a failure is
    :class:`WriteFailed` naming ``what`` and the file)."""
    save_file = require("safetensors.torch", extra="bench").save_file

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteFailed(what, path, e) from None
    meta = dict(metadata, **{CHECKSUM_KEY: tensors_checksum(tensors)})
    _replace_atomically(path, what, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def load_tensors(
    path: str | os.PathLike, what: str = "checkpoint", *, finite: bool = True
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Read and verify a file :func:`save_tensors` wrote: ``(tensors, metadata)``.

    Raises ValueError naming the file when it is missing, empty, unreadable (truncated), has no
    checksum or a wrong one, or (with ``finite``) holds NaN/inf. The file is never touched.
    """
    safe_open = require("safetensors", extra="bench").safe_open

    path = Path(path)
    keep = "; it was left in place: delete it to retrain, or restore it"
    if not path.is_file():
        raise ValueError(f"{what} {path} is missing")
    if path.stat().st_size == 0:
        raise ValueError(f"{what} {path} is empty{keep}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own SafetensorError for truncated headers/data
        raise ValueError(f"{what} {path} is unreadable (truncated or corrupt: {' '.join(str(e).split())}){keep}") from None
    stored = meta.pop(CHECKSUM_KEY, None)
    if stored is None:
        raise ValueError(f"{what} {path} has no checksum (written by an older posenc){keep}")
    if tensors_checksum(tensors) != stored:
        raise ValueError(f"{what} {path} is corrupt: its sha256 does not match the one saved with it{keep}")
    bad = [k for k, t in tensors.items() if finite and t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"{what} {path} holds NaN or inf in {', '.join(sorted(bad)[:3])}{keep}")
    return tensors, meta


class OutDirLock:
    """Exclusive, non-blocking lock on ``out/.lock`` for the life of a ``with`` block.

    A second process gets a ValueError naming ``--out`` and the pid that holds it. ``flock``
    belongs to the open file, so the kernel releases it when the holder exits for any reason.
    The lock file itself is left in place (deleting it would let two processes lock two
    different files of the same name). Without ``fcntl`` (Windows) there is no lock.
    """

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self._fd: int | None = None

    def __enter__(self) -> "OutDirLock":
        try:
            import fcntl
        except ImportError:  # not POSIX
            return self
        self.out.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.out / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ValueError(
                f"--out {self.out} is in use by another posenc bench (pid {holder}); "
                "wait for it to finish or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
