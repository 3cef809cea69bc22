"""SmolLM2-135M on this CPU: greedy decoding with posenc's RoPE patched in against transformers'
own, and the peak memory of a perplexity evaluation.

    .venv/bin/python benchmarks/real_speed.py                       # -> benchmarks/results/real_speed_cpu.json
    .venv/bin/python benchmarks/real_speed.py --rounds 3 --new-tokens 16 --memory-lengths 1024 2048

Decoding: one model, ``generate`` (greedy, a fixed number of new tokens after a prompt of real
text), timed in alternation unpatched / patched (``patch_model`` / ``unpatch_model``, no
reload) for ``--rounds`` rounds at each thread count, the order alternating (ABBA), and the
one rotary call a decoding step makes, timed alone; tokens/s per round, the ratio is the
median of the per-round ratios (a 2-core machine shared with other work drifts between rounds,
not within a pair). Memory: each length in a fresh process (the peak resident set before and
after one ``HFCausalLM.nll`` over that many tokens; the LM head runs in chunks, so the growth is
activations, not (T, V) logits), beside ``bench_model``'s own estimate.
"""

from __future__ import annotations

import argparse
import json
import resource
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
def _decode_rate(model, prompt: torch.Tensor, new: int) -> float:
    t0 = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    dt = time.perf_counter() - t0
    assert out.shape[1] == prompt.shape[1] + new
    return new / dt


def decoding(rounds: int, new: int, prompt_len: int, threads: list[int]) -> dict:
    from posenc.hf import patch_model, unpatch_model

    folder, model, load_s = _model()
    prompt = _prompt(folder, prompt_len)
    out = dict(load_seconds_from_cache=round(load_s, 2), prompt_tokens=prompt_len, new_tokens=new, threads={})
    for t in threads:
        torch.set_num_threads(t)
        _decode_rate(model, prompt, 4)  # warm-up
        plain, patched = [], []
        for r in range(rounds):
            # ABBA: the order alternates, so a machine slowing down within a round favours neither
            for first in ((False, True) if r % 2 == 0 else (True, False)):
                if first:
                    patch_model(model)
                    try:
                        patched.append(_decode_rate(model, prompt, new))
                    finally:
                        unpatch_model(model)
                else:
                    plain.append(_decode_rate(model, prompt, new))
        with torch.no_grad():
            ref = model.generate(prompt, max_new_tokens=new, do_sample=False)
            patch_model(model)
            try:
                same = bool(torch.equal(ref, model.generate(prompt, max_new_tokens=new, do_sample=False)))
            finally:
                unpatch_model(model)
        ratios = [p / q for p, q in zip(plain, patched)]  # time ratio patched / plain = rate plain / patched
        out["threads"][str(t)] = dict(unpatched_tokens_per_s=[round(x, 2) for x in plain],
                                      patched_tokens_per_s=[round(x, 2) for x in patched],
                                      median_ratio_patched_over_unpatched_time=round(statistics.median(ratios), 4))
        print(f"threads {t}: unpatched {statistics.median(plain):.2f} tok/s, patched {statistics.median(patched):.2f} "
              f"tok/s, time ratio {statistics.median(ratios):.3f}x (per round: "
              f"{', '.join(f'{r:.3f}' for r in ratios)})", flush=True)
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


def _memory_child(n: int) -> None:
    """Run in a fresh process: print JSON with the peak RSS before and after one nll over n tokens."""
    from posenc.hf.bench_model import HFCausalLM, _peak_bytes

    folder, model, _ = _model()
    ids = _prompt(folder, n)
    lm = HFCausalLM(model)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    lm.nll(ids)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cfg = json.loads((folder / "config.json").read_text())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps(dict(tokens=n, peak_rss_before=before, peak_rss_after=after, growth=after - before,
                          seconds=round(seconds, 1), estimate_peak=_peak_bytes(cfg, n, 1, weights, 4),
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
