"""The training harness: AdamW, warmup + cosine decay, clipping, resumable and data parallel.

* **Seeded.** Weights are initialised from ``seed``; the batch of step ``s`` is a pure
  function of ``(seed, s)`` (:mod:`posenc.bench.data`), so the data loader's state is the
  step counter. A run is bitwise the same in a fresh process on the same torch build, CPU
  capability and thread count; other numerics (threads, ISA) round differently and the run
  drifts from there (docs/bench.md "Determinism: what holds").
* **Resumable, bitwise.** A checkpoint (safetensors, written to a temporary file and
  renamed, so a kill never leaves half a file) holds the weights, AdamW's moments and step
  counts, the step, the last loss, and the torch RNG states. Resuming from it reaches bitwise
  the same final weights as a run that was never interrupted. Checkpoints and weights carry
  a sha256 of their tensors and are verified on load (:mod:`posenc.files`): a corrupt,
  truncated, empty or non-finite file is refused, never trained from. Ctrl-C or SIGTERM stop the run at the
  next step boundary, save, and raise :class:`Interrupted`; a second Ctrl-C aborts at once.
* **Data parallel.** Under ``torchrun --nproc_per_node N`` each rank builds the same global
  batch, takes its rows and weights its summed token loss by ``N / global_targets``;
  DistributedDataParallel averages gradients over ranks, so the update equals one process
  with the whole batch (to float rounding): gloo on CPU, nccl on GPU.

Example::

    cfg = TrainConfig(steps=300, lr=3e-3)
    train(model, TaskBatches(get_task("copy"), 64, 16, seed=0), cfg, checkpoint="ckpt.safetensors")
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import check_int, check_nonnegative, check_positive, check_range
from ..files import load_tensors, save_tensors
from ..positions import SequenceInfo
from .data import IGNORE, Batch

__all__ = [
    "TrainConfig",
    "TrainResult",
    "Interrupted",
    "train",
    "lr_at",
    "save_checkpoint",
    "load_checkpoint",
    "save_weights",
    "verify_weights",
    "load_weights",
    "distributed_info",
    "init_distributed",
]

CHECKPOINT_FORMAT = "posenc-bench-checkpoint-1"


class Batches(Protocol):
    def __call__(self, step: int) -> Batch: ...


@dataclass
class TrainConfig:
    """Optimisation settings. ``batch_size`` lives in the batch source (it is the global batch)."""

    steps: int = 300
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0  # max global grad norm; 0 disables
    bf16: bool = False  # bfloat16 autocast for the forward pass
    seed: int = 0
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        check_int("steps", self.steps, minimum=1)
        check_positive("lr", self.lr)
        check_range("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_int("warmup_steps", self.warmup_steps, minimum=0)
        check_nonnegative("weight_decay", self.weight_decay)
        check_range("beta1", self.beta1, 0.0, 1.0, high_inclusive=False)
        check_range("beta2", self.beta2, 0.0, 1.0, high_inclusive=False)
        check_nonnegative("grad_clip", self.grad_clip)
        check_int("checkpoint_every", self.checkpoint_every, minimum=1)


@dataclass
class TrainResult:
    step: int  # optimizer steps taken in total (including before a resume)
    finished: bool  # reached cfg.steps
    last_loss: float  # mean target-token loss of the last step (over all ranks)
    seconds: float  # wall time of this call


class Interrupted(KeyboardInterrupt):
    """Raised after a Ctrl-C/SIGTERM stop once the checkpoint is saved."""


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup, then cosine decay."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --------------------------------------------------------------------------- distributed


def distributed_info() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed(device: torch.device) -> tuple[int, int]:
    """Join the process group that ``torchrun`` describes in the environment (if any)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return distributed_info()


# --------------------------------------------------------------------------- checkpoints


def _model_tensors(model: nn.Module) -> dict[str, Tensor]:
    # clone: tied weights share storage, which safetensors refuses to write twice
    return {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}


def save_weights(model: nn.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """The model's weights alone, atomically, as safetensors with a checksum."""
    save_tensors(path, _model_tensors(model), metadata or {})


def verify_weights(path: str | os.PathLike) -> dict[str, Tensor]:
    """The tensors of a :func:`save_weights` file, verified (ValueError naming the file if not).

    Only the checksum is required: NaN weights saved by a run that diverged are its true
    result (its record says so), not damage. Checkpoints, which training continues from, must
    also be finite (:func:`load_checkpoint`).
    """
    return load_tensors(path, what="weights", finite=False)[0]


def load_weights(model: nn.Module, path: str | os.PathLike) -> None:
    """Load verified weights into ``model``."""
    model.load_state_dict(verify_weights(path))


def save_checkpoint(
    path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig,
    loss: float = math.nan,
) -> None:
    """Weights, optimizer state, step, last loss and RNG states in one verified safetensors file."""
    tensors = {f"model/{k}": v for k, v in _model_tensors(model).items()}
    opt = optimizer.state_dict()
    for pid, state in opt["state"].items():
        for key, value in state.items():
            tensors[f"optim/{pid}/{key}"] = value.detach().cpu().clone().contiguous()
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng/cuda"] = torch.cuda.get_rng_state()
    meta = {
        "format": CHECKPOINT_FORMAT,
        "step": str(step),
        "loss": repr(float(loss)),  # so a run resumed after its last step still reports it
        "param_groups": json.dumps(opt["param_groups"]),
        "train_config": json.dumps(asdict(cfg)),
    }
    save_tensors(path, tensors, meta)


def load_checkpoint(
    path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig
) -> tuple[int, float]:
    """Restore what :func:`save_checkpoint` wrote; returns (step to continue from, its last loss).

    The file is verified first (checksum, finite values); a bad one raises ValueError naming it.
    """
    tensors, meta = load_tensors(path, what="checkpoint")
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a posenc bench checkpoint (format {meta.get('format')!r})")
    saved_cfg = json.loads(meta["train_config"])
    if saved_cfg != asdict(cfg):
        diff = {k: (saved_cfg.get(k), v) for k, v in asdict(cfg).items() if saved_cfg.get(k) != v}
        raise ValueError(f"checkpoint {path} was made with other training settings (saved, now): {diff}")
    device = next(model.parameters()).device
    model.load_state_dict({k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")})
    state: dict[int, dict[str, Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("optim/"):
            _, pid, key = k.split("/", 2)
            # AdamW keeps its step counts on the CPU unless capturable/fused; moments on the device
            state.setdefault(int(pid), {})[key] = v if key == "step" else v.to(device)
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
    torch.set_rng_state(tensors["rng/torch"])
    if "rng/cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng/cuda"])
    return int(meta["step"]), float(meta.get("loss", "nan"))


# --------------------------------------------------------------------------- training


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norms, biases or scalars), as in nanoGPT."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # foreach=False: one code path on every device, so CPU results do not depend on a heuristic
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), foreach=False)


