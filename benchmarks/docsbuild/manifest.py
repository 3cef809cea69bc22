"""Which table renders from which results files into which marked block of which page.

A page marks a table's place with ``<!-- table: NAME -->`` ... ``<!-- /table -->``; ``TABLES``
gives each NAME its renderer (one per kind of table), the pages it may appear in and the results
files it reads (``results.RESULTS`` says which command rewrites each). A renderer takes the page
(links are relative to it) and ``load``, which hands it only the files declared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import bench_claims as claims
from . import bench_tables as bench
from . import extension_tables as extension
from . import model_tables as models
from . import speed_tables as speed
from .captions import duration, machine_of, md_table
from .results import RESULTS, recorded_command

Renderer = Callable[[str, Callable[[str], dict]], str]


def results_files(page: str, load) -> str:
    """Every results file, the command that writes it, its machine and wall time."""
    rows = []
    for name, res in RESULTS.items():
        data = load(name)
        files = [res.file] + [dst.rsplit("/", 1)[1] for _, dst in res.copy if dst.startswith("benchmarks/results/")]
        files += [res.file.removesuffix(".json") + ".txt"] if res.stdout == "txt" else []
        files = ", ".join(f"`{f}`" for f in dict.fromkeys(files))
        rerun = f"`--rerun {name}`" if res.rerun else "(not re-run)"
        wall = duration(data["wall_s"]) if "wall_s" in data else "not recorded"
        rows.append([name, files, f"`{recorded_command(res, data)}`", rerun, machine_of(name, data), wall,
                     data.get("note", res.note)])
    return md_table(["name", "files", "command that wrote it", "tables.py", "machine", "wall time", "note"], rows)


@dataclass(frozen=True)
class Table:
    """A marked table: its renderer, the pages that hold it, the results files it reads."""

    render: Renderer
    pages: tuple[str, ...]
    results: tuple[str, ...]


_SMOLLM2 = tuple(dict.fromkeys(f for files in models.SMOLLM2_FILES.values() for f in files))
_EXTENSION = tuple(extension.EXTENSION_FILES.values())

TABLES: dict[str, Table] = {
    "results_files": Table(results_files, ("benchmarks/results/README.md",), tuple(RESULTS)),
    # README headlines: one per topic, each with a short caption pointing to the full one
    "demo_time": Table(bench.demo_headline, ("README.md",), ("demo_cpu",)),
    "bench_quick": Table(bench.quick, ("README.md",), ("bench_quick",)),
    "smollm2_extension_readme": Table(extension.extension_headline, ("README.md",), _EXTENSION),
    # docs/choosing_an_extension.md
    "smollm2_extension": Table(extension.smollm2_extension, ("docs/choosing_an_extension.md",), _EXTENSION),
    "extension_claims": Table(extension.extension_claims, ("docs/choosing_an_extension.md",), _EXTENSION),
    "method_cost": Table(extension.method_cost, ("docs/choosing_an_extension.md",), ("method_cost_cpu",)),
    "smollm2_tasks": Table(extension.smollm2_tasks, ("docs/choosing_an_extension.md",), extension.TASK_SHARDS),
    "estimate_check": Table(models.estimate_check, ("docs/real_models.md",), ("bench_model_smollm2_estimate_cpu",)),
    "smollm2_extension_4L": Table(extension.smollm2_extension_4L, ("docs/choosing_an_extension.md",),
                                  (extension.EXTENSION_4L[1],)),
    "smollm2_passkey_4L": Table(extension.smollm2_passkey_4L, ("docs/choosing_an_extension.md",),
                                extension.PASSKEY_SHARDS_4L),
    "smollm2_tasks_15L": Table(extension.smollm2_tasks_15L, ("docs/choosing_an_extension.md",),
                               extension.TASK_SHARDS_15L),
    "engine_llamacpp": Table(extension.engine_llamacpp, ("docs/engines.md",), ("engine_llamacpp_cpu",)),
    # docs/bench.md
    "bench_quick_text": Table(bench.quick_text, ("docs/bench.md",), ("bench_quick",)),
    "bench_standard": Table(bench.standard, ("docs/bench.md",), ("bench_standard",)),
    "bench_standard_orderings": Table(claims.orderings, ("docs/bench.md",), ("bench_standard",)),
    "determinism": Table(bench.determinism, ("docs/bench.md",), ("determinism",)),
    "demo_timing": Table(bench.demo_timing, ("docs/bench.md",), ("demo_cpu", "bench_quick")),
    # speed: docs/speed.md, and each family's page
    "rope_cpu": Table(speed.rope, ("docs/speed.md", "docs/rotary.md"), ("rope_cpu",)),
    "rope_h100": Table(speed.rope_cuda, ("docs/speed.md",), ("rope_h100",)),
    "relative_scores": Table(speed.relative_scores, ("docs/speed.md", "docs/relative.md"), ("relative_cpu",)),
    "relative_bias": Table(speed.relative_bias, ("docs/speed.md",), ("relative_cpu",)),
    "relative_8192": Table(speed.relative_long, ("docs/speed.md",), ("relative_cpu_8192",)),
    "model_cpu": Table(speed.model, ("docs/speed.md",), ("model_cpu",)),
    "cope_cpu": Table(speed.cope, ("docs/speed.md",), ("cope_cpu",)),
    # checks and HF parity
    "check_cpu": Table(models.check, ("docs/analysis.md",), ("check_cpu",)),
    "hf_parity": Table(models.hf_parity, ("docs/rotary.md",), ("hf_parity",)),
    # checkpoints: docs/hf.md (a tiny Llama trained here), docs/real_models.md (SmolLM2, Gemma 3)
    "probe_tiny_llama": Table(models.probe_tiny_llama, ("docs/hf.md",), ("probe_tiny_llama",)),
    "bench_model_tiny_llama": Table(models.bench_model_tiny_llama, ("docs/hf.md",), ("bench_model_tiny_llama",)),
    "probe_real": Table(models.probe_real, ("docs/real_models.md",), ("probe_smollm2", "probe_gemma3")),
    "bench_model_smollm2": Table(models.smollm2, ("docs/real_models.md",), _SMOLLM2),
    "bench_model_smollm2_yarn": Table(models.smollm2_yarn, ("docs/real_models.md",), _SMOLLM2),
    "real_decoding": Table(speed.real_decoding, ("docs/real_models.md",), ("real_speed_cpu",)),
    "real_memory": Table(speed.real_memory, ("docs/real_models.md",), ("real_speed_cpu",)),
    "real_extend": Table(models.real_extend, ("docs/real_models.md",), ("real_extend_smollm2_L256_N512",)),
}
