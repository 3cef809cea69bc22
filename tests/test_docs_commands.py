"""Every command the README quotes runs, in a smoke-sized form.

The quoted commands are read from README.md: each line of a ```bash block (comments dropped)
and each inline code span that starts with ``posenc``, ``python``, ``torchrun`` or ``make``
(whitespace normalised, since a span may wrap). ``SMOKE`` maps every quoted command, exactly as
written, to what makes it small: flags whose values are replaced (tiny lengths, one repeat, an
output under the test's tmp folder), extra arguments, or, for a form with placeholders
(``KIND``, ``DIR``, ``...``), the whole argv. A quoted command without an entry fails, and so
does an entry the README no longer quotes, so a new README command cannot go untested.

``posenc`` commands run in-process through ``posenc.cli.main`` (an import of torch per command
would cost more than most of the commands); ``torchrun`` runs as a subprocess; ``make``
targets are not run (they build a venv): their recipe's ``posenc`` commands must each be quoted
in the README, and so are smoke-tested through their own entries.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PREFIXES = ("posenc", "python", "torchrun", "make")


def quoted_commands(text: str) -> list[str]:
    """The commands a Markdown page quotes, in order of first appearance, each once."""
    found: list[str] = []
    for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                found.append(line)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        cmd = " ".join(span.split())
        if cmd.split(" ", 1)[0] in PREFIXES:
            found.append(cmd)
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Smoke:
    """How one quoted command is run small.

    ``set``: flag -> values that replace the quoted values (the flag is added when absent);
    ``add``: extra arguments; ``argv``: the whole argv instead of the quoted one (placeholders);
    ``expect``: files that must exist afterwards. ``{tmp}`` is the test's folder, ``{bench}``
    a finished micro benchmark. ``how``: "posenc" (in-process), "tables"
    (benchmarks/tables.py on a copy of the pages), "subprocess" or "make". ``real``: the command
    reads a named real model (the hf extra's transformers, gguf and accelerate; ``make test``
    installs and converts SmolLM2-135M), run small: a few dozen tokens, one thread. ``before``:
    quoted commands run first, by their own entries, into the same folder (what this one reads).
    """

    set: dict[str, list[str]] = field(default_factory=dict)
    add: tuple[str, ...] = ()
    argv: tuple[str, ...] | None = None
    expect: tuple[str, ...] = ()
    how: str = "posenc"
    real: bool = False
    before: tuple[str, ...] = ()
    needs: str = ""  # a path that must exist (a benchmark-only build), else the smoke is skipped


_TINY_RELATIVE = {"--lengths": ["16"], "--repeat": ["1"]}
_TINY_MODEL = {"--lengths": ["16"], "--batch": ["1"], "--layers": ["1"], "--width": ["32"], "--heads": ["2"],
               "--rounds": ["1"], "--decode-contexts": ["8"], "--decode-tokens": ["1"]}
_TINY_BENCH = ("--steps", "2", "--encodings", "rope", "--tasks", "copy", "--no-progress")
# A named real model, small: 32 tokens of q and k, a trained length of 32 or 48 (a passkey prompt
# needs about 80 tokens, so extend's N is 96), one window and one passkey example, one thread.
_REAL_PROBE = {"--out": ["{tmp}/probe"], "--tokens": ["32"], "--points": ["16"], "--extend": ["2"], "--threads": ["1"]}
_GEMMA_PROBE = {**_REAL_PROBE, "--layer": ["0"]}  # its global layer's curve to 2 x 32768 alone takes a minute
_REAL_EXTEND = {"--to": ["96"], "--trained-length": ["48"], "--factors": ["1"], "--windows": ["1"],
                "--passkey-examples": ["1"], "--threads": ["1"], "--json": ["{tmp}/ext.json"]}
_MODEL = ("posenc speed model --lengths 1024 --batch 2 --layers 6 --width 512 --heads 8 --rounds 3 "
          "--decode-contexts 1024 4096 --decode-tokens 16")

SMOKE: dict[str, Smoke] = {
    "make demo": Smoke(how="make"),
    "make test": Smoke(how="make"),
    "posenc list --short": Smoke(),
    "posenc check": Smoke(add=("rope",)),
    "posenc rope FILE": Smoke(argv=("rope", "{hf}", "--json", "{tmp}/rope.json"), expect=("{tmp}/rope.json",)),
    "posenc bench --preset quick --threads 1 --out out/bench --resume": Smoke(
        set={"--out": ["{tmp}/bench"]}, add=_TINY_BENCH, expect=("{tmp}/bench/results.json",)),
    # make demo's report: the real model's folders come from the two commands below, run small
    "posenc report --out out/report --probe out/probe --model-bench out/model_bench --bench out/bench": Smoke(
        set={"--out": ["{tmp}/report"], "--bench": ["{bench}"], "--probe": ["{tmp}/probe"], "--model-bench": ["{tmp}/bm"]},
        add=("--encodings", "rope", "--plots", "rope-score"), expect=("{tmp}/report/report.html",), real=True,
        before=("posenc probe smollm2-135m --out out/probe --threads 1 --no-progress",
                "posenc bench --model smollm2-135m --lm-eval-factors 1.5 --lm-eval-tokens 12288 --passkey-eval-factors 1.5 "
                "--passkey-depths 0.5 --passkey-examples 1 --scalings yarn --methods self_extend --raised-base 0 "
                "--threads 1 --resume --out out/model_bench --no-progress")),
    "posenc list": Smoke(),
    # run as users run it, in a process of its own: a no-op where make test's install built the
    # kernel, else it builds it (into $POSENC_KERNELS or the user's cache)
    "python -m posenc.rotary.build_cpu_kernel": Smoke(
        argv=("python", "-m", "posenc.rotary.build_cpu_kernel"), how="subprocess"),
    # make demo's last step; a micro run against itself agrees
    "python benchmarks/compare_bench.py out/bench/results.json benchmarks/results/bench_quick.json": Smoke(
        argv=("benchmarks/compare_bench.py", "{bench}/results.json", "{bench}/results.json"), how="script"),
    "posenc bench": Smoke(argv=("bench", "--preset", "micro", "--out", "{tmp}/b", "--no-progress"),
                          expect=("{tmp}/b/results.json", "{tmp}/b/results.csv")),
    "python benchmarks/tables.py": Smoke(how="tables"),
    "python benchmarks/tables.py --check": Smoke(how="tables"),
    "posenc probe smollm2-135m --out out/probe --threads 1 --no-progress": Smoke(
        set=_REAL_PROBE, expect=("{tmp}/probe/probe.json",), real=True),
    # make demo's real model past its own L, run small: L stated as 48, the passkey at 2L (a prompt needs ~80 tokens)
    "posenc bench --model smollm2-135m --lm-eval-factors 1.5 --lm-eval-tokens 12288 --passkey-eval-factors 1.5 "
    "--passkey-depths 0.5 --passkey-examples 1 --scalings yarn --methods self_extend --raised-base 0 "
    "--threads 1 --resume --out out/model_bench --no-progress": Smoke(
        set={"--lm-eval-tokens": ["96"], "--lm-eval-factors": ["2"], "--passkey-eval-factors": ["2"],
             "--out": ["{tmp}/bm"]}, add=("--trained-length", "48"), expect=("{tmp}/bm/results.json",), real=True),
    "posenc extend smollm2-135m --to 2048 --trained-length 1024 --json out/smollm2-2k.json": Smoke(
        set=_REAL_EXTEND, add=("--no-progress",), expect=("{tmp}/ext.json",), real=True),
}


def _load_tables(root: Path | None = None):
    """benchmarks/tables.py as a fresh module (pages and results under ``root`` if given)."""
    name = f"_tables_{id(root)}"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "tables.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[name]
    if root is not None:
        mod.ROOT, mod.RESULTS_DIR = root, root / "benchmarks" / "results"
    return mod


TABLES = _load_tables()

# The command of every results file (benchmarks/tables.py RESULTS), run small. The README quotes
# these under its tables; each runs here both as the file records it and as --rerun would
# write it, so a re-run cannot put an untested command under a table.
RESULT_SMOKE: dict[str, Smoke] = {
    "rope_cpu": Smoke(set=_TINY_RELATIVE),
    # measured on a GPU; here on the CPU with the implementations a CPU has (no Triton)
    "rope_h100": Smoke(set={**_TINY_RELATIVE, "--device": ["cpu"], "--impls": ["copy", "hf", "posenc"],
                            "--json": ["{tmp}/rope.json"]}, expect=("{tmp}/rope.json",)),
    "relative_cpu": Smoke(set={**_TINY_RELATIVE, "--json": ["{tmp}/relative.json"]}, expect=("{tmp}/relative.json",)),
    "relative_cpu_8192": Smoke(set={**_TINY_RELATIVE, "--einsum-max-length": ["8"], "--json": ["{tmp}/r8192.json"]},
                               expect=("{tmp}/r8192.json",)),
    "model_cpu": Smoke(set={**_TINY_MODEL, "--json": ["{tmp}/model.json"]}, expect=("{tmp}/model.json",)),
    "bench_quick": Smoke(set={"--out": ["{tmp}/bench"]}, add=_TINY_BENCH, expect=("{tmp}/bench/results.json",)),
    "bench_standard": Smoke(set={"--out": ["{tmp}/bench"]}, how="script", expect=("{tmp}/bench/results.json",),
                            add=("--processes", "1", "--tasks", "copy", "--", "--steps", "2", "--encodings", "rope",
                                 "--no-progress")),
    "check_cpu": Smoke(argv=("check", "rope", "--json")),
    "probe_tiny_llama": Smoke(
        argv=("benchmarks/train_tiny_hf.py", "--out", "{tmp}/tl", "--steps", "3", "--layers", "1", "--width", "32",
              "--heads", "2", "--length", "32", "--train-bytes", "20000", "--eval-windows", "2", "--no-progress",
              "--probe", "{tmp}/p"),
        expect=("{tmp}/p/probe.json",), how="script"),
    "bench_model_tiny_llama": Smoke(
        argv=("bench", "--model", "{hf}", "--preset", "micro", "--tasks", "lm", "--out", "{tmp}/bmt", "--no-progress"),
        expect=("{tmp}/bmt/results.json",)),
    "hf_parity": Smoke(set={"--out": ["{tmp}/hf.json"]}, add=("--case", "llama"), expect=("{tmp}/hf.json",),
                       how="script"),
    "determinism": Smoke(set={"--out": ["{tmp}/det.json"], "--steps": ["2"]}, expect=("{tmp}/det.json",), how="script"),
    # make -n demo in a fresh clone: the script's plumbing (clone, fresh cache, log, phases), no install
    "demo_cpu": Smoke(set={"--out": ["{tmp}/demo.json"]}, add=("--dry-run",), expect=("{tmp}/demo.json",),
                      how="script"),
    "real_speed_cpu": Smoke(
        set={"--rounds": ["1"], "--new-tokens": ["3"], "--prompt-tokens": ["8"], "--threads": ["1"],
             "--memory-lengths": [], "--out": ["{tmp}/real_speed.json"]},
        expect=("{tmp}/real_speed.json",), how="script", real=True),
    "real_extend_smollm2_L256_N512": Smoke(set=_REAL_EXTEND, expect=("{tmp}/ext.json",), real=True),
    "probe_smollm2": Smoke(set=_REAL_PROBE, expect=("{tmp}/probe/probe.json",), real=True),
    "probe_gemma3": Smoke(set=_GEMMA_PROBE, expect=("{tmp}/probe/probe.json",), real=True),
    # SmolLM2 past a stated L (issue 22 item 3): passkey needs ~80 tokens, so the code run's L is 48 and its passkey 2L
    "bench_model_smollm2_code": Smoke(
        set={"--trained-length": ["48"], "--lm-eval-tokens": ["96"], "--out": ["{tmp}/bm"]},
        add=("--preset", "micro", "--passkey-eval-factors", "2"), expect=("{tmp}/bm/results.json",), real=True),
    "bench_model_smollm2_prose": Smoke(
        set={"--trained-length": ["32"], "--lm-eval-tokens": ["64"], "--out": ["{tmp}/bm"]},
        add=("--preset", "micro"), expect=("{tmp}/bm/results.json",), real=True),
    "bench_model_smollm2_prose_4L": Smoke(
        set={"--trained-length": ["32"], "--lm-eval-tokens": ["128"], "--out": ["{tmp}/bm"]},
        add=("--preset", "micro"), expect=("{tmp}/bm/results.json",), real=True),
    "bench_model_smollm2_passkey_1.5L": Smoke(
        set={"--trained-length": ["64"], "--out": ["{tmp}/bm"]},
        add=("--preset", "micro", "--passkey-examples", "1", "--passkey-depths", "0.5"),
        expect=("{tmp}/bm/results.json",), real=True),
    # SmolLM2 past its own L, run small: L stated as 48, one window of 96 tokens at each length
    **{f"bench_model_smollm2_L8192_{corpus}": Smoke(
        set={"--preset": ["micro"], "--lm-eval-tokens": ["96"], "--out": ["{tmp}/bm"]},
        add=("--trained-length", "48", "--methods", "self_extend"), expect=("{tmp}/bm/results.json",), real=True)
       for corpus in ("code", "prose")},
    # the needle tasks past its own L, run small: L stated as 128 (prompts of 256 tokens), one row of each kind
    **{f"bench_model_smollm2_L8192_tasks_s{seed}": Smoke(
        set={"--preset": ["micro"], "--scalings": ["yarn"], "--methods": ["self_extend"], "--out": ["{tmp}/bm"]},
        add=("--trained-length", "128"), expect=("{tmp}/bm/results.json",), real=True) for seed in (0, 1)},
    # the estimate check, run small: L stated as 48, one window of 72 tokens
    "bench_model_smollm2_estimate_cpu": Smoke(
        set={"--preset": ["micro"], "--lm-eval-tokens": ["72"], "--out": ["{tmp}/bm"]},
        add=("--trained-length", "48"), expect=("{tmp}/bm/results.json",), real=True),
    # passkey at 4L on a GPU: run here on the CPU, L stated as 64 (prompts of 256 tokens)
    "bench_model_smollm2_L8192_passkey_4L_s0": Smoke(
        set={"--preset": ["micro"], "--scalings": ["yarn"], "--methods": ["self_extend"], "--device": ["cpu"],
             "--out": ["{tmp}/bm"]}, add=("--trained-length", "64"), expect=("{tmp}/bm/results.json",), real=True),
    # 4L on a GPU: run here on the CPU, L stated as 48, one window of 192 tokens
    "bench_model_smollm2_L8192_code_4L": Smoke(
        set={"--preset": ["micro"], "--device": ["cpu"], "--lm-eval-tokens": ["192"], "--out": ["{tmp}/bm"]},
        add=("--trained-length", "48", "--methods", "self_extend"), expect=("{tmp}/bm/results.json",), real=True),
    # the same within L and at 1.5L, measured on a GPU: run here on the CPU, L stated as 128 (1.5L too short for
    # the RULER prompts, so 2L)
    **{f"bench_model_smollm2_L8192_tasks_1.5L_s{seed}": Smoke(
        set={"--preset": ["micro"], "--scalings": ["yarn"], "--methods": ["self_extend"], "--device": ["cpu"],
             "--passkey-eval-factors": ["1", "2"], "--out": ["{tmp}/bm"]},
        add=("--trained-length", "128"), expect=("{tmp}/bm/results.json",), real=True) for seed in (0, 1)},
    # llama.cpp against posenc: run where llama-cpp-python was built (`engine_llamacpp.py build`), never in CI
    "engine_llamacpp_cpu": Smoke(set={"--lengths": ["64"], "--scalings": ["none"], "--out": ["{tmp}/lc.json"]},
                                 expect=("{tmp}/lc.json",), how="script", real=True,
                                 needs="~/.cache/posenc/llama-cpp-python-0.3.36/site/llama_cpp"),
    "cope_cpu": Smoke(set={"--lengths": ["64"], "--rounds": ["1"], "--threads": ["1"], "--out": ["{tmp}/cope.json"]},
                      expect=("{tmp}/cope.json",), how="script"),
    "method_cost_cpu": Smoke(set={"--lengths": ["64"], "--methods": ["rerope"], "--out": ["{tmp}/mc.json"]},
                             expect=("{tmp}/mc.json",), how="script", real=True),
    "bench_model_smollm2_code_4L": Smoke(
        set={"--trained-length": ["32"], "--lm-eval-tokens": ["128"], "--out": ["{tmp}/bm"]},
        add=("--preset", "micro"), expect=("{tmp}/bm/results.json",), real=True),
}


def _results_commands() -> dict[str, str]:
    """command -> results name: each file's command as RESULTS states it and as the file records it."""
    out = {}
    for name, res in TABLES.RESULTS.items():
        out[res.command] = name
        data = json.loads((TABLES.RESULTS_DIR / res.file).read_text())
        recorded = data.get("command") or data.get("meta", {}).get("command")
        if recorded:
            out[recorded] = name
    return out


