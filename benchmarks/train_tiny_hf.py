"""Train a tiny Llama (transformers ``LlamaForCausalLM``) on bytes and save it as a checkpoint.

The "real run" behind the README's probe figure (docs/hf.md "A real run"): no pretrained
checkpoint can be downloaded here, so a small Llama-architecture model is actually trained,
byte-level (vocab 256, token id = byte value: what ``posenc.hf``'s byte fallback tokenizer
reads), on the bench's corpus (the Python standard library's sources,
``posenc.bench.data.load_corpus``) at the trained length L = ``max_position_embeddings``,
then written with ``save_pretrained`` (config.json + model.safetensors) for
``posenc probe`` and ``posenc bench --model``.

Seeded: the initialisation and the batches come from ``--seed``; the same command on the same
torch build gives the same checkpoint (CPU; thread count may move the last bits).

    python benchmarks/train_tiny_hf.py --out out/tiny_llama                   # the README's model
    python benchmarks/train_tiny_hf.py --out out/tiny_llama --probe out/probe_tiny_llama
    python benchmarks/train_tiny_hf.py --out /tmp/t --steps 5 --layers 1 --width 32 --length 32

``--probe DIR`` then runs ``posenc probe CKPT --out DIR`` on the new checkpoint (in a fresh
process, as a reader would) and adds the training summary to ``DIR/probe.json`` under
``"training"``. ``CKPT/train.json`` always holds the settings, the loss curve, the final
training loss and the validation byte perplexity at L.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def build_model(args: argparse.Namespace):
    """A Llama with RoPE base ``--rope-theta`` and ``max_position_embeddings = --length``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=args.width, intermediate_size=args.width * 8 // 3 // 16 * 16 or 16,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
        max_position_embeddings=args.length, rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta},
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(config)


def batches(train: torch.Tensor, length: int, batch: int, seed: int):
    """Endless (batch, length + 1) windows at uniform random offsets of the training bytes."""
    g = torch.Generator().manual_seed(seed + 1)
    span = length + 1
    while True:
        starts = torch.randint(0, len(train) - span, (batch,), generator=g)
        yield torch.stack([train[s : s + span] for s in starts.tolist()]).long()  # (B, L + 1)


@torch.no_grad()
def byte_perplexity(model, val: torch.Tensor, length: int, max_windows: int) -> dict[str, float]:
    """Perplexity per byte on non-overlapping windows of ``length`` of the validation bytes
    (the first byte of each window is not predicted), as posenc.bench.evaluate.perplexity."""
    n = min(len(val) // length, max_windows)
    if n < 1:
        raise ValueError(f"the validation text has {len(val)} bytes; --length {length} needs at least one window")
    windows = val[: n * length].long().view(n, length)  # (N, L)
    total, count = 0.0, 0
    for i in range(0, n, 16):
        w = windows[i : i + 16]
        logits = model(input_ids=w[:, :-1]).logits.float()  # (b, L - 1, 256)
        total += float(F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum"))
        count += w[:, 1:].numel()
    return {"ppl": math.exp(total / count), "nll": total / count, "tokens": count, "windows": n}


def train(args: argparse.Namespace) -> dict:
    """Train, save to ``args.out``, return the summary written to train.json."""
    from tqdm.auto import tqdm

    from posenc.bench.data import load_corpus

    torch.set_num_threads(args.threads)
    corpus = load_corpus(None, max_bytes=args.train_bytes)
    model = build_model(args)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10 % (nanoGPT's schedule)
        if step < warmup:
            return args.lr * (step + 1) / warmup
        t = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))

    losses: list[float] = []
    data = batches(corpus.train, args.length, args.batch, args.seed)
    t0 = time.perf_counter()
    model.train()
    bar = tqdm(range(args.steps), desc="train", disable=args.no_progress)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x = next(data)  # (B, L + 1)
        logits = model(input_ids=x[:, :-1]).logits  # (B, L, 256)
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    train_s = time.perf_counter() - t0
    model.eval()
    val = byte_perplexity(model, corpus.val, args.length, args.eval_windows)
    out = Path(args.out)
    model.save_pretrained(out)  # config.json + model.safetensors
    last = losses[-min(len(losses), 20):]  # the last steps' mean: one batch's loss is noisy
    summary = {
        "model": "transformers LlamaForCausalLM, byte-level (vocab 256)",
        "parameters": params,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "probe", "no_progress", "probe_args")},
        "corpus": corpus.source, "train_bytes": len(corpus.train), "val_bytes": len(corpus.val),
        "final_train_loss": sum(last) / len(last), "final_train_loss_steps": len(last),
        "val_at_L": val, "train_seconds": train_s,
        "loss_curve": losses[:: max(1, len(losses) // 100)],
    }
    (out / "train.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"trained {params:,} parameters for {args.steps} steps in {train_s:.0f} s: final train loss "
          f"{summary['final_train_loss']:.3f} nats/byte, validation byte perplexity at L={args.length}: {val['ppl']:.3f}")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="checkpoint folder to write (keep it out of git: out/ is ignored)")
    p.add_argument("--probe", metavar="DIR", help="then run `posenc probe OUT --out DIR` on the checkpoint")
    p.add_argument("--probe-args", nargs=argparse.REMAINDER, default=[],
                   help="extra flags passed to posenc probe (must come last)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--length", type=int, default=256, help="trained length L = max_position_embeddings (default 256)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    p.add_argument("--width", type=int, default=128, help="hidden size (default 128)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--rope-theta", type=float, default=10000.0, help="RoPE base (default 10000)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default 3e-3)")
    p.add_argument("--train-bytes", type=int, default=20_000_000, help="training bytes read from the corpus")
    p.add_argument("--eval-windows", type=int, default=128, help="validation windows of L for the perplexity")
    p.add_argument("--seed", type=int, default=0, help="initialisation and batch seed (default 0)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "layers", "width", "heads", "train_bytes", "eval_windows", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.length < 2:
        p.error(f"--length must be >= 2, got {args.length}")
    if args.width % args.heads:
        p.error(f"--width must be a multiple of --heads, got {args.width} and {args.heads}")
    summary = train(args)
    if args.probe:
        cmd = [sys.executable, "-m", "posenc", "probe", args.out, "--out", args.probe, "--threads", str(args.threads),
               *(["--no-progress"] if args.no_progress else []), *args.probe_args]
        print("posenc " + " ".join(cmd[3:]), flush=True)
        subprocess.run(cmd, check=True)
        path = Path(args.probe) / "probe.json"
        probe = json.loads(path.read_text())
        probe["training"] = {k: v for k, v in summary.items() if k != "loss_curve"}
        path.write_text(json.dumps(probe, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
