"""Timing and peak-memory helpers shared by the speed benchmarks."""

from __future__ import annotations

import gc
import os
import statistics
import time
import tracemalloc
from typing import Callable

import torch

__all__ = ["time_fn", "peak_memory", "describe_machine"]


def time_fn(fn: Callable[[], object], *, warmup: int = 2, repeat: int = 5, min_time: float = 0.0) -> float:
    """Median wall time of ``fn()`` in seconds (CUDA synchronized when available)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    start_all = time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - start_all) < min_time:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if len(times) >= 10 * repeat:
            break
    return statistics.median(times)


def peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes allocated while running ``fn()``.

    On CUDA: torch's allocator statistics. On CPU: the peak of tensor storage allocated by
    torch, via the profiler's memory tracking.
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    # Kineto logs two lines per profiled call to stderr (USDT, severity 5) unless
    # KINETO_LOG_LEVEL is above that when the profiler first starts; a user's setting wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # Every allocation and free, each at its own time: the profiler's per-op totals
    # (prof.events()' self memory) attribute a free that happens between two child ops to the
    # enclosing op, so inside a custom autograd.Function (the fused attention) its blocks'
    # scratch looked freed before it was allocated, or, counted at the op's end, never freed.
    live = peak = 0
    for _, size in sorted(_allocations(prof)):
        live += size
        peak = max(peak, live)
    return peak


def _allocations(prof) -> list[tuple[int, int]]:
    """(time ns, bytes: + allocated, - freed) of every allocation event the profiler recorded,
    from its event tree (torch's ``experimental_event_tree``, present in the pinned torch)."""
    from torch._C._profiler import _EventType

    out, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            out.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    return out


def describe_machine() -> str:
    import os
    import platform

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