RESULTS_COMMANDS = _results_commands()
ALL_SMOKE = {**{c: RESULT_SMOKE[n] for c, n in RESULTS_COMMANDS.items() if n in RESULT_SMOKE}, **SMOKE}

QUOTED = quoted_commands(README.read_text())


def smoke_argv(command: str, smoke: Smoke, subs: dict[str, str]) -> tuple[list[str], bool]:
    """The argv (without the program) that runs ``command`` small, and whether stdout is redirected."""
    command, redirected = (command.split(" > ")[0], True) if " > " in command else (command, False)
    if smoke.argv is not None:
        argv = list(smoke.argv)
    else:
        argv = shlex.split(command)
        while "=" in argv[0]:  # PYTHONPATH=src python ...
            argv.pop(0)
        argv = argv[1:]  # drop "posenc" (or "python": argv[0] is then the script)
        for flag, values in smoke.set.items():
            if flag in argv:
                i = j = argv.index(flag)
                j += 1
                while j < len(argv) and not argv[j].startswith("--"):
                    j += 1
                argv[i:j] = [flag, *values]
            else:
                argv += [flag, *values]
        argv += smoke.add
    return [a.format(**subs) for a in argv], redirected


def test_readme_quotes_commands():
    assert len(QUOTED) >= 15, QUOTED
    assert "posenc list" in QUOTED and "make demo" in QUOTED


