"""Every measured number in README.md and docs/*.md, rendered from a committed results file.

A table in a Markdown page sits between two markers::

    <!-- table: rope_cpu -->
    ... generated: do not edit by hand ...
    <!-- /table -->

and is rewritten from ``benchmarks/results/<file>`` by the renderer of that name (``TABLES``),
with the machine and the command that wrote the file printed under it. Each results file has
one command that regenerates it (``RESULTS``).

    python benchmarks/tables.py                  # re-render every table from the committed files
    python benchmarks/tables.py --check          # exit 1 if a committed table differs from its file
    python benchmarks/tables.py --rerun          # re-run every measurement, then re-render
    python benchmarks/tables.py --rerun rope_cpu check_cpu   # only these results files
    python benchmarks/tables.py --list           # results files and their commands

``--rerun`` runs each command in its own process (``python -m posenc ...``: a fresh torch, no
thread settings carried from one command to the next), records the machine, the command and
the wall time in the results file, and re-renders. Measure on a quiet machine: the ratios are
side by side within one run, but a loaded machine still moves them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
# The pages whose tables are generated; a marker anywhere else is not looked at.
PAGES = ("README.md", "benchmarks/results/README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))))

MARKER = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


# ---------------------------------------------------------------------------------------
# Results files and the commands that write them
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Result:
    """A committed results file and the command that regenerates it.

    ``argv`` is a ``posenc`` command without the program name, or a script run by ``python``
    (``("python", "benchmarks/x.py", ...)``).

    ``stdout`` says where the command's standard output goes: ``"json"`` (the command prints
    the JSON document, written to ``file``), ``"txt"`` (a console table kept beside the JSON
    the command writes itself) or ``None``. ``copy`` lists (produced path, committed path)
    pairs copied after the run (the benchmark writes to an output folder).
    """

    file: str
    argv: tuple[str, ...]
    stdout: str | None = None
    copy: tuple[tuple[str, str], ...] = ()
    threads: int | None = None  # the command's --threads, for the recorded machine line
    rerun: bool = True  # False: a historical file that --rerun leaves alone
    note: str = ""
    machine: str = ""  # the machine, stated here for a file whose command does not record one

    @property
    def path(self) -> Path:
        return RESULTS_DIR / self.file

    @property
    def command(self) -> str:
        """The command as a reader types it (redirecting stdout where the JSON is printed)."""
        cmd = shlex.join(self.argv) if self.argv[0] == "python" else "posenc " + shlex.join(self.argv)
        if self.stdout == "json":
            cmd += f" > benchmarks/results/{self.file}"
        return cmd


_MODEL_FLAGS = ("--lengths", "1024", "--batch", "2", "--layers", "6", "--width", "512", "--heads", "8",
                "--rounds", "5", "--decode-contexts", "1024", "4096", "--decode-tokens", "16")

# Files written by commands that do not record their machine (the real-model runs): stated here.
_SHARED_EPYC = "AMD EPYC, 2 cores shared with other jobs, torch 2.13.0+cpu"

RESULTS: dict[str, Result] = {
    "rope_cpu": Result(
        "rope_cpu.json", ("speed", "rope", "--device", "cpu", "--lengths", "512", "2048", "8192", "--repeat", "7", "--json"),
        stdout="json",
    ),
    "relative_cpu": Result(
        "relative_cpu.json",
        ("speed", "relative", "--device", "cpu", "--lengths", "512", "1024", "2048", "4096", "--repeat", "3",
         "--json", "benchmarks/results/relative_cpu.json"),
        stdout="txt",
    ),
    "relative_cpu_8192": Result(
        "relative_cpu_8192.json",
        ("speed", "relative", "--device", "cpu", "--lengths", "8192", "--einsum-max-length", "4096", "--repeat", "1",
         "--json", "benchmarks/results/relative_cpu_8192.json"),
        stdout="txt",
    ),
    "model_cpu": Result(
        "model_cpu.json", ("speed", "model", "--device", "cpu", *_MODEL_FLAGS, "--json", "benchmarks/results/model_cpu.json"),
        stdout="txt",
    ),
    "bench_quick": Result(
        "bench_quick.json",
        ("bench", "--preset", "quick", "--threads", "1", "--out", "out/bench_results", "--overwrite", "--no-progress"),
        copy=(("out/bench_results/results.json", "benchmarks/results/bench_quick.json"),
              ("out/bench_results/results.csv", "benchmarks/results/bench_quick.csv"),
              *((f"out/bench_results/plots/task_{t}.png", f"docs/img/task_{t}.png") for t in ("copy", "passkey", "lm"))),
        threads=1,
    ),
    "bench_standard": Result(
        "bench_standard.json",
        ("bench", "--preset", "standard", "--threads", "1", "--out", "out/bench_standard", "--overwrite", "--no-progress"),
        copy=(("out/bench_standard/results.json", "benchmarks/results/bench_standard.json"),
              ("out/bench_standard/results.csv", "benchmarks/results/bench_standard.csv")),
        threads=1,
        note="every registered encoding x every task x 3 seeds: about an hour on a quiet 2-core CPU",
    ),
    "check_cpu": Result("check_cpu.json", ("check", "--json"), stdout="json"),
    "hf_parity": Result("hf_parity.json", ("python", "benchmarks/hf_parity.py", "--out", "benchmarks/results/hf_parity.json")),
    # issue 13's real run: train a tiny byte-level Llama (out/tiny_llama, not committed), probe it
    "probe_tiny_llama": Result(
        "probe_tiny_llama.json",
        ("python", "benchmarks/train_tiny_hf.py", "--out", "out/tiny_llama", "--probe", "out/probe_tiny_llama",
         "--no-progress", "--probe-args", "--dtype", "float32", "--extend", "8"),
        copy=(("out/probe_tiny_llama/probe.json", "benchmarks/results/probe_tiny_llama.json"),
              ("out/probe_tiny_llama/probe_layer0.png", "docs/img/probe_tiny_llama.png")),
        threads=1,
    ),
    "determinism": Result("determinism.json", ("python", "benchmarks/determinism.py", "--out",
                                               "benchmarks/results/determinism.json")),
    "bench_model_tiny_llama": Result(
        "bench_model_tiny_llama.json",
        ("bench", "--model", "out/tiny_llama", "--out", "out/bench_tiny_llama", "--tasks", "lm", "--lm-eval-tokens", "8192",
         "--threads", "1", "--overwrite", "--no-progress"),
        copy=(("out/bench_tiny_llama/results.json", "benchmarks/results/bench_model_tiny_llama.json"),),
        threads=1, note="needs out/tiny_llama: run --rerun probe_tiny_llama first",
    ),
    "demo_cpu": Result(
        "demo_cpu.json", ("python", "benchmarks/demo_timing.py", "--out", "benchmarks/results/demo_cpu.json"),
        note="make demo from a fresh clone; about 15 min on 2 cores",
    ),
    "real_speed_cpu": Result(
        "real_speed_cpu.json",
        ("python", "benchmarks/real_speed.py", "--rounds", "4", "--new-tokens", "40", "--memory-lengths", "1024", "4096",
         "16384", "--out", "benchmarks/results/real_speed_cpu.json"),
        note="SmolLM2-135M from the cache (posenc[hf]); 24 min on a shared 2-core machine",
    ),
    "real_extend_smollm2_L256_N512": Result(
        "real_extend_smollm2_L256_N512.json",
        ("extend", "smollm2-135m", "--to", "512", "--trained-length", "256", "--factors", "1", "--out",
         "out/real_extend_smollm2", "--no-progress"),
        copy=(("out/real_extend_smollm2/extend.json", "benchmarks/results/real_extend_smollm2_L256_N512.json"),),
        machine=_SHARED_EPYC + ", torch's default 2 threads",
        note="about 10 min on 2 cores",
    ),
    "probe_smollm2": Result(
        "probe_smollm2.json",
        ("probe", "smollm2-135m", "--out", "out/probe_smollm2", "--points", "1024", "--threads", "1"),
        copy=(("out/probe_smollm2/probe.json", "benchmarks/results/probe_smollm2.json"),),
        threads=1, machine=_SHARED_EPYC + ", 1 thread",
    ),
    "probe_gemma3": Result(
        "probe_gemma3.json",
        ("probe", "gemma3-270m", "--out", "out/probe_gemma3", "--points", "1024", "--scalings", "yarn", "--threads", "1"),
        copy=(("out/probe_gemma3/probe.json", "benchmarks/results/probe_gemma3.json"),),
        threads=1, machine=_SHARED_EPYC + ", 1 thread",
    ),
    # issue 22 item 3: SmolLM2 past a stated L on both corpora; passkey reads no corpus (in the code file only)
    **{f"bench_model_smollm2_{corpus}": Result(
        f"bench_model_smollm2_{corpus}.json",
        ("bench", "--model", "smollm2-135m", "--trained-length", "1024", "--lm-eval-tokens", "2048", "--corpus", corpus,
         *(("--tasks", "lm") if corpus == "prose" else ()), "--threads", "1", "--out", f"out/bench_smollm2_{corpus}",
         "--overwrite", "--no-progress"),
        copy=((f"out/bench_smollm2_{corpus}/results.json", f"benchmarks/results/bench_model_smollm2_{corpus}.json"),),
        threads=1, machine=_SHARED_EPYC + ", 1 thread",
    ) for corpus in ("code", "prose")},
    # the same past L on each corpus at 4L alone (one window of 4096 tokens)
    **{f"bench_model_smollm2_{corpus}_4L": Result(
        f"bench_model_smollm2_{corpus}_4L.json",
        ("bench", "--model", "smollm2-135m", "--trained-length", "1024", "--tasks", "lm", "--lm-eval-factors", "4",
         "--lm-eval-tokens", "4096", "--corpus", corpus, "--threads", "1", "--out", f"out/bench_smollm2_{corpus}_4L",
         "--overwrite", "--no-progress"),
        copy=((f"out/bench_smollm2_{corpus}_4L/results.json", f"benchmarks/results/bench_model_smollm2_{corpus}_4L.json"),),
        threads=1, machine=_SHARED_EPYC + ", 1 thread",
    ) for corpus in ("prose", "code")},
    # the code file's passkey at 1.5L, run apart (the main run's quick preset has 0.5L, L and 2L)
    "bench_model_smollm2_passkey_1.5L": Result(
        "bench_model_smollm2_passkey_1.5L.json",
        ("bench", "--model", "smollm2-135m", "--trained-length", "1024", "--tasks", "passkey", "--passkey-eval-factors",
         "1.5", "--threads", "1", "--out", "out/bench_smollm2_passkey_1.5L", "--overwrite", "--no-progress"),
        copy=(("out/bench_smollm2_passkey_1.5L/results.json",
               "benchmarks/results/bench_model_smollm2_passkey_1.5L.json"),),
        threads=1, machine=_SHARED_EPYC + ", 1 thread",
    ),
}


def load(name: str) -> dict:
    """The committed results file of ``name``.

    Benchmark results go through ``posenc.bench.load_results``, which checks their format and
    reads a missing metric (null) as NaN, as the benchmark's own tables do.
    """
    res = _result(name)
    if not res.path.is_file():
        raise FileNotFoundError(f"no results file {res.file}; python benchmarks/tables.py --rerun {name} writes it")
    if res.argv[0] == "bench":
        from posenc.bench.summary import load_results

        return load_results(res.path)
    try:
        return json.loads(res.path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{res.file} is not valid JSON ({e}); python benchmarks/tables.py --rerun {name} rewrites it") from None


def _result(name: str) -> Result:
    if name not in RESULTS:
        raise ValueError(f"unknown results {name!r}; valid: {', '.join(RESULTS)}")
    return RESULTS[name]


def _machine_of(name: str, data: dict) -> str:
    machine = data.get("machine") or RESULTS[name].machine
    if machine:
        return machine
    meta = data.get("meta", {})
    if meta.get("torch"):  # a script that records its software but not the machine
        versions = ", ".join(f"{k} {meta[k]}" for k in ("torch", "transformers", "python") if k in meta)
        return f"not recorded ({versions})"
    raise ValueError(f"{RESULTS[name].file} records no machine; re-run it with --rerun {name}")


# ---------------------------------------------------------------------------------------
# Formatting helpers
# ---------------------------------------------------------------------------------------
def ratio(x: float) -> str:
    """A ratio with three significant digits: 0.89x, 2.19x, 17.2x, 100x."""
    if x >= 99.95:
        return f"{x:.0f}x"
    return f"{x:.1f}x" if x >= 9.995 else f"{x:.2f}x"


def duration(seconds: float) -> str:
    """``6 min 20 s`` (whole seconds; under a minute ``35 s``)."""
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; ``|`` inside a cell is escaped."""
    esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def caption(name: str, page: str, data: dict, extra: str = "") -> str:
    """The line under a table: machine, the command that wrote the file, the file, any note.

    The command is the one the file records (what produced these numbers), else the one in
    ``RESULTS``; files written by ``--rerun`` record it.
    """
    res = RESULTS[name]
    link = os.path.relpath(res.path, (ROOT / page).parent)
    command = data.get("command") or data.get("meta", {}).get("command") or res.command
    text = f"Machine: {_machine_of(name, data)}. Command: `{command}`"
    text += f"; results: [{res.file}]({link})"
    for part in (extra, data.get("note", "")):
        if part:
            text += f". {part[0].upper()}{part[1:]}"
    return text + "."


