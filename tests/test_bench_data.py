"""bench/data.py's default corpus: the pinned standard-library snapshot, and the digest that
every results file records of the text it read."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform

import pytest

from posenc.bench import data
from posenc.bench.data import STDLIB_SNAPSHOT, load_corpus
from posenc.bench.settings import PRESETS, BenchSettings
from posenc.hf.bench_settings import MODEL_PRESETS

# L of the named models (posenc.hf.models: SmolLM2-135M "trained at 8192"; Gemma 3 270M's
# max_position_embeddings 32768), written here so the test needs neither model installed.
NAMED_L = {"smollm2-135m": 8192, "gemma3-270m": 32768}


def _requests() -> dict[str, int]:
    """max_bytes of the default corpus that every preset reads: the synthetic bench's
    lm_train_bytes, and bench --model's lm task on each named model (hf/evaluation.token_stream:
    9 * 8 * (longest length + 1) + 9)."""
    out = {f"bench {p}": cfg.get("lm_train_bytes", BenchSettings.lm_train_bytes) for p, cfg in PRESETS.items()}
    for name, L in NAMED_L.items():
        for p, cfg in MODEL_PRESETS.items():
            out[f"bench --model {name} {p}"] = 9 * 8 * (round(max(cfg["lm_eval_factors"]) * L) + 1) + 9
    return out


def test_the_snapshot_covers_every_preset_but_the_largest_three():
    """Which presets read the pinned text; a preset made larger shows here, not silently unpinned."""
    beyond = sorted(k for k, m in _requests().items() if STDLIB_SNAPSHOT.refuses(m, 10) is not None)
    assert beyond == ["bench --model gemma3-270m paper", "bench --model gemma3-270m standard", "bench paper"]
    assert STDLIB_SNAPSHOT.train_bytes == max(m for m in _requests().values() if m <= STDLIB_SNAPSHOT.train_bytes)
    assert STDLIB_SNAPSHOT.val_bytes == STDLIB_SNAPSHOT.train_bytes // 9


@pytest.mark.skipif(platform.python_version() != STDLIB_SNAPSHOT.python,
                    reason=f"the live standard library equals the snapshot only on Python {STDLIB_SNAPSHOT.python}")
def test_the_snapshot_is_byte_for_byte_the_standard_library_it_was_read_from():
    """On the Python the committed tables were made with, every preset's request (and a few
    more, cut inside files) reads from the snapshot exactly the bytes the live library gives."""
    _, files = data._stdlib_files()
    sizes = sorted({*(m for m in _requests().values() if m <= STDLIB_SNAPSHOT.train_bytes), 1, 8, 9, 10, 4097,
                    1_234_567, STDLIB_SNAPSHOT.train_bytes})
    assert len(sizes) >= 10
    for m in sizes:
        c = load_corpus(None, max_bytes=m)
        assert c.source == STDLIB_SNAPSHOT.title
        train, val = data._read_split(files, m, 10)
        assert bytes(c.train.numpy()) == train and bytes(c.val.numpy()) == val, m


def test_the_record_is_the_sha256_of_the_bytes_read():
    c = load_corpus(None, max_bytes=20_000)
    want = hashlib.sha256(bytes(c.train.numpy()) + bytes(c.val.numpy())).hexdigest()
    assert c.record() == dict(source=STDLIB_SNAPSHOT.title, sha256=want, train_bytes=20_000, val_bytes=2222)
    assert load_corpus(None, max_bytes=20_001).record()["sha256"] != want  # one byte more: another digest


def test_a_request_beyond_the_snapshot_reads_the_running_python_and_says_so():
    c = load_corpus(None, max_bytes=STDLIB_SNAPSHOT.train_bytes + 1)
    assert c.source.startswith(f"Python {platform.python_version()} standard library (")
    assert c.source.endswith(f"not pinned: {STDLIB_SNAPSHOT.train_bytes + 1:,} bytes asked, the pinned snapshot "
                             f"holds {STDLIB_SNAPSHOT.train_bytes:,})")
    assert "not pinned: val_every 5 is not the snapshot's 10" in load_corpus(None, max_bytes=100, val_every=5).source


def test_a_damaged_or_missing_snapshot_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(data, "STDLIB_SNAPSHOT", dataclasses.replace(STDLIB_SNAPSHOT, sha256="0" * 64))
    with pytest.raises(ValueError, match=r"the pinned default corpus .*stdlib-3\.11\.7\.xz holds 5,242,970 bytes "
                                         r"with sha256 4f089d345251\.\.\., expected 5,242,970 with 000000000000"):
        load_corpus(None, max_bytes=100)
    monkeypatch.setattr(data, "STDLIB_SNAPSHOT", dataclasses.replace(STDLIB_SNAPSHOT, file="gone.xz"))
    with pytest.raises(FileNotFoundError, match=r"the pinned default corpus .*gone\.xz is missing; reinstall posenc"):
        load_corpus(None, max_bytes=100)


def test_the_bench_writes_the_corpus_it_read_into_results_json(tmp_path):
    """A micro lm run: results.json's corpus is the record of the corpus the runs trained on;
    a run of tasks that read no corpus records none."""
    from posenc.bench.runner import run_bench
    from posenc.bench.settings import settings_for
    from posenc.results import read_results

    s = settings_for("micro", encodings=["none"], tasks=["lm"], seeds=1)
    run_bench(s, tmp_path / "lm", progress=False, device="cpu")
    written = json.loads((tmp_path / "lm" / "results.json").read_text())["corpus"]
    assert written == load_corpus(None, max_bytes=s.lm_train_bytes).record()
    assert read_results(tmp_path / "lm")["corpus"] == written
    s = settings_for("micro", encodings=["none"], tasks=["copy"], seeds=1)
    run_bench(s, tmp_path / "copy", progress=False, device="cpu")
    assert "corpus" not in read_results(tmp_path / "copy")