def test_every_quoted_command_has_a_smoke_entry():
    missing = [c for c in QUOTED if c not in ALL_SMOKE]
    assert not missing, f"README commands with no entry in SMOKE: {missing}"
    no_smoke = set(TABLES.RESULTS) - set(RESULT_SMOKE)
    assert not no_smoke, f"results files whose command has no entry in RESULT_SMOKE: {no_smoke}"
    stale = [c for c in SMOKE if c not in QUOTED]
    assert not stale, f"SMOKE entries the README no longer quotes: {stale}"


def test_quoted_commands_reads_blocks_and_wrapped_spans():
    text = "```bash\nmake x   # comment\n\n```\nrun `posenc a\n--b c` and `posenc.build()` or `--flag`\n"
    assert quoted_commands(text) == ["make x", "posenc a --b c"]


def test_smoke_argv_replaces_and_adds_flags():
    argv, redirected = smoke_argv(
        "posenc speed x --lengths 1 2 3 --repeat 7 --json > f.json",
        Smoke(set={"--lengths": ["16"], "--out": ["{tmp}/o"]}, add=("--q",)), {"tmp": "/t"})
    assert argv == ["speed", "x", "--lengths", "16", "--repeat", "7", "--json", "--out", "/t/o", "--q"]
    assert redirected


