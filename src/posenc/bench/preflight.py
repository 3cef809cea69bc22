"""Checks made before any training, so that a run that cannot succeed fails in seconds rather
than after hours of other runs: every encoding's model is built once with the settings, the
lm task's text is found, and a training step's memory is estimated against the memory at hand
(running out of memory is a silent kill).
"""

from __future__ import annotations

from pathlib import Path

from .build import build_model
from .data import load_corpus
from .settings import BenchSettings
from .tasks import get_task

__all__ = ["available_bytes", "check_data", "check_memory", "check_models", "training_bytes"]


def check_models(settings: BenchSettings, device: str | None = None) -> None:
    """Build every encoding's model once, so that a setting no model accepts (--heads not
    dividing --d-model, rope:rotary_dim above the head size, a position table longer than its
    limit) is an error now; then :func:`check_memory`."""
    if settings.d_model % settings.n_head:
        raise ValueError(f"--d-model ({settings.d_model}) must be divisible by --heads ({settings.n_head})")
    # the task whose evaluation reaches furthest sizes the position tables
    task = max(settings.tasks, key=settings.max_positions)
    for encoding in settings.encodings:
        try:
            build_model(settings, encoding, task, 0)
        except (TypeError, ValueError) as e:
            raise ValueError(f"encoding {encoding!r} cannot be built with these settings: {e}") from None
    vocab_size = max(get_task(t).vocab_size for t in settings.tasks)
    check_memory(settings, vocab_size, device)


def check_data(settings: BenchSettings, data: str | Path | None) -> bool:
    """Whether a selected task reads the corpus; if so, ``data`` (a text file or folder) must
    hold text, checked now rather than after the other tasks' runs."""
    used = any(get_task(t).uses_corpus for t in settings.tasks)
    if used and data is not None:
        load_corpus(data, max_bytes=1)  # a missing or empty path fails here
    return used


def training_bytes(settings: BenchSettings, task: str, vocab_size: int) -> int:
    """An estimate of the memory one training step of ``task`` holds (float32): per layer the
    activations kept for backward and their gradients (40 floats of width per token) and the
    attention weights (6 of H x T x T per example), plus the logits (5 of B x T x V). Against
    a forward and backward's peak (ru_maxrss) at batch 1024 and 4096 of quick's passkey with
    RoPE: 1.1x and 1.9x the measured growth (so it refuses only what cannot fit)."""
    t = get_task(task)
    B = t.batch_size(settings)
    T = t.train_tokens(settings)
    per_layer = B * T * (40 * settings.d_model + 6 * settings.n_head * T)
    return 4 * (settings.n_layer * per_layer + 5 * B * T * vocab_size)


def available_bytes(device: str | None = None) -> int | None:
    """Memory free for a run: the CUDA device's free memory, else the machine's MemAvailable
    (None where neither can be read)."""
    if device is not None and device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(settings: BenchSettings, vocab_size: int, device: str | None = None) -> None:
    """Refuse a batch whose training step cannot fit in the memory at hand (:func:`training_bytes`),
    before anything is allocated."""
    free = available_bytes(device)
    if free is None:
        return
    task = max(settings.tasks, key=lambda t: training_bytes(settings, t, vocab_size))
    need = training_bytes(settings, task, vocab_size)
    if need > free:
        t = get_task(task)
        flag, batch = "--" + t.batch_field.replace("_", "-"), t.batch_size(settings)
        gib = 2**30
        raise ValueError(f"{flag} {batch}: a training step of {task} needs about {need / gib:.3g} GiB (length "
                         f"{t.train_tokens(settings)}, width {settings.d_model}, {settings.n_layer} layers), "
                         f"but {free / gib:.3g} GiB is free; lower {flag}")
