"""SmolLM2-135M on this CPU: greedy decoding steps with posenc's RoPE patched in against
transformers' own, and the peak memory of a perplexity evaluation.

    .venv/bin/python benchmarks/real_speed.py                       # -> benchmarks/results/real_speed_cpu.json
    .venv/bin/python benchmarks/real_speed.py --rounds 3 --new-tokens 16 --memory-lengths 1024 2048

Decoding: two copies of the model, one with posenc's RoPE patched in (``patch_model``); after
one untimed prefill of a prompt of real text, each greedy decoding step runs on both copies
back to back, on the same token, the order alternating (ABBA), for ``--new-tokens`` steps in
each of ``--rounds`` rounds at each thread count. The ratio is the median over the paired
steps of patched / unpatched, in wall time and in the process's CPU time (a 2-core machine
shared with other work drifts between seconds, not within a pair of steps). Also the one rotary
call a decoding step makes, timed alone. Memory: each length in a fresh process (the peak
resident set before and after one ``HFCausalLM.nll`` over that many tokens; the LM head runs in
chunks, so the growth is activations, not (T, V) logits), beside the estimate ``bench --model``
prints (``posenc.hf.cost.peak_bytes``).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

NAME = "smollm2-135m"


def _model():
    import transformers

    from posenc.hf.models import resolve_model

    folder = resolve_model(NAME)
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return folder, model, time.perf_counter() - t0


def _prompt(folder: Path, n: int) -> torch.Tensor:
    import transformers

    from posenc.bench.data import load_corpus

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    text = bytes(load_corpus(None, max_bytes=9 * 8 * n + 9).val.tolist()).decode("utf-8", errors="replace")
    return torch.tensor(tok.encode(text, add_special_tokens=False)[:n])[None]  # (1, n)


@torch.no_grad()
def _prefill(model, prompt: torch.Tensor):
    """One forward over the prompt; returns (cache, next token) for stepwise greedy decoding."""
    import transformers

    cache = transformers.DynamicCache(config=model.config)
    out = model(prompt, cache=cache, use_cache=True)
    return cache, out.logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)


@torch.no_grad()
def _step(model, cache, token: torch.Tensor, pos: int) -> tuple[torch.Tensor, float, float]:
    """One greedy decoding step at position ``pos``: (logits of the new token, wall s, CPU s)."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = model(token, cache=cache, use_cache=True, position_ids=torch.tensor([[pos]]))
    return out.logits[:, -1], time.perf_counter() - w0, time.process_time() - c0


def decoding(rounds: int, new: int, prompt_len: int, threads: list[int]) -> dict:
    """Greedy decoding steps of two copies of the model, one with posenc's RoPE patched in, timed
    in pairs: each step runs on both copies back to back (the order alternating, ABBA), on the
    same token (the unpatched copy's argmax), so a machine whose speed drifts between seconds
    favours neither; the prompt's prefill is done once per copy and not timed. The ratio is the
    median over the paired steps of patched / unpatched, in wall time and in the process's CPU
    time (the latter blind to time spent waiting for a core on a shared machine)."""
    import copy

    from posenc.hf import patch_model

    folder, plain_model, load_s = _model()
    patched_model = copy.deepcopy(plain_model)
    patch_model(patched_model)
    prompt = _prompt(folder, prompt_len)
    out = dict(load_seconds_from_cache=round(load_s, 2), prompt_tokens=prompt_len, new_tokens=new,
               rounds=rounds, threads={})
    same = True
    for t in threads:
        torch.set_num_threads(t)
        wall = {"unpatched": [], "patched": []}
        cpu = {"unpatched": [], "patched": []}
        for r in range(rounds):
            (cache_a, tok), (cache_b, tok_b) = _prefill(plain_model, prompt), _prefill(patched_model, prompt)
            same &= bool(torch.equal(tok, tok_b))
            for i in range(new):
                pos = prompt_len + i
                order = (("unpatched", plain_model, cache_a), ("patched", patched_model, cache_b))
                if (r * new + i) % 2:
                    order = order[::-1]
                logits = {}
                for name, model, cache in order:
                    logits[name], w, c = _step(model, cache, tok, pos)
                    if i > 0 or r > 0:  # the very first step warms both up
                        wall[name].append(w)
                        cpu[name].append(c)
                same &= bool(torch.equal(logits["unpatched"].argmax(-1), logits["patched"].argmax(-1)))
                tok = logits["unpatched"].argmax(-1, keepdim=True)
        row = {}
        for kind, times in (("wall", wall), ("cpu", cpu)):
            ratios = [b / a for a, b in zip(times["unpatched"], times["patched"])]
            q = statistics.quantiles(ratios, n=4)
            row[kind] = dict(unpatched_ms=round(1e3 * statistics.median(times["unpatched"]), 3),
                             patched_ms=round(1e3 * statistics.median(times["patched"]), 3),
                             median_ratio=round(statistics.median(ratios), 4),
                             ratio_quartiles=[round(q[0], 4), round(q[2], 4)], pairs=len(ratios))
        out["threads"][str(t)] = row
        print(f"threads {t}: step {row['wall']['unpatched_ms']:.1f} / {row['wall']['patched_ms']:.1f} ms wall, "
              f"ratio {row['wall']['median_ratio']:.3f}x (quartiles {row['wall']['ratio_quartiles']}); "
              f"CPU time ratio {row['cpu']['median_ratio']:.3f}x (quartiles {row['cpu']['ratio_quartiles']}), "
              f"{row['wall']['pairs']} pairs", flush=True)
    out["same_tokens_patched_and_unpatched"] = same
    return out