# ---------------------------------------------------------------------------------------
# Renderers: (page) -> Markdown between the markers
# ---------------------------------------------------------------------------------------
_VARIANT = {"linear": "linear (PI)", "ntk": "NTK-aware", "dynamic": "dynamic NTK", "yarn": "YaRN"}


def _bench_setup(data: dict) -> str:
    s = data["settings"]
    lengths = {r["task"]: r["train_length"] for r in data["runs"]}
    unit = {"lm": " bytes", "passkey": " tokens"}
    ls = ", ".join(f"{t} {L}{unit.get(t, '')}" for t, L in lengths.items())
    train = sum(r["train_seconds"] for r in data["runs"])
    text = (f"{s['seeds']} seed{'s' if s['seeds'] > 1 else ''}; d_model {s['d_model']}, {s['n_layer']} layers, "
            f"{s['steps']} steps; training length L: {ls}; {len(data['runs'])} runs, "
            f"{duration(train)} of training in all")
    if "wall_s" in data:
        text += f", {duration(data['wall_s'])} wall for the whole command"
    return text


def render_bench_quick(page: str) -> str:
    """README: the quick benchmark, one row per encoding (and RoPE scaling), ≤L | >L per task."""
    data = load("bench_quick")
    summary = data["summary"]
    assert summary, "bench_quick.json has no summary rows"
    tasks = list(dict.fromkeys(r["task"] for r in summary))
    metric = {r["task"]: r["metric"] for r in summary}
    longest = max(data["settings"]["lm_eval_factors"])
    header = ["encoding"]
    for t in tasks:
        header.append(f"{t} ppl at L | {longest}L" if metric[t] == "ppl" else f"{t} acc % ≤L | >L")
        if metric[t] == "ppl":
            header.append(f"{t} ppl {longest}L / L")
    from posenc.bench.report import cell_text, significance_lines
    from posenc.bench.summary import ranking

    rank = data.get("ranking") or ranking(summary)  # files from before the intervals: computed here
    ci = {i["encoding"]: i for i in rank["intervals"]}
    header.append(f"MRR [{round(100 * rank['method']['confidence'])} % CI]")
    idx = {(r["task"], r["encoding"], r["variant"]): r for r in summary}
    rows = []
    for enc, var in dict.fromkeys((r["encoding"], r["variant"]) for r in summary):
        label = ("none (NoPE)" if enc == "none" else enc) if var == "base" else f"{enc} + {_VARIANT.get(var, var)}"
        row = [label]
        for t in tasks:
            r = idx.get((t, enc, var))
            if r is None:
                row += [""] * (2 if metric[t] == "ppl" else 1)
                continue
            base = None if var == "base" else enc  # a scaling within L is the unscaled model: "as rope"
            row.append(f"{cell_text(r, 'in', base)} | {cell_text(r, 'beyond', base)}")
            if metric[t] == "ppl":  # a scaling is applied beyond L only: its L is the base model's
                at_L = r["in_mean"] if not math.isnan(r["in_mean"]) else idx[(t, enc, "base")]["in_mean"]
                ppl_ratio = r["beyond_mean"] / at_L
                row.append("n/a" if math.isnan(ppl_ratio) else ratio(ppl_ratio))
        mrr = data["mrr"].get(enc) if var == "base" else None
        row.append("" if mrr is None else f"{mrr:.2f}" + (f" [{ci[enc]['low']:.2f}, {ci[enc]['high']:.2f}]" if enc in ci else ""))
        rows.append(row)
    notes = "\n".join(f"- {line}" for line in significance_lines(dict(data, ranking=rank)))
    return (md_table(header, rows) + "\n\n" + (notes + "\n\n" if notes else "")
            + caption("bench_quick", page, data, _bench_setup(data)))


