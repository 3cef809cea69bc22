"""The cache of converted models: where it is, how a folder enters it, and the check on every load.

* Where: ``$POSENC_CACHE`` if set, else ``~/.cache/posenc/models``; one folder per source,
  ``<name>-<sha256[:12]>-v<FORMAT_VERSION>``. A cache path that is a file, a dangling symbolic
  link or not writable is refused with one line naming POSENC_CACHE (:func:`check_root`).
* How a folder enters it (:func:`converting`): under an exclusive lock on
  ``.<folder>.lock`` (a second process converting the same source waits, then finds it done),
  in a hidden temporary folder ``.<folder>.tmp.<pid>@<host>.<random>`` renamed into place, so an
  interrupted conversion leaves no half folder. A temporary folder whose owner is gone (its pid
  is dead on this host, or it belongs to the folder whose lock is now held: its owner would
  hold that lock) is removed by the next run; a live owner's never is.
* The record ``posenc_model.json``, written last, holds the format version, the source's sha256
  and the size and sha256 of every file written (weights, config.json, tokenizer files).
  :func:`verify` checks them on every load: an edited, truncated, removed or added file is
  refused with one line naming it and the command that rebuilds the folder (the check reads
  every cached file once per load). The digests sit beside the files, so they detect a file
  changed by anything that does not also rewrite the record (an edit, a copy cut short, a write
  through a hard link such as the ones ``extend --out`` makes), not a writer that rewrites both.
* A record written before digests were kept (same format version, no ``files`` entry) is given
  them on its first load, with one line saying so: its files were written by the same conversion,
  and a change made before that load cannot be told from the original.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

__all__ = ["FORMAT_VERSION", "RECORD", "cache_root", "check_root", "converting", "folder_for", "read_record",
           "remove_stale", "root_label", "verify", "write_record"]

#: the layout of a converted folder; a change here makes every cached folder be rebuilt.
FORMAT_VERSION = 1
RECORD = "posenc_model.json"
_TMP = re.compile(r"^\.(?P<stem>.+)\.tmp\.(?P<pid>\d+)@(?P<host>.+)\.[^.]+$")


def _say(msg: str) -> None:
    print(f"posenc: {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """``$POSENC_CACHE`` if set (and not empty), else ``~/.cache/posenc/models``."""
    env = os.environ.get("POSENC_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "posenc" / "models"


def root_label(root: Path) -> str:
    """How messages name the cache: always with the variable that moves it."""
    if os.environ.get("POSENC_CACHE"):
        return f"POSENC_CACHE {str(root)!r}"
    return f"the model cache {str(root)!r} (set POSENC_CACHE to use another folder)"


def check_root(root: Path, *, writing: bool) -> None:
    """Refuse (ValueError naming POSENC_CACHE) a cache path that is a file or a dangling link;
    with ``writing``, create it and refuse it when it cannot be written."""
    if root.is_symlink() and not root.exists():
        raise ValueError(f"{root_label(root)} is a symbolic link to {os.readlink(root)!r}, which does not exist; "
                         "point POSENC_CACHE to a folder")
    if root.exists() and not root.is_dir():
        raise ValueError(f"{root_label(root)} is a file, not a folder; point POSENC_CACHE to a folder")
    if not writing:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{root_label(root)} cannot be created: {e.strerror or e}; point POSENC_CACHE to a "
                         "writable folder") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise ValueError(f"{root_label(root)} is not writable (converting a model writes there); point "
                         "POSENC_CACHE to a writable folder")


def folder_for(name: str, sha: str) -> Path:
    """The cached folder of the source ``name`` whose sha256 is ``sha``."""
    return cache_root() / f"{name}-{sha[:12]}-v{FORMAT_VERSION}"


def read_record(folder: Path, sha: str) -> dict[str, Any] | None:
    """The folder's record when it was written by this format for the source ``sha``, else None
    (missing, unreadable, another version or source: the folder is to be rebuilt)."""
    try:
        rec = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(rec, dict) and rec.get("format_version") == FORMAT_VERSION and rec.get("sha256") == sha
    return rec if ok else None


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.name: {"bytes": p.stat().st_size, "sha256": _digest(p)}
            for p in sorted(folder.iterdir()) if p.name != RECORD}


def write_record(folder: Path, **fields: Any) -> None:
    """Write the record, with the size and sha256 of every other file in ``folder``: last, so a
    folder with a record is complete."""
    rec = dict(format_version=FORMAT_VERSION, **fields, files=_files(folder))
    tmp = folder / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(rec, indent=2) + "\n")
    os.replace(tmp, folder / RECORD)


def verify(folder: Path, rec: dict[str, Any]) -> None:
    """Check every file of ``folder`` against the record (module docstring); ValueError naming
    the first that differs and how to rebuild."""
    files = rec.get("files")
    rebuild = f"remove the folder to convert it again: rm -r '{folder}'"
    if not isinstance(files, dict):
        _adopt(folder, rec)
        return
    on_disk = {p.name for p in folder.iterdir() if p.name != RECORD}
    for name, want in files.items():
        p = folder / name
        if not p.is_file():
            raise ValueError(f"{p} is missing from the converted model (it was written by the conversion); {rebuild}")
        size = p.stat().st_size
        if not isinstance(want, dict) or size != want.get("bytes"):
            wrote = want.get("bytes") if isinstance(want, dict) else "?"
            raise ValueError(f"{p} has {size} bytes but the conversion wrote {wrote} (truncated or edited "
                             f"since); {rebuild}")
        if _digest(p) != want.get("sha256"):
            raise ValueError(f"{p} differs from the file the conversion wrote (its sha256 changed: edited "
                             f"since); {rebuild}")
    extra = sorted(on_disk - set(files))
    if extra:
        raise ValueError(f"{folder} holds {', '.join(extra)}, which the conversion did not write (transformers "
                         f"could read it); {rebuild}")


def _adopt(folder: Path, rec: dict[str, Any]) -> None:
    try:
        write_record(folder, **{k: v for k, v in rec.items() if k not in ("format_version", "files")})
    except OSError as e:
        _say(f"{folder} was converted by an earlier posenc and its files cannot be checked: recording their "
             f"digests failed ({e.strerror or e})")
        return
    _say(f"recorded the sha256 of {folder}'s files (converted by an earlier posenc); every later load checks them")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale(root: Path, locked: str | None = None) -> None:
    """Remove the temporary folders of conversions whose process is gone: this host's dead pids,
    and with ``locked`` (the folder whose lock the caller holds) every temporary folder of it."""
    host = socket.gethostname()
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    gone = []
    for p in entries:
        m = _TMP.match(p.name)
        if m is None or not p.is_dir() or p.is_symlink():
            continue
        if m["stem"] == locked or (m["host"] == host and not _alive(int(m["pid"]))):
            gone.append(p)
    for p in gone:
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            _say(f"removed {p.name} ({size / 2**20:.0f} MB), left by an interrupted conversion")


def check_disk(root: Path, need: int, what: str) -> None:
    """Refuse, before writing, a conversion that needs more than the free space under ``root``."""
    free = shutil.disk_usage(root).free
    if need > free:
        gib = 2.0**30
        raise ValueError(f"{root_label(root)} has {free / gib:.2f} GiB free but converting {what} writes about "
                         f"{need / gib:.2f} GiB; free space there or point POSENC_CACHE to another disk")


@contextlib.contextmanager
def converting(dest: Path) -> Iterator[Path]:
    """Hold ``dest``'s lock and yield an empty temporary folder beside it (removed on exit);
    stale temporary folders are removed first. OSError on the way: one line naming the cache."""
    import fcntl

    root = dest.parent
    check_root(root, writing=True)
    try:
        lock = open(root / f".{dest.name}.lock", "a")
    except OSError as e:
        raise ValueError(f"{root_label(root)}: cannot create the lock {root / f'.{dest.name}.lock'}: "
                         f"{e.strerror or e}") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"another process is converting {dest.name}: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        remove_stale(root, locked=dest.name)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp.{os.getpid()}@{socket.gethostname()}.", dir=root))
        except OSError as e:
            raise ValueError(f"{root_label(root)}: cannot create a temporary folder there: {e.strerror or e}") from None
        try:
            yield tmp
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ValueError(f"{root_label(root)}: writing {e.filename or tmp} failed: {e.strerror} (the disk "
                                 "is full); free space there or point POSENC_CACHE to another disk") from None
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
