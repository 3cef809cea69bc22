"""The results files in ``benchmarks/results/`` and the command that writes each one.

A results file is a measurement; the command here is how ``python benchmarks/tables.py --rerun
NAME`` regenerates it (a file may record the command that actually wrote it, which the captions
prefer). The machine comes from the file; a command that does not record one (the real-model
runs) states it here.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    """A committed results file and the command that regenerates it.

    ``argv`` is a ``posenc`` command without the program name, or a script run by ``python``
    (``("python", "benchmarks/x.py", ...)``). ``stdout``: ``"json"`` (the command prints the
    JSON document, written to ``file``), ``"txt"`` (a console table kept beside the JSON the
    command writes itself) or ``None``. ``copy``: (produced path, committed path) pairs copied
    after the run (a benchmark writes into an output folder).
    """

    file: str
    argv: tuple[str, ...]
    stdout: str | None = None
    copy: tuple[tuple[str, str], ...] = ()
    threads: int | None = None  # the command's --threads, for the recorded machine line
    rerun: bool = True  # False: a historical file that --rerun leaves alone
    note: str = ""
    machine: str = ""  # the machine, stated here for a file whose command does not record one
    bench: bool = False  # a posenc bench results.json (read by posenc.results.read_results)

    @property
    def command(self) -> str:
        """The command as a reader types it (redirecting stdout where the JSON is printed)."""
        cmd = shlex.join(self.argv) if self.argv[0] == "python" else "posenc " + shlex.join(self.argv)
        if self.stdout == "json":
            cmd += f" > benchmarks/results/{self.file}"
        return cmd


def recorded_command(res: Result, data: dict) -> str:
    """The command that wrote ``data`` as the file records it, else the one that rewrites it."""
    return data.get("command") or data.get("meta", {}).get("command") or res.command


def _bench(name: str, argv: tuple[str, ...], folder: str, *, extra_copies=(), **kw) -> Result:
    """A ``posenc bench`` run whose results.json (and results.csv, when asked) is committed."""
    return Result(f"{name}.json", argv, copy=((f"{folder}/results.json", f"benchmarks/results/{name}.json"),
                                              *extra_copies), threads=1, bench=True, **kw)


_MODEL_FLAGS = ("--lengths", "1024", "--batch", "2", "--layers", "6", "--width", "512", "--heads", "8",
                "--rounds", "5", "--decode-contexts", "1024", "4096", "--decode-tokens", "16")
_SHARED_EPYC = "AMD EPYC, 2 cores shared with other jobs, torch 2.13.0+cpu"
_SMOLLM2 = ("bench", "--model", "smollm2-135m", "--trained-length", "1024")
_QUIET = ("--threads", "1")


def _smollm2(name: str, *flags: str) -> Result:
    folder = f"out/{name.replace('bench_model_', 'bench_')}"
    return _bench(name, (*_SMOLLM2, *flags, *_QUIET, "--out", folder, "--overwrite", "--no-progress"), folder,
                  machine=_SHARED_EPYC + ", 1 thread")


def _probe(model: str, name: str, *flags: str) -> Result:
    folder = f"out/{name}"
    return Result(f"{name}.json", ("probe", model, "--out", folder, "--points", "1024", *flags, *_QUIET),
                  copy=((f"{folder}/probe.json", f"benchmarks/results/{name}.json"),), threads=1,
                  machine=_SHARED_EPYC + ", 1 thread")


RESULTS: dict[str, Result] = {
    "rope_cpu": Result(
        "rope_cpu.json", ("speed", "rope", "--device", "cpu", "--lengths", "512", "2048", "8192", "--repeat", "7", "--json"),
        stdout="json"),
    "rope_h100": Result(
        "rope_h100.json", ("speed", "rope", "--device", "cuda", "--lengths", "4096", "32768", "--dtypes", "bfloat16",
                           "float32", "--impls", "copy", "hf", "posenc", "posenc-triton-table", "posenc-triton-angles",
                           "--json", "benchmarks/results/rope_h100.json"), rerun=False,
        note="needs a CUDA GPU"),
    "relative_cpu": Result(
        "relative_cpu.json",
        ("speed", "relative", "--device", "cpu", "--lengths", "512", "1024", "2048", "4096", "--repeat", "3",
         "--json", "benchmarks/results/relative_cpu.json"), stdout="txt"),
    "relative_cpu_8192": Result(
        "relative_cpu_8192.json",
        ("speed", "relative", "--device", "cpu", "--lengths", "8192", "--einsum-max-length", "4096", "--repeat", "1",
         "--json", "benchmarks/results/relative_cpu_8192.json"), stdout="txt"),
    "model_cpu": Result(
        "model_cpu.json", ("speed", "model", "--device", "cpu", *_MODEL_FLAGS, "--json", "benchmarks/results/model_cpu.json"),
        stdout="txt"),
    "bench_quick": _bench(
        "bench_quick", ("bench", "--preset", "quick", *_QUIET, "--out", "out/bench_results", "--overwrite", "--no-progress"),
        "out/bench_results",
        extra_copies=(("out/bench_results/results.csv", "benchmarks/results/bench_quick.csv"),
                      *((f"out/bench_results/plots/task_{t}.png", f"docs/img/task_{t}.png") for t in ("copy", "passkey", "lm")))),
    # one 1-thread process per core over shares of the tasks, then collected (bench_split.py); it
    # resumes what out/bench_standard holds: delete that folder to start over
    "bench_standard": _bench(
        "bench_standard",
        ("python", "benchmarks/bench_split.py", "--preset", "standard", "--out", "out/bench_standard"),
        "out/bench_standard", extra_copies=(("out/bench_standard/results.csv", "benchmarks/results/bench_standard.csv"),),
        note="every 1-D encoding and RoPE variant x every task x 3 seeds (960 runs): about 35 min on a 2-core "
             "CPU as two 1-thread processes"),
    "check_cpu": Result("check_cpu.json", ("check", "--json"), stdout="json"),
    "hf_parity": Result("hf_parity.json", ("python", "benchmarks/hf_parity.py", "--out", "benchmarks/results/hf_parity.json")),
    # train a tiny byte-level Llama (out/tiny_llama, not committed), then probe it
    "probe_tiny_llama": Result(
        "probe_tiny_llama.json",
        ("python", "benchmarks/train_tiny_hf.py", "--out", "out/tiny_llama", "--probe", "out/probe_tiny_llama",
         "--no-progress", "--probe-args", "--dtype", "float32", "--extend", "8"),
        copy=(("out/probe_tiny_llama/probe.json", "benchmarks/results/probe_tiny_llama.json"),
              ("out/probe_tiny_llama/probe_layer0.png", "docs/img/probe_tiny_llama.png")),
        threads=1),
    "determinism": Result("determinism.json", ("python", "benchmarks/determinism.py", "--out",
                                               "benchmarks/results/determinism.json")),
    "bench_model_tiny_llama": _bench(
        "bench_model_tiny_llama",
        ("bench", "--model", "out/tiny_llama", "--out", "out/bench_tiny_llama", "--tasks", "lm", "--lm-eval-tokens", "8192",
         *_QUIET, "--overwrite", "--no-progress"),
        "out/bench_tiny_llama", note="needs out/tiny_llama: run --rerun probe_tiny_llama first"),
    "demo_cpu": Result(
        "demo_cpu.json", ("python", "benchmarks/demo_timing.py", "--out", "benchmarks/results/demo_cpu.json"),
        note="make demo from a fresh clone; about 15 min on 2 cores"),
    "real_speed_cpu": Result(
        "real_speed_cpu.json",
        ("python", "benchmarks/real_speed.py", "--rounds", "4", "--new-tokens", "40", "--memory-lengths", "1024", "4096",
         "16384", "--out", "benchmarks/results/real_speed_cpu.json"),
        note="SmolLM2-135M from the cache (posenc[hf]); 24 min on a shared 2-core machine"),
    "real_extend_smollm2_L256_N512": Result(
        "real_extend_smollm2_L256_N512.json",
        ("extend", "smollm2-135m", "--to", "512", "--trained-length", "256", "--factors", "1", "--json",
         "benchmarks/results/real_extend_smollm2_L256_N512.json", "--no-progress"),
        machine=_SHARED_EPYC + ", torch's default 2 threads", note="about 10 min on 2 cores"),
    "probe_smollm2": _probe("smollm2-135m", "probe_smollm2"),
    "probe_gemma3": _probe("gemma3-270m", "probe_gemma3", "--scalings", "yarn"),
    # SmolLM2 past a stated L on both corpora; passkey reads no corpus (in the code file only)
    "bench_model_smollm2_code": _smollm2("bench_model_smollm2_code", "--lm-eval-tokens", "2048", "--corpus", "code"),
    "bench_model_smollm2_prose": _smollm2("bench_model_smollm2_prose", "--lm-eval-tokens", "2048", "--corpus", "prose",
                                          "--tasks", "lm"),
    # the same at 4L alone (one window of 4096 tokens)
    **{f"bench_model_smollm2_{corpus}_4L": _smollm2(
        f"bench_model_smollm2_{corpus}_4L", "--tasks", "lm", "--lm-eval-factors", "4", "--lm-eval-tokens", "4096",
        "--corpus", corpus) for corpus in ("prose", "code")},
    # SmolLM2 past its own L = 8192: every scaling and method at 1.5L and 2L, one process per corpus
    **{f"bench_model_smollm2_L8192_{corpus}": _bench(
        f"bench_model_smollm2_L8192_{corpus}",
        ("bench", "--model", "smollm2-135m", "--preset", "standard", "--tasks", "lm", "--corpus", corpus,
         "--lm-eval-factors", "1", "1.5", "2", "--lm-eval-tokens", "16384", *_QUIET, "--resume", "--no-progress",
         "--out", f"out/ext/lm_{corpus}"), f"out/ext/lm_{corpus}",
        note="one of two 1-thread processes (code, prose) side by side; about an hour each on a quiet 2-core CPU")
        for corpus in ("code", "prose")},
    # the needle tasks at 2L, in two shards of disjoint prompts (one eval seed each, one process per core)
    **{f"bench_model_smollm2_L8192_tasks_s{seed}": _bench(
        f"bench_model_smollm2_L8192_tasks_s{seed}",
        ("bench", "--model", "smollm2-135m", "--preset", "standard", "--tasks", "passkey", "multikey", "vartrack",
         "--passkey-eval-factors", "2", "--passkey-depths", "0.25", "0.75", "--passkey-examples", "1",
         "--eval-seed", str(seed), "--scalings", "yarn", "ntk", "--methods", "self_extend", "dual_chunk", "rerope",
         "--raised-base", "0", *_QUIET, "--resume", "--no-progress", "--out", f"out/tasks/seed{seed}"),
        f"out/tasks/seed{seed}",
        note="one of two 1-thread processes (eval seeds 0 and 1: disjoint prompts) side by side; pooled by "
             "posenc.hf.bench_merge")
        for seed in (0, 1)},
    # 4L (32768 tokens) on the code corpus, one window: on one GPU, the last two method rows on the CPU
    "bench_model_smollm2_L8192_code_4L": _bench(
        "bench_model_smollm2_L8192_code_4L",
        ("bench", "--model", "smollm2-135m", "--preset", "standard", "--device", "cuda", "--threads", "2",
         "--tasks", "lm", "--corpus", "code", "--lm-eval-factors", "4", "--lm-eval-tokens", "32768", "--resume",
         "--no-progress", "--out", "out/gpu/lm_code_4L"), "out/gpu/lm_code_4L", rerun=False,
        note="needs a CUDA GPU to take minutes (on this CPU, beside other runs, a forward of 32768 tokens took 12 to 17 min)"),
    # bench --model's printed estimate against the wall time, one process per core
    "bench_model_smollm2_estimate_cpu": _bench(
        "bench_model_smollm2_estimate_cpu",
        ("bench", "--model", "smollm2-135m", "--preset", "standard", "--tasks", "lm", "--corpus", "code",
         "--lm-eval-factors", "1.5", "--lm-eval-tokens", "12288", "--scalings", "yarn", "--methods", "self_extend",
         "--raised-base", "0", "--threads", "1", "--no-progress", "--out", "out/estimate_check"), "out/estimate_check",
        rerun=False, note="the wall time and the printed estimate are read off the run (its log), not the results"),
    # passkey at 4L, eval seed 0: the model and the scalings on one GPU, the methods finished on the CPU
    "bench_model_smollm2_L8192_passkey_4L_s0": _bench(
        "bench_model_smollm2_L8192_passkey_4L_s0",
        ("bench", "--model", "smollm2-135m", "--preset", "standard", "--device", "cuda", "--threads", "2",
         "--tasks", "passkey", "--passkey-depths", "0.25", "0.75", "--passkey-examples", "1", "--scalings", "yarn",
         "ntk", "--methods", "self_extend", "dual_chunk", "rerope", "--raised-base", "0", "--passkey-eval-factors",
         "4", "--eval-seed", "0", "--resume", "--no-progress", "--out", "out/gpu/passkey_4L_s0"),
        "out/gpu/passkey_4L_s0", rerun=False, note="needs a CUDA GPU to take minutes"),
    # the needle tasks within L and at 1.5L, on one GPU (benchmarks/extension_gpu.sh; two shards as above)
    **{f"bench_model_smollm2_L8192_tasks_1.5L_s{seed}": _bench(
        f"bench_model_smollm2_L8192_tasks_1.5L_s{seed}",
        ("bench", "--model", "smollm2-135m", "--preset", "standard", "--device", "cuda", "--threads", "2",
         "--tasks", "passkey", "multikey", "vartrack", "--passkey-depths", "0.25", "0.75", "--passkey-examples", "1",
         "--scalings", "yarn", "ntk", "--methods", "self_extend", "dual_chunk", "rerope", "--raised-base", "0",
         "--passkey-eval-factors", "1", "1.5", "--eval-seed", str(seed), "--resume", "--no-progress",
         "--out", f"out/gpu/tasks_1.5L_s{seed}"), f"out/gpu/tasks_1.5L_s{seed}", rerun=False,
        note="needs a CUDA GPU: bash benchmarks/extension_gpu.sh out/gpu runs it")
        for seed in (0, 1)},
    # llama.cpp (llama-cpp-python 0.3.36, a float32 GGUF) against transformers + posenc past SmolLM2's L
    "engine_llamacpp_cpu": Result(
        "engine_llamacpp_cpu.json", ("python", "benchmarks/engine_llamacpp.py", "run", "--threads", "1", "--out",
                                     "benchmarks/results/engine_llamacpp_cpu.json"), threads=1),
    "cope_cpu": Result("cope_cpu.json", ("python", "benchmarks/cope.py", "--out", "benchmarks/results/cope_cpu.json")),
    "method_cost_cpu": Result(
        "method_cost_cpu.json", ("python", "benchmarks/method_cost.py", "--out", "benchmarks/results/method_cost_cpu.json")),
    # the code file's passkey at 1.5L, run apart (the main run has L and 2L)
    "bench_model_smollm2_passkey_1.5L": _smollm2("bench_model_smollm2_passkey_1.5L", "--tasks", "passkey",
                                                 "--passkey-eval-factors", "1.5"),
}