def render_bench_quick_text(page: str) -> str:
    """docs/bench.md: the table exactly as ``posenc bench`` prints it."""
    from posenc.bench.report import format_table

    data = load("bench_quick")
    return ("```\n" + format_table(data) + "\n```\n\n"
            + caption("bench_quick", page, data, _bench_setup(data)))


def _rope_blocks(data: dict) -> dict[tuple[str, str, int], dict[str, dict]]:
    """(dtype, mode, T) -> impl -> row; files from before forward+backward timing are "fwd"."""
    blocks: dict[tuple[str, str, int], dict[str, dict]] = {}
    for r in data["rows"]:
        blocks.setdefault((r["dtype"], r.get("mode", "fwd"), r["T"]), {})[r["impl"]] = r
    assert blocks, "rope_cpu.json has no rows"
    return blocks


def _rope_table(page: str, impls: dict[str, str]) -> str:
    data = load("rope_cpu")
    blocks = _rope_blocks(data)
    with_mode = len({mode for _, mode, _ in blocks}) > 1  # a mode column only when there is a choice
    rows = []
    for (dtype, mode, T), b in blocks.items():
        rows.append([dtype, *([mode] if with_mode else []), str(T), f"{b['copy']['ms']:.3f}"]
                    + [ratio(b[i]["x_copy"]) if i in b else "–" for i in impls])
    shape = f"B={data['B']}, H={data['H']}, D={data['D']}"
    header = ["dtype", *(["mode"] if with_mode else []), "T", "copy ms", *impls.values()]
    return (md_table(header, rows) + "\n\n"
            + caption("rope_cpu", page, data, f"Rotate q and k ({shape}); time as a multiple of the copy"))


def render_rope_cpu(page: str) -> str:
    """README: posenc's default kernel against the two peers, as a multiple of the copy."""
    return _rope_table(page, {"posenc": "posenc", "hf": "transformers `apply_rotary_pos_emb`",
                              "ret": "rotary-embedding-torch"})


def render_rope_cpu_kernels(page: str) -> str:
    """docs/rotary.md: every posenc kernel and layout beside the peers."""
    return _rope_table(page, {"posenc": "posenc (auto)", "posenc-interleaved": "posenc-interleaved",
                              "posenc-eager": "posenc-eager", "posenc-eager-interleaved": "posenc-eager-interleaved",
                              "hf": "hf", "ret": "ret"})


def _relative_at(data: dict, T: int) -> dict[str, dict]:
    for res in data["results"]:
        if res["length"] == T:
            return res["rows"]
    raise ValueError(f"relative results have no T={T}; lengths: {[r['length'] for r in data['results']]}")


RELATIVE_T = 2048  # the length the README quotes; the file holds every length


def render_relative_scores(page: str) -> str:
    """Score terms at T=2048 against plain q·k^T and HF's (T, T, D) einsum."""
    data = load("relative_cpu")
    rows = _relative_at(data, RELATIVE_T)
    base, ein = rows["plain q·k^T"], rows["einsum (T,T,D) rkq"]
    out = [[label.removeprefix("score "), ratio(r["time_ms"] / base["time_ms"]), ratio(ein["time_ms"] / r["time_ms"]),
            ratio(ein["peak_mib"] / r["peak_mib"])] for label, r in rows.items() if label.startswith("score ")]
    assert out, "relative_cpu.json has no score rows"
    setup = (f"T = {RELATIVE_T}, batch {data['batch']}, {data['heads']} heads, head dim {data['head_dim']}, "
             f"{data['dtype']}; plain q·k^T {base['time_ms']:.1f} ms")
    return (md_table(["score term", "time vs q·k^T", "faster than the einsum", "less peak memory than the einsum"], out)
            + "\n\n" + caption("relative_cpu", page, data, setup))


