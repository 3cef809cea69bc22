"""FLOATER: positions from a learned continuous dynamical system (Liu et al. 2020).

Liu, Yu, Dhillon & Hsieh, "Learning to Encode Position for Transformer with Continuous
Dynamical Model" (ICML 2020). The position code p(t) in R^C follows a neural ODE

    dp/dt = h(p(t), t; theta),    p(0) = p0,

and position i reads p(i * delta). Here h is a small MLP ``W2 tanh(W1 [p, t] + b1) + b2``;
p0 is a learned vector (``learn_p0=True``) or zero; the code is added to the embeddings,
``x + p(pos * delta)``. Like sinusoids it has no table to outgrow, like a learned table
it adapts to the data.

The ODE is solved with the classical fixed-step fourth-order Runge-Kutta method
(:func:`rk4`, written here, no torchdiffeq), ``steps_per_position`` steps between two
consecutive positions. One integration pass from t = 0 to the batch's largest position
yields every p(i * delta) needed, which are then gathered per token; gradients flow through
the solver (backprop through the steps, not the adjoint). The solver works in float32 or
wider, whatever the model dtype. With a KV cache (under ``no_grad``/``inference_mode``)
the computed codes live in the cache's ``state`` dict and each decoding step only
integrates past the last computed position: step k always starts at t = k * dt, so the
continued solution is exactly the one-pass solution. The codes are reused for as long as
the cache lives: like its keys and values, they belong to the parameters of the generation
that made them (start a new cache after changing the parameters).

Cost. The dynamics depend on t, so p(i * delta) needs every step from t = 0: the cost of a
forward grows with its largest position, whatever the batch's length. A step is a few small
matrix-vector products; as PyTorch ops each is a dispatch and an autograd node (0.2-0.5 ms per
RK4 step at d_model 128 on one CPU core: 0.3 s for position 1e3, 21 s for 1e5). On CPU, where
the fused kernel is built (``make install``), the solve and its backward are plain loops in C++
(:class:`_KernelSolve`, ``rotary/csrc/floater_cpu.cpp``): 16 ms forward and 20 ms backward for
1023 steps at d_model 512, hidden 32, 2 threads, against about 0.38 s of a training step in
PyTorch ops. Positions are
therefore limited to ``max_position`` (default 8192, a 2-4 s solve on a CPU core), a clear
``ValueError`` beyond;
raise it explicitly up to 2^20 RK4 steps (``max_position * steps_per_position``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import EncodingConfig, check_int, check_range
from ..encoding import Dims, PositionalEncoding
from ..literature import EMBEDDINGS_ONLY, LEARNED, UNTRAINED
from ..positions import SequenceInfo
from ..registry import register
from ..limits import Float32Params, check_width
from ..rotary import cpu_rope

__all__ = ["FloaterConfig", "FloaterEncoding", "rk4"]

MAX_RK4_STEPS = 2**20  # max_position * steps_per_position: ~9 min of solve on a CPU core
MAX_DELTA = 10.0


def rk4(
    f: Callable[[Tensor, float], Tensor],
    y0: Tensor,
    dt: float,
    num_steps: int,
    *,
    start_step: int = 0,
    record_every: int = 1,
) -> Tensor:
    """Classical Runge-Kutta 4 for dy/dt = f(y, t) with a fixed step ``dt``.

    Starts from ``y0`` at t = start_step * dt, takes ``num_steps`` steps and returns the
    states after every ``record_every``-th step, stacked: (num_steps // record_every, *y0.shape).
    Times are computed as k * dt from the integer step k (not accumulated), so a solve that
    is continued from a recorded state reproduces the one-pass solve exactly.
    """
    check_int("num_steps", num_steps, minimum=0)
    check_int("record_every", record_every, minimum=1)
    if num_steps % record_every:
        raise ValueError(f"num_steps ({num_steps}) must be a multiple of record_every ({record_every})")
    y, out = y0, []
    for k in range(start_step, start_step + num_steps):
        t = k * dt
        k1 = f(y, t)
        k2 = f(y + (0.5 * dt) * k1, t + 0.5 * dt)
        k3 = f(y + (0.5 * dt) * k2, t + 0.5 * dt)
        k4 = f(y + dt * k3, t + dt)
        y = y + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        if (k + 1 - start_step) % record_every == 0:
            out.append(y)
    if not out:
        return y0.new_zeros((0, *y0.shape))
    return torch.stack(out)


@dataclass(frozen=True, eq=False)
class _Rows:
    """The first ``count`` rows of ``buffer``, the codes a KV cache has computed. ``extend``
    returns a new _Rows (the buffer written past ``count`` only, or grown to twice the rows),
    so an earlier _Rows, kept by :meth:`posenc.kv_cache.KVCache.atomic` to undo a failed step,
    still reads what it read. Two are equal when their rows are (not their spare capacity)."""

    buffer: Tensor
    count: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Rows) and other.count == self.count and torch.equal(other.table, self.table)

    __hash__ = None  # type: ignore[assignment]  # compared by value, a mutable buffer underneath

    @property
    def table(self) -> Tensor:
        return self.buffer[: self.count]

    def extend(self, more: Tensor) -> "_Rows":
        n = self.count + more.shape[0]
        buffer = self.buffer
        if buffer.shape[0] < n:
            buffer = buffer.new_empty(max(n, 2 * self.count), buffer.shape[1])
            buffer[: self.count] = self.table
        buffer[self.count:n] = more
        return _Rows(buffer, n)


class _KernelSolve(torch.autograd.Function):
    """:func:`rk4` of :meth:`FloaterEncoding.dynamics` in the fused CPU kernel
    (``csrc/floater_cpu.cpp``): every step's state (steps, C); the backward is the discrete
    adjoint of the same steps, from each stage's input and tanh kept by the forward (4 (C + Hd)
    numbers a step), the weights' gradients one matrix product over every stage. Equal to
    autograd through :func:`rk4` within roundings (float64: 1e-15). A backward that must itself
    be differentiable (``create_graph``) replays the solve as PyTorch ops (:func:`rk4`) and takes
    its gradient, so second derivatives are rk4's."""

    @staticmethod
    def forward(ctx, ext, y0: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, dt: float, steps: int,
                start: int) -> Tensor:
        states, stages, acts = ext.floater_rk4(y0, w1, b1, w2, b2, dt, steps, start)
        ctx.save_for_backward(stages, acts, y0, w1, b1, w2, b2)
        ctx.ext, ctx.dt, ctx.steps, ctx.start = ext, dt, steps, start
        return states

    @staticmethod
    def backward(ctx, grad: Tensor):
        stages, acts, y0, w1, b1, w2, b2 = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the solve again, as differentiable ops
            inputs = (y0, w1, b1, w2, b2)
            with torch.enable_grad():
                states = rk4(_mlp(w1, b1, w2, b2), y0, ctx.dt, ctx.steps, start_step=ctx.start)
            return None, *cpu_rope.replayed_grads(states, inputs, grad), None, None, None
        grads = ctx.ext.floater_rk4_backward(grad, stages, acts, y0, w1, b1, w2, b2, ctx.dt, ctx.start)
        return None, *grads, None, None, None


