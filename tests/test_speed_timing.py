"""posenc.speed.timing.peak_memory on CPU: the peak of torch's own allocations during a call,
scratch inside a custom autograd.Function included (the fused attention's blocks)."""

from __future__ import annotations

import torch

from posenc.speed.timing import peak_memory

MIB = 2**20


class _Scratch(torch.autograd.Function):
    """Allocates 16 MiB of scratch in its forward and frees it before returning."""

    @staticmethod
    def forward(ctx, x):
        y = torch.ones(16 * MIB // 4)
        return x * y[: x.numel()].view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


class _ScratchInTurn(torch.autograd.Function):
    """Allocates and frees 16 MiB three times in turn in its forward."""

    @staticmethod
    def forward(ctx, x):
        for _ in range(3):
            y = torch.ones(16 * MIB // 4)
            del y
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g


def test_counts_the_scratch_of_a_custom_function():
    x = torch.randn(1000, requires_grad=True)
    peak = peak_memory(lambda: _Scratch.apply(x).sum().backward())
    assert 16 * MIB <= peak < 17 * MIB


def test_counts_what_lives_at_once_inside_a_custom_function():
    x = torch.randn(1000, requires_grad=True)
    peak = peak_memory(lambda: _ScratchInTurn.apply(x).sum().backward())
    assert 16 * MIB <= peak < 17 * MIB


def test_counts_what_lives_at_once_not_the_sum():
    def two_in_turn():
        for _ in range(2):
            a = torch.ones(8 * MIB // 4)
            del a
        b = torch.ones(4 * MIB // 4)  # noqa: F841

    peak = peak_memory(two_in_turn)
    assert 8 * MIB <= peak < 9 * MIB


def test_counts_the_fused_attention_blocks():
    from posenc.backends.fused import fused_attention

    q = torch.randn(1, 2, 512, 16, requires_grad=True)
    peak = peak_memory(lambda: fused_attention(q, q, q, scale=0.25, causal=True, block=128).sum().backward())
    assert peak >= 2 * 128 * 512 * 4  # at least one block's (B, H, rows, keys) float32 scratch