def render_relative_bias(page: str) -> str:
    """Content-independent biases at T=2048: per layer and per forward, against causal SDPA."""
    data = load("relative_cpu")
    rows = _relative_at(data, RELATIVE_T)
    sdpa = rows["sdpa causal"]
    names = [label.removeprefix("bias ").removesuffix(" (per forward)") for label in rows
             if label.startswith("bias ")]
    assert names, "relative_cpu.json has no bias rows"
    out = [[n, ratio(rows[f"sdpa + bias {n} (per layer)"]["time_ms"] / sdpa["time_ms"]),
            ratio(rows[f"bias {n} (per forward)"]["time_ms"] / sdpa["time_ms"])] for n in names]
    return (md_table(["bias", "causal SDPA with the bias, per layer", "building the masked bias, per forward"], out)
            + "\n\n" + caption("relative_cpu", page, data,
                               f"T = {RELATIVE_T}; as a multiple of plain causal SDPA ({sdpa['time_ms']:.1f} ms)"))


def render_relative_8192(page: str) -> str:
    """Score terms at T=8192: time and peak memory (the einsum is not run at this length)."""
    data = load("relative_cpu_8192")
    (res,) = data["results"]
    rows = res["rows"]
    base = rows["plain q·k^T"]
    out = [[label.removeprefix("score "), ratio(r["time_ms"] / base["time_ms"]), f"{r['peak_mib'] / 1024:.2f}"]
           for label, r in rows.items() if label.startswith("score ")]
    assert out, "relative_cpu_8192.json has no score rows"
    return (md_table(["score term", "time vs q·k^T", "peak GiB"], out) + "\n\n"
            + caption("relative_cpu_8192", page, data,
                      f"T = {res['length']}; plain q·k^T {base['peak_mib'] / 1024:.2f} GiB"))


def _model_rows(data: dict) -> tuple[list[list[str]], list[str]]:
    from posenc.speed.model import row_ratios

    train, decode, mem = data["train"], data["decode"], data["memory"]
    assert train, "model results have no rows"
    (T,) = train["none"]  # one training length in the quoted command
    contexts = list(decode["none"])
    rows = []
    for name in train:
        if name == "none":
            continue
        _, goal, mem_goal = (*data["goal"][name], None)[:3]  # older files have no memory goal
        train_ratio, decode_ratio = row_ratios(data, name)  # paired ratios, or older files' quotients
        r = [train_ratio[T]] + [decode_ratio[c] for c in contexts]
        (Tm, m), = mem[name].items()
        m_ratio = m / mem["none"][Tm]
        ok = all(x <= goal for x in r) and (mem_goal is None or m_ratio <= mem_goal)
        goal_text = ratio(goal) + (f", memory {ratio(mem_goal)}" if mem_goal is not None else "")
        rows.append([name, goal_text, *map(ratio, r), ratio(m_ratio), "yes" if ok else "no"])
    header = ["encoding", "goal", f"train step T={T}", *(f"decode at {c}" for c in contexts),
              "peak memory (train)", "within goal"]
    base = (f"ratios to NoPE: {train['none'][T]:.2f} s per training step, "
            + ", ".join(f"{decode['none'][c]:.1f} tokens/s decoding at {c}" for c in contexts))
    return [header, *rows], base


def render_model_cpu(page: str) -> str:
    """Whole-model training step and decoding, every encoding as a ratio to NoPE."""
    data = load("model_cpu")
    (header, *rows), base = _model_rows(data)
    return md_table(header, rows) + "\n\n" + caption("model_cpu", page, data, base)


def render_check_cpu(page: str) -> str:
    """docs/analysis.md: the ``posenc check`` table, as the command prints it."""
    from posenc.analysis.checks import CheckResult, format_table

    data = load("check_cpu")
    results = {n: {k: CheckResult(**r) for k, r in rs.items()} for n, rs in data["results"].items()}
    assert results, "check_cpu.json has no encodings"
    extra = f"{duration(data['wall_s'])} wall" if "wall_s" in data else ""
    return "```\n" + format_table(results) + "\n```\n\n" + caption("check_cpu", page, data, extra)


def render_results_files(page: str) -> str:
    """benchmarks/results/README.md: every results file, the command that writes it, its machine."""
    rows = []
    for name, res in RESULTS.items():
        data = load(name)
        files = [res.file] + [Path(dst).name for _, dst in res.copy if dst.startswith("benchmarks/results/")]
        files += [res.path.with_suffix(".txt").name] if res.path.with_suffix(".txt").exists() else []
        files = ", ".join(f"`{f}`" for f in dict.fromkeys(files))
        rerun = f"`--rerun {name}`" if res.rerun else "(not re-run)"
        command = data.get("command") or data.get("meta", {}).get("command") or res.command
        wall = duration(data["wall_s"]) if "wall_s" in data else "not recorded"
        rows.append([name, files, f"`{command}`", rerun, _machine_of(name, data), wall, data.get("note", res.note)])
    return md_table(["name", "files", "command that wrote it", "tables.py", "machine", "wall time", "note"], rows)