def _mlp(w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Callable[[Tensor, float], Tensor]:
    """h(p, t) = W2 tanh(W1 [p, t] + b1) + b2 from weights already in the solve's dtype; W1 [p, t]
    split as W1p p + t w1t, so no step concatenates."""
    C = w2.shape[0]
    w1p, w1t = w1[:, :C], w1[:, C]  # (hidden, C), (hidden,)

    def h(p: Tensor, t: float) -> Tensor:
        return F.linear(torch.tanh(F.linear(p, w1p, b1 + t * w1t)), w2, b2)

    return h


@dataclass
class FloaterConfig(EncodingConfig):
    """Bounds. ``delta`` in (0, 10]: h is bounded (a tanh layer), so |p(t)| grows at most
    linearly in t = position * delta; delta = 1e30 overflowed the codes (NaN logits).
    ``steps_per_position`` in [1, 64]; ``hidden`` in [1, 2^16]; ``max_position`` in
    [1, 2^20 // steps_per_position]: positions must be < max_position (see "Cost" above)."""

    delta: float = 0.1  # ODE time between consecutive positions: position i sits at t = i * delta
    steps_per_position: int = 1  # RK4 steps between two positions (step = delta / steps_per_position)
    hidden: int = 32  # width of the MLP h
    learn_p0: bool = True  # p(0) learned (else fixed at zero)
    max_position: int = 8192  # positions must be < max_position: the solve runs from t = 0 to the largest

    def validate(self) -> None:
        check_range("delta", self.delta, 0.0, MAX_DELTA, low_inclusive=False)
        check_int("steps_per_position", self.steps_per_position, minimum=1, maximum=64)
        check_width("hidden", self.hidden)
        check_int("max_position", self.max_position, minimum=1, maximum=MAX_RK4_STEPS // self.steps_per_position)


@register(
    "floater",
    family="absolute",
    summary="position codes p(i*delta) from a learned neural ODE dp/dt = h(p, t), RK4-integrated",
    paper="Liu et al. 2020, Learning to Encode Position for Transformer with Continuous Dynamical Model (FLOATER)",
    claims={
        "absolute": (UNTRAINED, LEARNED),
        "relative": (UNTRAINED, LEARNED),
        "bounded": (UNTRAINED, LEARNED),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, "Liu et al. 2020: the ODE is defined at any position (posenc caps it at "
                                "max_position, 8192 by default, to bound the integration)"),
        "linear_attention": (True, EMBEDDINGS_ONLY),
    },
)
class FloaterEncoding(Float32Params, PositionalEncoding):
    """x + p(pos * delta), p solving dp/dt = MLP([p, t]) from p(0) = p0."""

    Config = FloaterConfig
    # The dynamics are integrated over thousands of steps (w1's time column multiplies t):
    # rounding them to bfloat16 would move every code. The solve is float32 anyway.
    float32_params = ("w1", "b1", "w2", "b2", "p0")

    def __init__(self, config: FloaterConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        C, Hh = dims.d_model, config.hidden
        # Plain parameters (not nn.Linear): the model's init must not rescale the dynamics.
        self.w1 = nn.Parameter(torch.randn(Hh, C + 1) / (C + 1) ** 0.5)
        self.b1 = nn.Parameter(torch.zeros(Hh))
        self.w2 = nn.Parameter(torch.randn(C, Hh) / Hh**0.5)
        self.b2 = nn.Parameter(torch.zeros(C))
        self.p0 = nn.Parameter(torch.zeros(C)) if config.learn_p0 else None

    def _dtype(self) -> torch.dtype:
        return torch.promote_types(self.w1.dtype, torch.float32)

    def dynamics(self, dtype: torch.dtype) -> Callable[[Tensor, float], Tensor]:
        """h(p, t) = W2 tanh(W1 [p, t] + b1) + b2 as a function (C,) -> (C,) in ``dtype``.

        The weights are cast once per solve, and W1 [p, t] is split as W1p p + t w1t so no
        step concatenates.
        """
        return _mlp(self.w1.to(dtype), self.b1.to(dtype), self.w2.to(dtype), self.b2.to(dtype))

    def codes(self, num_positions: int, start: Tensor | None = None, first: int = 0) -> Tensor:
        """p(i * delta) for i = first .. num_positions - 1 -> (num_positions - first, C).

        With ``first`` > 0 the solve continues from ``start`` = p((first - 1) * delta), the
        last code already computed. On CPU, where the fused kernel is built, the solve and its
        backward run there (:func:`_solve`); elsewhere :func:`rk4` with autograd.
        """
        c, dtype = self.config, self._dtype()
        s = c.steps_per_position
        if first == 0:
            p = self.w1.new_zeros(self.dims.d_model, dtype=dtype) if self.p0 is None else self.p0.to(dtype)
            return torch.cat([p[None], self._solve(p, (num_positions - 1) * s, 0)])  # (num_positions, C)
        return self._solve(start, (num_positions - first) * s, (first - 1) * s)

    def _solve(self, y0: Tensor, steps: int, start_step: int) -> Tensor:
        """``steps`` RK4 steps from ``y0`` at step ``start_step``: the state after every
        ``steps_per_position``-th, (steps // steps_per_position, C)."""
        c, dtype = self.config, y0.dtype
        dt, every = c.delta / c.steps_per_position, c.steps_per_position
        ext = cpu_rope.kernel_on(y0)
        if ext is None:
            return rk4(self.dynamics(dtype), y0, dt, steps, start_step=start_step, record_every=every)
        weights = (self.w1.to(dtype), self.b1.to(dtype), self.w2.to(dtype), self.b2.to(dtype))
        return _KernelSolve.apply(ext, y0, *weights, dt, steps, start_step)[every - 1::every]

    def embed(self, x: Tensor, seq: SequenceInfo, state: dict[str, Any] | None = None) -> Tensor:
        pos = seq.positions
        if pos.numel() == 0:
            return x
        if not torch.compiler.is_compiling():
            lo, hi = int(pos.min()), int(pos.max())
            if lo < 0 or hi >= self.config.max_position:
                raise ValueError(
                    f"positions must be in [0, {self.config.max_position - 1}] for floater (max_position="
                    f"{self.config.max_position}: the ODE is solved from t = 0 to the largest position, a cost "
                    f"linear in it; raise max_position up to {MAX_RK4_STEPS // self.config.steps_per_position}), "
                    f"got range [{lo}, {hi}]"
                )
        n = int(pos.max()) + 1
        # With a KV cache and no autograd, the codes of earlier decoding steps are kept in the
        # cache's own state dict and the solve continues from the last one.
        if state is None or torch.is_grad_enabled():
            table = self.codes(n)  # (n, C)
        else:
            table = self._cached_codes(n, state, x.device)
        return x + table[pos].to(x.dtype)  # (B, T, C)

    def _cached_codes(self, n: int, state: dict[str, Any], device: torch.device) -> Tensor:
        """The codes of positions [0, n) kept in a KV cache's ``state["codes"]`` (:class:`_Rows`,
        whose buffer doubles as decoding goes on: a step writes its own rows and copies none of
        the earlier ones; a copy of every code per step was a twentieth of a decoding step at
        4096 positions)."""
        rows = state.get("codes")
        if rows is not None and (rows.buffer.dtype != self._dtype() or rows.buffer.device != device):
            rows = None  # the module was moved or cast since: solve again
        if rows is None:
            rows = _Rows(self.codes(n), n)
        elif rows.count < n:
            rows = rows.extend(self.codes(n, start=rows.table[-1], first=rows.count))
        state["codes"] = rows  # a new object per step: KVCache.atomic puts the old one back
        return rows.table