@contextmanager
def _stop_on_signal() -> Iterator[list[bool]]:
    """Turn the first SIGINT/SIGTERM into a flag checked at step boundaries."""
    flag = [False]
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):  # noqa: ARG001
        if flag[0] and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: abort now
        flag[0] = True

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def train(
    model: nn.Module,
    batches: Batches,
    cfg: TrainConfig,
    *,
    checkpoint: str | os.PathLike | None = None,
    callback: Callable[[int, float], None] | None = None,
    stop_after: int | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainResult:
    """Train ``model`` for ``cfg.steps`` optimizer steps on ``batches(step)``.

    Args:
        checkpoint: path of the checkpoint file; when it exists the run resumes from it.
            Saved every ``cfg.checkpoint_every`` steps, at the end, and on a stop.
        callback: ``callback(step, loss)`` after each step (``step`` counts steps done).
        stop_after: stop (and save) once this many steps are done, as an interruption
            would; a later call resumes.
        progress: show a tqdm bar with the loss and tokens/s (rank 0 only).

    The caller seeds and builds the model; under torchrun the process group must be
    initialised (:func:`init_distributed`) and the model already on its device.
    """
    from ..progress import bar as progress_bar

    rank, world = distributed_info()
    device = next(model.parameters()).device
    optimizer = make_optimizer(model, cfg)
    ckpt = None if checkpoint is None else Path(checkpoint)
    step = 0
    loss_value = float("nan")
    if ckpt is not None and ckpt.exists():
        step, loss_value = load_checkpoint(ckpt, model, optimizer, cfg)
    ddp = world > 1
    net: nn.Module = model
    if ddp:
        ids = [device.index] if device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if cfg.bf16 else nullcontext()
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)

    def save() -> None:
        if ckpt is not None and rank == 0:
            save_checkpoint(ckpt, model, optimizer, step, cfg, loss_value)
        if ddp:
            dist.barrier()

    model.train()
    t0 = time.perf_counter()
    tokens = 0  # global input tokens seen in this call, for tokens/s
    bar = progress_bar(cfg.steps, desc, unit="step", initial=step, enabled=progress and rank == 0)
    with _stop_on_signal() as stop:
        while step < end:
            batch = batches(step)
            n_targets = batch.num_targets  # over the global batch
            local = batch.shard(rank, world).to(device)
            for g in optimizer.param_groups:
                g["lr"] = lr_at(step, cfg)
            with autocast:  # (B/N, T, V); positions 0..T-1 unless the batch carries its own
                if local.positions is None:
                    logits = net(local.inputs)
                else:
                    logits = net(local.inputs, SequenceInfo.from_checked(local.positions))
            nll = F.cross_entropy(
                logits.float().flatten(0, 1), local.labels.flatten(), ignore_index=IGNORE, reduction="sum"
            )
            # DDP averages gradients over ranks, so scale by N to get the global token mean
            loss = nll * (world / max(n_targets, 1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            step += 1

            report = nll.detach() / max(n_targets, 1)
            if ddp:  # the global mean: each rank holds its nll / global targets
                dist.all_reduce(report)
            loss_value = float(report)
            bar.update(1)
            tokens += batch.inputs.numel()
            bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tokens / max(time.perf_counter() - t0, 1e-9):,.0f}")
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                save()
            if callback is not None:
                callback(step, loss_value)
            halt = torch.tensor([float(stop[0])], device=device)
            if ddp:  # ranks stop together, or the others would wait forever
                dist.all_reduce(halt)
            if float(halt) > 0 and step < cfg.steps:
                if step % cfg.checkpoint_every:
                    save()
                bar.close()
                where = f"; checkpoint: {ckpt}" if ckpt is not None else ""
                raise Interrupted(f"stopped after step {step}/{cfg.steps}{where}; rerun with --resume to continue")
        if step == end and end < cfg.steps and step % cfg.checkpoint_every:
            save()
    bar.close()
    model.eval()
    return TrainResult(step, step >= cfg.steps, loss_value, time.perf_counter() - t0)