def rotary_step(threads: list[int], calls: int = 300) -> dict:
    """Microseconds of the one rotary call a decoding step makes (cos/sin for one new position),
    transformers' module against posenc's, median of 5 blocks of ``calls``: what patching can
    add to a step, beside the whole step's time."""
    from posenc.hf import patch_model, unpatch_model

    _, model, _ = _model()
    x = torch.zeros(1, 1, model.config.hidden_size)
    pos = torch.tensor([[150]])
    out = {}
    for t in threads:
        torch.set_num_threads(t)
        row = {}
        for name in ("unpatched", "patched"):
            if name == "patched":
                patch_model(model)
            try:
                module = model.model.rotary_emb
                module(x, pos)
                blocks = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        module(x, pos)
                    blocks.append((time.perf_counter() - t0) / calls * 1e6)
                row[f"{name}_us"] = round(statistics.median(blocks), 1)
            finally:
                unpatch_model(model)
        out[str(t)] = row
        print(f"threads {t}: rotary call per decoding step {row['unpatched_us']} us (transformers) | "
              f"{row['patched_us']} us (posenc)", flush=True)
    return out


def _status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (``VmHWM``: peak resident set; ``VmRSS``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _memory_child(n: int) -> None:
    """Run in a fresh process: print JSON with the peak RSS before and after one nll over n tokens."""
    from posenc.hf.cost import peak_bytes
    from posenc.hf.evaluation import HFCausalLM

    folder, model, _ = _model()
    ids = _prompt(folder, n)
    lm = HFCausalLM(model)
    lm.nll(ids[:, :16])  # pages in every weight (transformers 5.24 may map them lazily)
    gc.collect()
    # Loading can peak above the loaded model (transformers 5.24: by ~0.6 GiB for SmolLM2), which
    # would hide the forward's growth in a lifetime peak: Linux resets the peak (VmHWM) to the
    # current RSS on a write of 5 to clear_refs, so "before" is the loaded model's resident set.
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_bytes("VmHWM")
    t0 = time.perf_counter()
    lm.nll(ids)
    seconds = time.perf_counter() - t0
    after = _status_bytes("VmHWM")
    cfg = json.loads((folder / "config.json").read_text())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps(dict(tokens=n, peak_rss_before=before, peak_rss_after=after, growth=after - before,
                          seconds=round(seconds, 1), estimate_peak=peak_bytes(cfg, n, 1, weights, 4),
                          weights=weights)))


def memory(lengths: list[int]) -> list[dict]:
    rows = []
    for n in lengths:
        done = subprocess.run([sys.executable, __file__, "--memory-child", str(n)], capture_output=True, text=True,
                              check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{n} tokens: peak RSS {row['peak_rss_after'] / 2**30:.2f} GiB (+{row['growth'] / 2**30:.2f} GiB over "
              f"the loaded model), estimate {row['estimate_peak'] / 2**30:.2f} GiB, {row['seconds']} s", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--memory-lengths", type=int, nargs="*", default=[1024, 4096])
    p.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "real_speed_cpu.json"))
    args = p.parse_args()
    if args.new_tokens < 3 or args.rounds < 1:
        p.error("--new-tokens must be >= 3 and --rounds >= 1 (the first step warms up; quartiles need 2 pairs)")
    if args.memory_child is not None:
        _memory_child(args.memory_child)
        return
    from posenc.speed.timing import describe_machine

    t0 = time.perf_counter()
    result = dict(model=NAME, machine=describe_machine(), command=" ".join([Path(sys.executable).name, *sys.argv]),
                  decoding=decoding(args.rounds, args.new_tokens, args.prompt_tokens, args.threads),
                  rotary_step=rotary_step(args.threads),
                  memory=memory(args.memory_lengths))
    result["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} ({result['seconds']} s)")


if __name__ == "__main__":
    main()