@pytest.fixture(scope="module")
def micro_bench(tmp_path_factory) -> Path:
    """One finished micro benchmark, for the commands that read one (``posenc report``)."""
    from posenc.cli import main

    out = tmp_path_factory.mktemp("bench") / "micro"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["bench", "--preset", "micro", "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.fixture
def keep_threads():
    """``--threads`` sets torch's thread count for the process: restore it for the next test."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _run_posenc(argv: list[str]) -> int:
    from posenc.cli import main

    return main(argv)


def _run_script(argv: list[str]) -> int:
    """``python SCRIPT ARGS`` in this process (the script's ``__main__`` block included)."""
    script, *args = argv
    saved = sys.argv
    sys.argv = [script, *args]
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    except SystemExit as e:
        return 0 if e.code is None else int(e.code)
    finally:
        sys.argv = saved
    return 0


def _make_recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"{re.escape(target)}:", line)), None)
    assert start is not None, f"Makefile has no target {target!r}"
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


@pytest.fixture(scope="module")
def tiny_hf_checkpoint(tmp_path_factory):
    """A 2-layer random-init Llama saved as a local checkpoint folder (config.json + safetensors)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    d = tmp_path_factory.mktemp("tiny_llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("command", list(dict.fromkeys([*(c for c in QUOTED if c in ALL_SMOKE), *RESULTS_COMMANDS])),
                         ids=lambda c: c[:60])
def test_quoted_command_runs(command, tmp_path, request, keep_threads):
    smoke = ALL_SMOKE[command]
    if smoke.how == "make":
        # A make target is not run here (it builds a venv); each posenc command of its recipe
        # must be quoted in the README, which makes it smoke-tested through its own entry.
        target = command.split()[1]
        recipe = _make_recipe(target)
        assert recipe, f"make {target} has an empty recipe"
        for line in recipe:
            if "bin/posenc " in line:
                cmd = "posenc " + line.split("bin/posenc ", 1)[1]
                cmd = re.split(r"\s*[;&|>]", cmd)[0].strip()  # the command, not the shell around it
                cmd = cmd.replace("$(THREADS)", "1").replace("$(OUT)", "out")
                assert cmd in QUOTED, f"make {target} runs {cmd!r}, which the README does not quote"
        return
    if smoke.how == "tables":
        for part in ("README.md", "docs", "benchmarks"):
            src, dst = ROOT / part, tmp_path / part
            shutil.copytree(src, dst) if src.is_dir() else shutil.copyfile(src, dst)
        mod = _load_tables(tmp_path)
        before = (tmp_path / "README.md").read_text()
        with contextlib.redirect_stdout(io.StringIO()):
            assert mod.main(shlex.split(command)[2:]) == 0
        assert (tmp_path / "README.md").read_text() == before  # the committed tables are current
        return
    if smoke.real:
        for module in ("transformers", "gguf", "accelerate"):
            pytest.importorskip(module)
    if smoke.needs and not Path(smoke.needs).expanduser().exists():
        pytest.skip(f"{smoke.needs} is not built here (a benchmark-only dependency)")
    subs = {"tmp": str(tmp_path)}
    if "{bench}" in json.dumps([smoke.argv, smoke.set]):
        subs["bench"] = str(request.getfixturevalue("micro_bench"))
    if "{hf}" in json.dumps([smoke.argv, smoke.set]):
        subs["hf"] = str(request.getfixturevalue("tiny_hf_checkpoint"))
    for first in smoke.before:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert _run_posenc(smoke_argv(first, ALL_SMOKE[first], subs)[0]) == 0, first
    argv, redirected = smoke_argv(command, smoke, subs)
    if smoke.how == "subprocess":
        exe = shutil.which(argv[0], path=str(Path(sys.executable).parent)) or shutil.which(argv[0])
        assert exe, f"{argv[0]} not found"
        proc = subprocess.run([exe, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout
    else:
        buf, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
            code = _run_script(argv) if smoke.how == "script" else _run_posenc(argv)
        assert code == 0, f"{shlex.join(argv)} exited {code}: {err.getvalue()[-3000:]}"
        out = buf.getvalue()
    if redirected or (argv[0] == "check" and "--json" in argv):
        doc = json.loads(out)  # what the README redirects into a results file is one JSON document
        assert doc, f"posenc {shlex.join(argv)} printed an empty JSON document"
    for path in smoke.expect:
        assert Path(path.format(**subs)).is_file(), f"posenc {shlex.join(argv)} did not write {path}"
