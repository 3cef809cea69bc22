"""llama.cpp against transformers + posenc on the real SmolLM2-135M past its own 8192 tokens: the
same token ids through both, next-token log-probabilities compared per token, for each RoPE
scaling llama.cpp can express.

    .venv/bin/python benchmarks/engine_llamacpp.py build      # once: llama-cpp-python 0.3.36 from source (~5 min)
    .venv/bin/python benchmarks/engine_llamacpp.py run --out benchmarks/results/engine_llamacpp_cpu.json

``build`` compiles llama-cpp-python 0.3.36 from its source package into a cache folder
(``~/.cache/posenc/llama-cpp-python-0.3.36``, a benchmark-only dependency, never CI) and keeps the
source package beside it: its vendored llama.cpp holds ``convert_hf_to_gguf.py``, which ``run``
uses to write SmolLM2's cached float32 folder as a float32 GGUF (so quantization does not blur
the comparison: the issue measured Q4_1 at 0.7 % off in perplexity).

``run``: for each length (default 12288 = 1.5L and 16384 = 2L) one window of the code corpus
(the tokens ``bench --model --corpus code`` reads), and for each scaling (default none, linear,
ntk, yarn at factor length / 8192):

* llama.cpp: the float32 GGUF, the scaling passed the way a user would (``--export llama.cpp``'s
  flags: ``rope_scaling_type``, ``rope_freq_scale``, ``rope_freq_base``, ``yarn_orig_ctx``), the
  KV cache in float32, every position's logits; the negative log-likelihood of each next token;
* transformers + posenc: the float32 checkpoint with the same scaling patched in
  (``posenc.hf.scalings.variant_patched``, what ``bench --model`` measured), ``token_losses``.

Per row: the largest and mean absolute difference of the per-token NLL, and each side's
perplexity over the tokens past L. A row "matches" when the mean difference is within
``MATCH_MEAN`` nats; the unscaled llama.cpp model against posenc's scaled one is the control
that must differ clearly. Each row is written to ``--out`` as it is made (``--resume``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

VERSION = "0.3.36"
CACHE = Path(os.environ.get("POSENC_LLAMACPP_CACHE", Path.home() / ".cache" / "posenc" / f"llama-cpp-python-{VERSION}"))
NAME = "smollm2-135m"
L = 8192
#: the mean |NLL difference| (nats per token) under which llama.cpp "computes what was measured";
#: float32 both sides, different kernels and summation orders
MATCH_MEAN = 1e-3


def build() -> None:
    """llama-cpp-python from its source package into CACHE/site (once), the source kept in CACHE/src."""
    site, src = CACHE / "site", CACHE / "src"
    if (site / "llama_cpp").is_dir():
        print(f"llama-cpp-python {VERSION}: already built in {site}")
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={VERSION}", "--no-deps",
                    "--no-binary", ":all:", "-d", str(src)], check=True)
    t0 = time.perf_counter()
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site),
                    str(next(src.glob("llama_cpp_python-*.tar.gz")))], check=True, env=env)
    # what the project's environment lacks: llama-cpp-python's diskcache, the converter's sentencepiece
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), "diskcache",
                    "sentencepiece"], check=True)
    print(f"llama-cpp-python {VERSION}: built in {time.perf_counter() - t0:.0f} s into {site}")


def _vendored() -> Path:
    """The source package's llama.cpp tree (unpacked once beside it)."""
    tree = CACHE / "src" / f"llama_cpp_python-{VERSION}"
    if not tree.is_dir():
        import tarfile

        with tarfile.open(next((CACHE / "src").glob("llama_cpp_python-*.tar.gz"))) as tar:
            tar.extractall(CACHE / "src", filter="data")
    return tree / "vendor" / "llama.cpp"


def convert(folder: Path) -> Path:
    """SmolLM2's float32 folder as a float32 GGUF, by llama.cpp's own converter (once)."""
    out = CACHE / "smollm2-135m-f32.gguf"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CACHE / "site"), os.environ.get("PYTHONPATH", "")]))
        subprocess.run([sys.executable, str(_vendored() / "convert_hf_to_gguf.py"), str(folder), "--outtype", "f32",
                        "--outfile", str(tmp)], check=True, env=env)
        tmp.rename(out)
    return out


def llama_flags(scaling: str, factor: float, base: float, head_dim: int) -> dict:
    """llama-cpp-python's ``Llama`` arguments for posenc's ``scaling`` at ``factor`` (the same
    settings ``--export llama.cpp`` writes as command-line flags)."""
    from llama_cpp import (LLAMA_ROPE_SCALING_TYPE_LINEAR, LLAMA_ROPE_SCALING_TYPE_NONE,
                           LLAMA_ROPE_SCALING_TYPE_YARN)

    if scaling == "none":
        return dict(rope_scaling_type=LLAMA_ROPE_SCALING_TYPE_NONE)
    if scaling == "linear":
        return dict(rope_scaling_type=LLAMA_ROPE_SCALING_TYPE_LINEAR, rope_freq_scale=1 / factor)
    if scaling == "ntk":  # NTK-aware is a larger base: base * s^(d / (d - 2))
        return dict(rope_scaling_type=LLAMA_ROPE_SCALING_TYPE_NONE,
                    rope_freq_base=base * factor ** (head_dim / (head_dim - 2)))
    if scaling == "yarn":
        return dict(rope_scaling_type=LLAMA_ROPE_SCALING_TYPE_YARN, rope_freq_scale=1 / factor, yarn_orig_ctx=L,
                    yarn_ext_factor=1.0, yarn_attn_factor=1.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0)
    raise ValueError(f"scaling {scaling!r}: llama.cpp has no flag for it here")