def render_hf_parity(page: str) -> str:
    """docs/rotary.md: parity with transformers per family, by the script's own table function."""
    spec = importlib.util.spec_from_file_location("_hf_parity", ROOT / "benchmarks" / "hf_parity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = load("hf_parity")
    assert data["rows"], "hf_parity.json has no rows"
    return mod.table(data["rows"]) + "\n\n" + caption("hf_parity", page, data)


# --------------------------------------------------------------------------- bench_standard
# Thresholds behind the verdicts on Press et al.'s claims (the papers give curves, not numbers):
# perplexity at the longest length over perplexity at L, in every seed.
_COLLAPSE, _FLAT = 1.5, 1.1
_SYNTHETIC = ("copy", "reverse", "sort", "addition", "parity", "summation")


def render_bench_standard(page: str) -> str:
    """docs/bench.md: the standard benchmark (every encoding, every task, 3 seeds)."""
    from posenc.bench.report import settings_text, table_cells
    from posenc.bench.summary import ranking

    data = load("bench_standard")
    assert data["summary"], "bench_standard.json has no summary rows"
    head, rows = table_cells(data)
    rank = data.get("ranking") or ranking(data["summary"])
    ahead = [f"{p['first']} > {p['second']}" for p in rank["pairs"] if p["significant"]]
    m = rank["method"]
    note = (f"Mean ± std over seeds; accuracy in %, ppl: byte perplexity. MRR over {m['cells']} (task, seed) cells, "
            f"[{round(100 * m['confidence'])} % CI]: paired percentile bootstrap of the cells, {m['resamples']:,} "
            f"resamples. {len(ahead)} of {len(rank['pairs'])} pairwise MRR differences are significant.")
    return md_table(head, rows) + "\n\n" + note + "\n\n" + caption("bench_standard", page, data, settings_text(data))


def _lm_ratios(data: dict) -> dict[str, list[float]]:
    """``encoding`` or ``encoding+scaling`` -> per seed (in seed order): ppl at the longest
    length / ppl at L of the same seed's unscaled model."""
    from posenc.bench.summary import run_scores

    out: dict[str, list[tuple[int, float]]] = {}
    for r in data["runs"]:
        if r["task"] != "lm":
            continue
        scores = run_scores(r)
        at_L = scores["base"][0]
        for variant, (_, beyond) in scores.items():
            key = r["encoding"] if variant == "base" else f"{r['encoding']}+{variant}"
            out.setdefault(key, []).append((r["seed"], beyond / at_L))
    return {k: [v for _, v in sorted(xs)] for k, xs in out.items()}


def _spread(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.2f}x [{min(xs):.2f}, {max(xs):.2f}]"


def render_bench_standard_orderings(page: str) -> str:
    """docs/bench.md: does each published ordering hold in the standard run? (verdict, the
    number it rests on, and its interval)"""
    from posenc.bench.summary import ranking

    data = load("bench_standard")
    lm = _lm_ratios(data)
    assert lm, "bench_standard.json has no lm runs"
    longest = max(data["settings"]["lm_eval_factors"])
    rows = []

    def verdict_ratio(enc: str, claim: str, ok, bad) -> None:
        xs = lm.get(enc)
        if not xs:
            rows.append(["Press et al. 2022", claim, "not run", "–"])
            return
        v = "holds" if all(map(ok, xs)) else "does not hold" if all(map(bad, xs)) else "mixed across seeds"
        rows.append(["Press et al. 2022", claim, f"lm ppl {longest}L / L: {_spread(xs)}", v])

    verdict_ratio("sinusoidal", f"sinusoidal collapses beyond L (ratio ≥ {_COLLAPSE})",
                  lambda x: x >= _COLLAPSE, lambda x: x < _COLLAPSE)
    verdict_ratio("learned", f"learned collapses beyond L (ratio ≥ {_COLLAPSE})",
                  lambda x: x >= _COLLAPSE, lambda x: x < _COLLAPSE)
    verdict_ratio("alibi", f"ALiBi stays flat (ratio ≤ {_FLAT})", lambda x: x <= _FLAT, lambda x: x > _FLAT)
    verdict_ratio("rope", f"RoPE degrades (ratio > {_FLAT})", lambda x: x > _FLAT, lambda x: x <= _FLAT)
    for scaling, label in _VARIANT.items():
        key = f"rope+{scaling}"
        if key not in lm or "rope" not in lm:
            continue
        paired = [s / b for s, b in zip(lm[key], lm["rope"])]  # same seed, same base model
        v = "holds" if all(x < 1 for x in paired) else "does not hold" if all(x >= 1 for x in paired) else "mixed across seeds"
        rows.append(["Press et al. 2022", f"{label} repairs RoPE (ppl at {longest}L below plain RoPE's)",
                     f"ppl at {longest}L, {label} / plain: {_spread(paired)}", v])
    synthetic = [r for r in data["summary"] if r["task"] in _SYNTHETIC]
    rank = ranking(synthetic)
    ci = {i["encoding"]: i for i in rank["intervals"]}
    pairs = {(p["first"], p["second"]): p for p in rank["pairs"]}
    for leader in ("none", "t5"):
        for other in ("alibi", "rope", "learned", "sinusoidal"):
            if leader not in ci or other not in ci:
                continue
            p = pairs.get((leader, other))
            sign = 1
            if p is None:
                p, sign = pairs[(other, leader)], -1
            diff, lo, hi = sign * p["diff"], min(sign * p["low"], sign * p["high"]), max(sign * p["low"], sign * p["high"])
            v = "holds" if lo > 0 else "reversed" if hi < 0 else "not resolved (CI includes 0)"
            name = "NoPE" if leader == "none" else "T5"
            rows.append(["Kazemnejad et al. 2023", f"{name} ahead of {other} on the synthetic tasks",
                         f"MRR {ci[leader]['mrr']:.2f} vs {ci[other]['mrr']:.2f}, difference {diff:+.2f} "
                         f"[{lo:+.2f}, {hi:+.2f}]", v])
    m = rank["method"]
    note = (f"Intervals: lm ratios, mean [min, max] over the {data['settings']['seeds']} seeds (a verdict needs every "
            f"seed to agree); MRR over the {m['cells']} synthetic (task, seed) cells with its "
            f"{round(100 * m['confidence'])} % paired bootstrap CI ({m['resamples']:,} resamples).")
    return (md_table(["paper", "claim", "measured", "verdict"], rows) + "\n\n" + note + "\n\n"
            + caption("bench_standard", page, data))


def render_probe_tiny_llama(page: str) -> str:
    """README / docs/hf.md: the tiny Llama's training and its probe curves at d = 0, L, 8L."""
    data = load("probe_tiny_llama")
    tr, L = data["training"], data["trained_length"]
    s = tr["settings"]
    curves = data["layers"]["0"]["curves"]
    assert curves, "probe_tiny_llama.json has no curves"
    d = data["distances"]
    at = {f"d = 0": 0, f"d = L = {L}": min(range(len(d)), key=lambda i: abs(d[i] - L)), f"d = {d[-1]}": len(d) - 1}
    rows = [[name] + [f"{c['full'][i]:.3f}" for i in at.values()]  # already the heads' mean
            for name, c in curves.items()]
    head = (f"{tr['parameters']:,}-parameter byte-level Llama ({s['layers']} layers, width {s['width']}, {s['heads']} heads, "
            f"RoPE base {s['rope_theta']:g}, L = {L}), {s['steps']} steps of batch {s['batch']} on the Python standard "
            f"library in {duration(tr['train_seconds'])}: final training loss {tr['final_train_loss']:.3f} nats/byte "
            f"(mean of the last {tr['final_train_loss_steps']} steps), validation byte perplexity at L "
            f"{tr['val_at_L']['ppl']:.2f} ({tr['val_at_L']['tokens']:,} bytes).")
    table = md_table(["layer 0, mean of all heads: logit at"] + list(at), rows)
    return head + "\n\n" + table + "\n\n" + caption("probe_tiny_llama", page, data)


def render_bench_model_tiny_llama(page: str) -> str:
    """README / docs/hf.md: the tiny Llama's byte perplexity at 1x..8x L, plain and per scaling."""
    from posenc.bench.report import format_table

    data = load("bench_model_tiny_llama")
    return "```\n" + format_table(data) + "\n```\n\n" + caption("bench_model_tiny_llama", page, data)


def render_determinism(page: str) -> str:
    """One bench run in fresh processes under changes: its loss and weights bit for bit."""
    data = load("determinism")
    rows = data["rows"]
    assert rows, "determinism.json has no rows"
    ref = rows[0]
    out = []
    for r in rows:
        same = r["loss_hex"] == ref["loss_hex"] and r["weights"] == ref["weights"]
        if r is ref:
            verdict = "the reference"
        elif same:
            verdict = "bitwise equal"
        else:
            verdict = f"differs: loss {abs(r['loss'] - ref['loss']) / abs(ref['loss']):.1e} relative, other weights"
        out.append([r["change"], str(r["threads"]), r["capability"], repr(r["loss"]), verdict])
    run = data["run"]
    committed = "equals" if ref["loss"] == data["committed_loss"] else "differs from"
    extra = (f"the quick preset's {run['task']} / {run['encoding']} / seed {run['seed']} run, {run['steps']} steps, each "
             f"row a fresh interpreter (PYTHONHASHSEED=0 unless the row sets it), Python {data['python']}; the "
             f"reference's loss {committed} the committed quick table's run of the same seed, bit for bit")
    return md_table(["what changes", "threads", "CPU capability", "train loss", "against the reference"], out) \
        + "\n\n" + caption("determinism", page, data, extra)


# --------------------------------------------------------------------------- real models
def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def render_demo_timing(page: str) -> str:
    """docs/bench.md: `make demo` from a fresh clone, per phase."""
    data = load("demo_cpu")
    assert not data["dry_run"] and data["returncode"] == 0, "demo_cpu.json is not a finished make demo"
    assert data["phases"], "demo_cpu.json has no phases"
    rows = [[p["phase"], duration(p["seconds"])] for p in data["phases"]]
    rows.append(["**the whole `make demo`**", f"**{duration(data['seconds'])}**"])
    extra = f"{data['fresh']}; commit {data['commit'][:7]}"
    quick = load("bench_quick")
    if data["commit"][:7] in quick.get("note", ""):  # the committed quick table is this very run
        per_task: dict[str, float] = {}
        for r in quick["runs"]:
            per_task[r["task"]] = per_task.get(r["task"], 0.0) + r["train_seconds"]
        split = ", ".join(f"{t} {duration(v)}" for t, v in sorted(per_task.items(), key=lambda kv: -kv[1]))
        extra += (f". Its training, summed over each task's runs (bench_quick.json, the same run): {split}; "
                  f"passkey and copy train in one process, the real model and then lm in the other")
    return md_table(["phase", "wall time"], rows) + "\n\n" + caption("demo_cpu", page, data, extra)


def render_real_decoding(page: str) -> str:
    """docs/real_models.md: SmolLM2 greedy decoding steps, posenc's RoPE patched in against transformers'."""
    data = load("real_speed_cpu")
    dec, rot = data["decoding"], data["rotary_step"]
    threads = list(dec["threads"])
    assert threads, "real_speed_cpu.json has no decoding rows"

    def cell(t: str, kind: str) -> str:
        r = dec["threads"][t][kind]
        lo, hi = r["ratio_quartiles"]
        return f"{r['unpatched_ms']:.1f} / {r['patched_ms']:.1f} ms: {ratio(r['median_ratio'])} ({lo:.3f}-{hi:.3f})"

    rows = [
        ["one decoding step, wall time: unpatched / patched (median): ratio (quartiles of the paired ratios)"]
        + [cell(t, "wall") for t in threads],
        ["the same steps in the process's CPU time"] + [cell(t, "cpu") for t in threads],
        ["the rotary call a decoding step makes (median, µs): transformers / posenc"]
        + [f"{rot[t]['unpatched_us']} / {rot[t]['patched_us']}" for t in threads],
    ]
    same = "the same tokens" if dec["same_tokens_patched_and_unpatched"] else "DIFFERENT tokens"
    pairs = dec["threads"][threads[0]]["wall"]["pairs"]
    head = ["", *(f"{t} thread{'s' if t != '1' else ''}" for t in threads)]
    extra = (f"the machine was shared with other jobs; model {data['model']}, loaded from the cache in "
             f"{duration(dec['load_seconds_from_cache'])}; {dec['prompt_tokens']}-token prompt, {pairs} paired "
             f"steps per thread count ({dec['rounds']} rounds of {dec['new_tokens']}); patched and unpatched "
             f"decode {same}; {duration(data['seconds'])} for the whole command")
    return md_table(head, rows) + "\n\n" + caption("real_speed_cpu", page, data, extra)


def render_real_memory(page: str) -> str:
    """docs/real_models.md: peak RSS of one perplexity forward per length, beside bench --model's estimate."""
    data = load("real_speed_cpu")
    mem = data["memory"]
    assert mem, "real_speed_cpu.json has no memory rows"
    rows = [[str(m["tokens"]), _gib(m["peak_rss_after"]), "+" + _gib(m["growth"]), _gib(m["estimate_peak"]),
             f"{m['seconds']:.1f}"] for m in mem]
    extra = (f"the machine was shared with other jobs; float32, one window, each length in a fresh process; RSS after loading {_gib(mem[0]['peak_rss_before'])}, "
             f"of which the weights {_gib(mem[0]['weights'])}")
    return (md_table(["tokens", "peak RSS", "over the loaded model", "bench --model's estimate", "seconds"], rows)
            + "\n\n" + caption("real_speed_cpu", page, data, extra))


def render_real_extend(page: str) -> str:
    """docs/real_models.md: posenc extend's candidates (perplexity and passkey at N) and the winner."""
    data = load("real_extend_smollm2_L256_N512")
    cands = data["candidates"]
    assert cands, "real_extend_smollm2_L256_N512.json has no candidates"
    s = data["settings"]
    rows = [[c["label"], f"{c['ppl']:.3f}", f"{100 * c['passkey']:.0f}", f"{c['seconds']:.1f}",
             "chosen" if c["label"] == data["winner"] else ""] for c in cands]
    total = sum(c["seconds"] for c in cands)
    extra = (f"model {data['model']} with L stated as {s['trained_length']} (trained at 8192: the procedure, not an extension), "
             f"N = {s['to']}, factors {s['factors']}, {s['windows']} window, {s['passkey_examples']} passkey example per "
             f"depth {data['depths']}; {duration(total)} of evaluation in all; the rule: {data['rule']}")
    return (md_table(["candidate", f"token ppl at {s['to']}", "passkey %", "seconds", ""], rows)
            + "\n\n" + caption("real_extend_smollm2_L256_N512", page, data, extra))


def render_probe_real(page: str) -> str:
    """docs/real_models.md: the probe's three verdicts per probed layer of SmolLM2 and Gemma 3."""
    rows, captions = [], []
    for name in ("probe_smollm2", "probe_gemma3"):
        data = load(name)
        assert data["layers"], f"{name}.json has no layers"
        for idx, layer in data["layers"].items():
            v, rope = layer["verdicts"], layer["rope"]
            hold = lambda k: "holds" if v[k]["holds"] else "does not hold"  # noqa: E731
            kind = f", {layer['layer_type'].replace('_attention', '')}" if layer.get("layer_type") else ""
            rows.append([f"{data['model'].split('-')[0]}-{data['model'].split('-')[1]} layer {idx}{kind}",
                         f"{rope['base']:.0f}", str(layer["trained_distance"]),
                         f"{hold('rise')} (rise / fall {v['rise']['rise_over_fall']:.2f})",
                         f"{hold('raised_base')} (rise {v['raised_base']['rise_over_model_fall']:.2f} F)",
                         f"{hold('low_half')} (low share {v['low_half']['low_share']:.2f})"])
        s = data["settings"]
        captions.append(caption(name, page, data, f"{s['tokens']} tokens of q and k, curves to {s['extend']:g} Ld, "
                                                  f"{s['dtype']}"))
    head = ["layer", "RoPE base", "trained distance Ld", "(a) rises again past Ld",
            "(b) base × 16 brings the decay back", "(c) low-frequency half keeps the decay"]
    return md_table(head, rows) + "\n\n" + "\n\n".join(captions)


# SmolLM2 past a stated L: each table's results files, the main run's first (add-ons only when committed)
_SMOLLM2_FILES = {
    "lm code": ("bench_model_smollm2_code", "bench_model_smollm2_code_4L"),
    "lm prose": ("bench_model_smollm2_prose", "bench_model_smollm2_prose_4L"),
    "passkey": ("bench_model_smollm2_code", "bench_model_smollm2_passkey_1.5L"),
}


def _smollm2_cells(table: str) -> tuple[dict[str, dict[int, list[float]]], list[tuple[str, dict]]]:
    """{row name: {length: values}} of one SmolLM2 table over its results files (the model's row
    first, then each scaling), and the (name, data) of each file read."""
    from posenc.hf.bench_model import variant_label

    task = table.split()[0]
    rows: dict[str, dict[int, list[float]]] = {}
    files = []
    for name in _SMOLLM2_FILES[table]:
        if name not in RESULTS:
            continue
        data = load(name)
        files.append((name, data))
        s = data["settings"]
        for run in data["runs"]:
            if run["task"] == task:
                for p in run["points"]:
                    row = s["label"] if p["variant"] == "base" else "+ " + variant_label(s, p["variant"])
                    rows.setdefault(row, {}).setdefault(p["length"], []).append(p["value"])
    assert rows, f"{table}: no points in {', '.join(_SMOLLM2_FILES[table])}"
    return rows, files


def _smollm2_caption(name: str, page: str, data: dict) -> str:
    s = data["settings"]
    L = s["trained_length"]
    parts = [f"L stated as {L} (SmolLM2 was trained at 8192: the procedure at small n, not a length-extension test)"]
    if any(r["task"] == "lm" for r in data["runs"]):
        lengths = sorted({round(f * L) for f in s["lm_eval_factors"]})
        parts.append("lm: windows of the validation text read on their own, "
                     + ", ".join(f"{max(1, s['lm_eval_tokens'] // n)} x {n}" for n in lengths) + " tokens")
    if any(r["task"] == "passkey" for r in data["runs"]):
        parts.append(f"passkey: {s['passkey_examples']} example per depth, depths "
                     f"{', '.join(f'{d:g}' for d in s['passkey_depths'])}")
    if data.get("wall_s"):
        parts.append(f"{duration(data['wall_s'])} wall for the command")
    return caption(name, page, data, "; ".join(parts))


def _smollm2_table(table: str, title: str, page: str, cell: Callable[[list[float]], str]) -> str:
    rows, files = _smollm2_cells(table)
    L = files[0][1]["settings"]["trained_length"]
    lengths = sorted({n for r in rows.values() for n in r})
    body = [[row] + [cell(r[n]) if n in r else "" for n in lengths] for row, r in rows.items()]
    return (md_table([title] + [f"{n} ({n / L:g} L)" for n in lengths], body) + "\n\n"
            + "\n\n".join(_smollm2_caption(name, page, data) for name, data in files))


def render_bench_model_smollm2(page: str) -> str:
    """docs/real_models.md: SmolLM2's token perplexity per length on both corpora, passkey per length and depth."""
    ppl = lambda v: f"{v[0]:.2f}"  # noqa: E731
    depths = "/".join(f"{d:g}" for d in load("bench_model_smollm2_code")["settings"]["passkey_depths"])
    return "\n\n".join([
        _smollm2_table("lm code", "token perplexity, Python sources", page, ppl),
        _smollm2_table("lm prose", "token perplexity, King James Bible", page, ppl),
        _smollm2_table("passkey", f"passkey % (right at depth {depths})", page,
                       lambda v: f"{100 * sum(v) / len(v):.0f} ({'/'.join(f'{x:.0f}' for x in v)})"),
    ])


def render_bench_model_smollm2_readme(page: str) -> str:
    """README: SmolLM2 at 2L (L stated as 1024): token perplexity on both corpora and passkey, per row."""
    code, files = _smollm2_cells("lm code")
    prose, prose_files = _smollm2_cells("lm prose")
    passkey, _ = _smollm2_cells("passkey")
    L = files[0][1]["settings"]["trained_length"]
    n = 2 * L
    fmt = lambda r: f"{r[n][0]:.2f}" if n in r else ""  # noqa: E731
    body = [[row, fmt(code[row]), fmt(prose.get(row, {})),
             f"{100 * sum(passkey[row][n]) / len(passkey[row][n]):.0f}" if n in passkey.get(row, {}) else ""]
            for row in code]
    return (md_table([f"at {n} tokens (2L, L stated as {L})", "token ppl, Python sources", "token ppl, King James Bible",
                      "passkey %"], body)
            + "\n\n" + "\n\n".join(_smollm2_caption(name, page, data) for name, data in (files[0], prose_files[0])))


# Peng et al. 2023 (YaRN, arXiv 2309.00071), its statements about scalings without fine-tuning,
# each as (section, the claim, the variants compared as (better, worse...)). "base" is the model as
# it is; Llama 3's rule is the paper's NTK-by-parts ramp over wavelengths without the temperature.
_YARN_CLAIMS = (
    ("abstract, introduction", "past L the model without a scaling fails; a training-free scaling keeps it working",
     ("ntk", "dynamic", "yarn", "llama3"), ("base",)),
    ("\"NTK-aware\" interpolation", "NTK-aware extends a model without fine-tuning much better than PI", ("ntk",), ("linear",)),
    ("\"NTK-by-parts\" interpolation", "NTK-by-parts (here Llama 3's ramp, no temperature) beats NTK-aware and PI", ("llama3",), ("ntk", "linear")),
    ("YaRN", "YaRN (by-parts and the temperature 0.1 ln s + 1) beats every earlier method", ("yarn",),
     ("linear", "ntk", "dynamic", "llama3")),
    ("dynamic scaling", "a factor from the current length (dynamic) degrades gracefully where a fixed factor breaks",
     ("dynamic",), ("ntk",)),
)


def render_bench_model_smollm2_yarn(page: str) -> str:
    """docs/real_models.md: YaRN's training-free ordering, claim by claim, against SmolLM2 at 2L."""
    from posenc.rotary.scaling import SCALINGS

    columns = {}  # (corpus, length) -> {variant: ppl}, at 2L and, where a 4L file is committed, 4L
    for table, corpus in (("lm code", "Python sources"), ("lm prose", "King James Bible")):
        rows, files = _smollm2_cells(table)
        s = files[0][1]["settings"]
        L = s["trained_length"]
        for n in (2 * L, 4 * L):
            vals = {v: rows[s["label"] if v == "base" else "+ " + SCALINGS[v].label].get(n)
                    for v in ("base", *s["scalings"])}
            if all(x is not None for x in vals.values()):
                columns[corpus, n] = {v: x[0] for v, x in vals.items()}
    label = lambda v: "the model as it is" if v == "base" else SCALINGS[v].label  # noqa: E731
    body = []
    for where, claim, better, worse in _YARN_CLAIMS:
        cells, verdicts = [], []
        for (corpus, n), vals in columns.items():
            b = {v: vals[v] for v in better}
            w = {v: vals[v] for v in worse}
            cells.append(", ".join(f"{label(v)} {x:.2f}" for v, x in (b | w).items()))
            if worse == ("ntk",) and better == ("dynamic",):
                same = abs(b["dynamic"] - w["ntk"]) <= 1e-3 * w["ntk"]
                verdicts.append("not tested: equal within 0.1 % in one-window reads" if same else "they differ")
            else:
                verdicts.append("holds" if max(b.values()) < min(w.values()) else "does not hold")
        names = [f"{corpus} {n // L}L" for corpus, n in columns]
        verdict = (verdicts[0] if len(set(verdicts)) == 1
                   else "; ".join(f"{name}: {v}" for name, v in zip(names, verdicts)))
        body.append([where, claim, *cells, verdict])
    return md_table(["Peng et al. 2023", "claim (no fine-tuning)",
                     *(f"token ppl at {n // L}L, {corpus}" for corpus, n in columns),
                     f"on SmolLM2 (L stated as {L})"], body)


TABLES: dict[str, Callable[[str], str]] = {
    "results_files": render_results_files,
    "determinism": render_determinism,
    "bench_quick": render_bench_quick,
    "bench_quick_text": render_bench_quick_text,
    "rope_cpu": render_rope_cpu,
    "rope_cpu_kernels": render_rope_cpu_kernels,
    "relative_scores": render_relative_scores,
    "relative_bias": render_relative_bias,
    "relative_8192": render_relative_8192,
    "model_cpu": render_model_cpu,
    "check_cpu": render_check_cpu,
    "hf_parity": render_hf_parity,
    "probe_tiny_llama": render_probe_tiny_llama,
    "bench_model_tiny_llama": render_bench_model_tiny_llama,
    "bench_standard": render_bench_standard,
    "bench_standard_orderings": render_bench_standard_orderings,
    "demo_timing": render_demo_timing,
    "real_decoding": render_real_decoding,
    "real_memory": render_real_memory,
    "real_extend": render_real_extend,
    "probe_real": render_probe_real,
    "bench_model_smollm2": render_bench_model_smollm2,
    "bench_model_smollm2_readme": render_bench_model_smollm2_readme,
    "bench_model_smollm2_yarn": render_bench_model_smollm2_yarn,
}


# ---------------------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------------------
def render_page(page: str, text: str) -> str:
    """``text`` with every marked table re-rendered (an unknown table name is a ValueError)."""

    def sub(m: re.Match) -> str:
        name = m["name"]
        if name not in TABLES:
            raise ValueError(f"{page}: unknown table {name!r}; known: {', '.join(TABLES)}")
        return m.group(1) + TABLES[name](page).rstrip("\n") + "\n" + m.group(4)

    opened = re.findall(r"<!-- table: ([\w-]+) -->", text)
    closed = [m["name"] for m in MARKER.finditer(text)]
    if opened != closed:
        unclosed = [n for n in opened if n not in closed] or opened
        raise ValueError(f"{page}: table marker {unclosed[0]!r} has no closing <!-- /table --> "
                         "(or markers are nested)")
    return MARKER.sub(sub, text)


def tables_in(text: str) -> list[str]:
    return [m["name"] for m in MARKER.finditer(text)]


def render_all(write: bool) -> list[str]:
    """Re-render every page; returns the pages whose text changed (written when ``write``)."""
    changed = []
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        new = render_page(page, text)
        if new != text:
            changed.append(page)
            if write:
                path.write_text(new)
    return changed


# ---------------------------------------------------------------------------------------
# Re-running the measurements
# ---------------------------------------------------------------------------------------
def _machine_now(threads: int | None) -> str:
    import torch

    from posenc.speed.timing import describe_machine

    if threads:
        torch.set_num_threads(threads)
    return describe_machine()


def rerun(name: str) -> float:
    """Run the command of ``name`` in a fresh process, record machine/command/wall time; seconds."""
    res = _result(name)
    if res.argv[0] == "python":
        argv = [sys.executable, *res.argv[1:]]
    else:
        argv = [sys.executable, "-m", "posenc", *res.argv]
    print(f"[{name}] {res.command}", flush=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        raise RuntimeError(f"{res.command} exited with {proc.returncode}")
    for src, dst in res.copy:
        shutil.copyfile(ROOT / src, ROOT / dst)
    if res.stdout == "json":
        data = json.loads(proc.stdout)
        res.path.with_suffix(".txt").unlink(missing_ok=True)  # an older console table of this file: stale now
    else:
        data = json.loads(res.path.read_text())
        if res.stdout == "txt":
            res.path.with_suffix(".txt").write_text(proc.stdout)
    if res.stdout == "json" and "results" not in data and "rows" not in data:
        data = {"results": data}  # posenc check prints {encoding: {check: ...}}
    data.setdefault("machine", _machine_now(res.threads))
    data["command"] = res.command
    data["wall_s"] = wall
    res.path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"[{name}] {duration(wall)}", flush=True)
    return wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tables.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="exit 1 if a committed table differs from its results file")
    g.add_argument("--rerun", nargs="*", metavar="NAME", default=None,
                   help=f"re-run these measurements (default: every one with rerun=True), then render; any of {', '.join(RESULTS)}")
    g.add_argument("--list", action="store_true", help="print every results file and its command")
    args = p.parse_args(argv)
    if args.list:
        for name, res in RESULTS.items():
            print(f"{name:<24} {res.file:<28} {res.command}" + (f"  ({res.note})" if res.note else ""))
        return 0
    if args.rerun is not None:
        names = args.rerun or [n for n, r in RESULTS.items() if r.rerun]
        try:
            for n in names:
                _result(n)  # every name checked before the first (long) run
        except ValueError as e:
            p.error(f"--rerun: {e}")
        times = {n: rerun(n) for n in names}
        print("wall times: " + ", ".join(f"{n} {duration(t)}" for n, t in times.items()))
    try:
        changed = render_all(write=not args.check)
    except (ValueError, OSError) as e:
        print(f"tables.py: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        if changed:
            print("tables out of date in: " + ", ".join(changed) + "; run python benchmarks/tables.py", file=sys.stderr)
            return 1
        print("every table matches its results file")
        return 0
    print("re-rendered: " + (", ".join(changed) if changed else "nothing changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
