"""Train a tiny model for a few steps and save its weights (run alone or under torchrun).

Used by tests/test_bench_train.py: ``torchrun --nproc_per_node 2 bench_ddp_worker.py OUT``
must give the same weights as one process with the same global batch.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from posenc_entry import finish

from posenc import ModelConfig, Transformer
from posenc.bench.data import TaskBatches
from posenc.bench.tasks import get_task
from posenc.bench.tokens import VOCAB_SIZE
from posenc.bench.train import TrainConfig, init_distributed, save_weights, train


def run(out: str) -> None:
    torch.manual_seed(0)
    rank, _ = init_distributed(torch.device("cpu"))
    model = Transformer(ModelConfig(vocab_size=VOCAB_SIZE, d_model=16, n_layer=1, n_head=2, encoding="sinusoidal"))
    batches = TaskBatches(get_task("reverse"), batch_size=8, max_length=6, seed=0)
    train(model, batches, TrainConfig(steps=4, warmup_steps=1, lr=1e-3), progress=False)
    if rank == 0:
        save_weights(model, out)
    if dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another still talks to it
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(sys.argv[1])
    finish(0)  # as the posenc CLI ends under torchrun (posenc_entry.finish)