def llama_nll(gguf: Path, ids: list[int], flags: dict, threads: int) -> "list[float]":
    """llama.cpp's NLL of each next token of ``ids`` (len(ids) - 1 values)."""
    import numpy as np
    from llama_cpp import GGML_TYPE_F32, Llama

    llm = Llama(model_path=str(gguf), n_ctx=len(ids), n_batch=512, n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, logits_all=True, verbose=False, type_k=GGML_TYPE_F32,
                type_v=GGML_TYPE_F32, **flags)
    llm.eval(ids)
    out = []
    for start in range(0, len(ids) - 1, 1024):  # log-softmax in float64, a block of rows at a time
        rows = np.asarray(llm.scores[start:min(start + 1024, len(ids) - 1)], dtype=np.float64)
        top = rows.max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
        target = np.asarray(ids[start + 1:start + 1 + len(rows)])
        out.extend((lse - rows[np.arange(len(rows)), target]).tolist())
    del llm
    return out


def posenc_nll(ids: list[int], scaling: str, factor: float, threads: int) -> "list[float]":
    """transformers + posenc's NLL of each next token, the scaling patched in as bench --model does."""
    import torch

    from posenc.hf.checkpoint import load_model, open_checkpoint
    from posenc.hf.evaluation import HFCausalLM
    from posenc.hf.models import resolve_model
    from posenc.hf.scalings import variant_patched

    torch.set_num_threads(threads)
    model = load_model(open_checkpoint(resolve_model(NAME)), torch.float32, progress=False).eval()
    with torch.inference_mode(), variant_patched(model, "base" if scaling == "none" else scaling, factor, L):
        return HFCausalLM(model).token_losses(torch.tensor([ids]))[0].double().tolist()


def _stats(a: list[float], b: list[float]) -> dict:
    diffs = [abs(x - y) for x, y in zip(a, b)]
    past = slice(L if len(a) > L else 0, None)  # targets at positions >= L (all, for a window within L)
    return dict(max_abs=max(diffs), mean_abs=sum(diffs) / len(diffs),
                ppl_past_llamacpp=math.exp(sum(a[past]) / len(a[past])),
                ppl_past_posenc=math.exp(sum(b[past]) / len(b[past])))


def run(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(CACHE / "site"))
    import llama_cpp
    import torch

    from posenc.hf.checkpoint import load_tokenizer, open_checkpoint
    from posenc.hf.evaluation import token_stream
    from posenc.hf.models import resolve_model

    folder = resolve_model(NAME)
    ckpt = open_checkpoint(folder)
    gguf = convert(Path(folder))
    config = json.loads((Path(folder) / "config.json").read_text())
    from posenc.rotary import from_hf

    rope = from_hf(config)  # the checkpoint's own base and rotated width, however config.json spells them
    base, head_dim = rope.config.base, rope.rotary_dim
    out = Path(args.out)
    done = json.loads(out.read_text()) if args.resume and out.exists() else None
    rows = done["rows"] if done else []
    seen = {(r["length"], r["scaling"]) for r in rows}
    stream = token_stream(load_tokenizer(ckpt), None, max(args.lengths) + 1)
    for length in args.lengths:
        ids = stream[:length].tolist()
        factor = length / L
        posenc_cache: dict[str, list[float]] = {}
        for scaling in args.scalings:
            if (length, scaling) in seen:
                continue
            t0 = time.perf_counter()
            mine = llama_nll(gguf, ids, llama_flags(scaling, factor, base, head_dim), args.threads)
            t1 = time.perf_counter()
            ref = posenc_cache.setdefault(scaling, posenc_nll(ids, scaling, factor, args.threads))
            t2 = time.perf_counter()
            row = dict(length=length, scaling=scaling, factor=factor, llamacpp_seconds=round(t1 - t0, 1),
                       posenc_seconds=round(t2 - t1, 1), **_stats(mine, ref))
            if scaling != "none":  # the control: the unscaled llama.cpp model against this scaling
                control = posenc_cache.get("none_llamacpp")
                if control is not None:
                    row["unscaled_llamacpp_mean_abs"] = _stats(control, ref)["mean_abs"]
            else:
                posenc_cache["none_llamacpp"] = mine
            row["matches"] = row["mean_abs"] < MATCH_MEAN
            rows.append(row)
            print(f"{length} {scaling}: mean |dNLL| {row['mean_abs']:.2e}, max {row['max_abs']:.2e}; ppl past L "
                  f"llama.cpp {row['ppl_past_llamacpp']:.4f} / posenc {row['ppl_past_posenc']:.4f}", flush=True)
            result = dict(machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                          llama_cpp_python=llama_cpp.__version__, torch=torch.__version__, model=NAME,
                          trained_length=L, match_mean=MATCH_MEAN, gguf="float32, converted by the vendored "
                          "convert_hf_to_gguf.py", kv_cache="float32", rows=rows)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result, indent=2) + "\n")
            tmp.replace(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build llama-cpp-python from source into the cache (once)")
    r = sub.add_parser("run", help="compare llama.cpp and posenc on SmolLM2 past 8192 tokens")
    r.add_argument("--out", required=True)
    r.add_argument("--lengths", type=int, nargs="+", default=[12288, 16384])
    r.add_argument("--scalings", nargs="+", default=["none", "linear", "ntk", "yarn"],
                   choices=["none", "linear", "ntk", "yarn"])
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--resume", action="store_true")
    args = p.parse_args()
    build() if args.cmd == "build" else run(args)


if __name__ == "__main__":
    main()
