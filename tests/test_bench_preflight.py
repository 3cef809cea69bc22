"""posenc.bench.preflight: the checks made before any training (models, corpus, memory)."""

from __future__ import annotations

import pytest

from posenc.bench import preflight
from posenc.bench.settings import settings_for


def test_training_bytes_by_hand():
    s = settings_for("micro")  # d_model 16, 1 layer, 2 heads; batch 8, lm batch 8
    # copy: L = 4, a size-4 problem is 5 prompt + 4 target tokens
    T = 9
    assert preflight.training_bytes(s, "copy", 20) == 4 * (1 * 8 * T * (40 * 16 + 6 * 2 * T) + 5 * 8 * T * 20)
    # lm: windows of lm_length bytes, lm_batch_size of them
    assert preflight.training_bytes(s, "lm", 256) == 4 * (8 * 16 * (40 * 16 + 6 * 2 * 16) + 5 * 8 * 16 * 256)


def test_a_batch_that_cannot_fit_names_its_flag(monkeypatch):
    monkeypatch.setattr(preflight, "available_bytes", lambda device=None: 10_000)
    with pytest.raises(ValueError, match=r"^--lm-batch-size 8: a training step of lm needs about .* GiB \(length 16, "
                                         r"width 16, 1 layers\), but .* GiB is free; lower --lm-batch-size$"):
        preflight.check_memory(settings_for("micro", tasks=["lm"]), 256)
    with pytest.raises(ValueError, match=r"^--batch-size 8: a training step of copy"):
        preflight.check_memory(settings_for("micro", tasks=["copy"]), 20)
    monkeypatch.setattr(preflight, "available_bytes", lambda device=None: None)  # unknown: not checked
    preflight.check_memory(settings_for("micro"), 256)


def test_available_bytes_reads_the_machine():
    free = preflight.available_bytes()
    assert free is None or free > 0


def test_models_are_built_before_training():
    preflight.check_models(settings_for("micro"))
    with pytest.raises(ValueError, match=r"--d-model \(16\) must be divisible by --heads \(3\)"):
        preflight.check_models(settings_for("micro", n_head=3))


def test_the_corpus_is_checked_only_for_a_task_that_reads_it(tmp_path):
    assert preflight.check_data(settings_for("micro", tasks=["copy"]), tmp_path / "missing") is False
    assert preflight.check_data(settings_for("micro"), None) is True
    with pytest.raises(FileNotFoundError, match="--data: no such file or directory"):
        preflight.check_data(settings_for("micro"), tmp_path / "missing")
