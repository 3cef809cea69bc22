"""FoPE, Fourier position embedding (Hua et al. 2025, "Fourier Position Embedding: Enhancing
Attention's Periodic Extension for Length Generalization", ICML 2025, arXiv:2412.17739).

Sources, whose computation this module reproduces: vLLM 0.33.0's ``FourierRotaryEmbedding``
(``vllm/model_executor/layers/rotary_embedding/fope.py``, served for Intern-S1-Pro) and the
paper's code (``FourierEmbedding`` in ``olmo/model.py`` of github.com/yiju-zhao/
Fourier-Position-Embedding, commit 0a73bbefac148a7d92bb8692f90851db97febf08, a copy of the
authors' repository).

RoPE gives each rotated pair one frequency. The paper argues that the linear layers and
activations outside attention leak every frequency into every dimension (spectral damage), and
that the frequencies too low to complete a period within the trained length L are
under-trained. FoPE (i) drops those frequencies and (ii) makes each dimension a Fourier series
over all the kept ones, with learned coefficients. Notation: D the head dim, theta_i =
base^(-2i/D) for i < D/2; the kept frequencies are the first F of them, those with
theta_i > 2 pi / L (a period shorter than L), or the first ``num_inv_freq`` when that is given.
Two learned (c, F, F) tensors A (``cos_coef``) and B (``sin_coef``), one set per group of heads
(c = ``coef_heads``), give for dimension d < F at position m

    C_d(m) = sum_i A[g, i, d] cos(m theta_i),    S_d(m) = sum_i B[g, i, d] sin(m theta_i),

and the learned coefficients multiply cos and sin separately: A mixes the cosines, B the sines,
and the same C and S serve q and k (no separate coefficients for q and k). For d >= F (the
dropped frequencies) both C_d and S_d are 1, as both sources pad them (``F.pad(..., value=1)``):
such a pair is not left as it is but sent to (x1 - x2, x2 + x1), the same fixed map at every
position, so its logit is twice q . k over the pair and position-independent ("clipped to 0":
no rotation with position). Then, in RoPE's half layout (x1 the first D/2 channels, x2 the rest):

    q'_d = q_d C_d(m) - q_{d+D/2} S_d(m),    q'_{d+D/2} = q_{d+D/2} C_d(m) + q_d S_d(m),

and the same for k at its position n. With A = B = the identity this is RoPE on the kept pairs.
Otherwise the map is no rotation (norms change) and q'.k' is not a function of m - n alone:
cos(m a) cos(n b) with a != b mixes in m + n. Heads: query head h uses the coefficient set
h // (H / c) and key head g the set g // (H_kv / c), so a query and the key head it attends
(grouped-query attention) share one set; vLLM has one set per KV head (c = H_kv), shared by
every layer as here (one module per model).

Differences from the sources, none in what is computed: angles are float64 (vLLM: float32),
positions have no table limit (vLLM indexes a cache of ``max_position_embeddings`` rows); the
paper's code also allows F output dimensions fewer than F inputs and coefficients normalised
by their column sums, which vLLM does not (posenc follows vLLM). Initialisation as the paper's
``eye_xavier_norm``: the identity plus Xavier-normal noise of gain ``init_gain``.

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), positions (B, T); tables (B|1, c, T, D).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import EncodingConfig, check_int, check_positive, check_range
from ..encoding import Dims, PositionalEncoding
from ..limits import Float32Params, check_positions
from ..literature import LEARNED, ROPE_FEATURES, UNTRAINED
from ..registry import register
from . import cpu_rope

__all__ = ["FopeConfig", "FourierPositionEmbedding", "FopeState", "fope_kept_frequencies"]

_HUA = "Hua et al. 2025"


@dataclass
class FopeConfig(EncodingConfig):
    """Config of :class:`FourierPositionEmbedding`.

    Attributes:
        base: theta_i = base^(-2i/D); > 1.
        max_position_embeddings: L, the trained length (vLLM's ``max_position_embeddings``):
            frequencies with theta_i <= 2 pi / L (a period of L or more) are dropped; >= 1.
        num_inv_freq: keep the first this many frequencies instead of the cut at L (vLLM's
            ``num_inv_freq``); None: the cut at L. In [1, D/2] (checked at build).
        coef_heads: c, the number of coefficient sets, each shared by a group of heads: 1 (one
            set for all), or the number of KV heads (vLLM, ``fope_sep_head``); must divide the
            query heads (at build) and the key heads (at rotate).
        init_gain: the gain of the Xavier-normal noise added to the identity at init (the
            paper's ``fourier_init_norm_gain``, 0.3 to 0.6 by model size); 0: RoPE's identity.
    """

    base: float = 10000.0
    max_position_embeddings: int = 2048
    num_inv_freq: int | None = None
    coef_heads: int = 1
    init_gain: float = 0.3

    def validate(self) -> None:
        check_positive("base", self.base)
        if self.base <= 1.0:
            raise ValueError(f"base must be > 1 (theta_i = base^(-2i/D) must decrease), got {self.base}")
        check_int("max_position_embeddings", self.max_position_embeddings, minimum=1)
        if self.num_inv_freq is not None:
            check_int("num_inv_freq", self.num_inv_freq, minimum=1)
        check_int("coef_heads", self.coef_heads, minimum=1)
        check_range("init_gain", self.init_gain, 0.0, None)


def fope_kept_frequencies(head_dim: int, base: float, max_position_embeddings: int,
                          num_inv_freq: int | None = None) -> Tensor:
    """The kept theta_i, (F,) float64: the first ``num_inv_freq``, else those with a period
    shorter than L (theta_i > 2 pi / L; a prefix, as theta_i decreases)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    if num_inv_freq is not None:
        return inv_freq[:num_inv_freq]
    return inv_freq[inv_freq > 2 * math.pi / max_position_embeddings]


def _fused(q: Tensor, k: Tensor, cos_q: Tensor, cos_k: Tensor):
    """The fused CPU rotary kernel's rolled form (:mod:`posenc.rotary.cpu_rope`,
    ``rotate_half_qk``: x·C, then a fused multiply-add of roll(x, D/2)·[-S₁ | S₂], the
    arithmetic of :meth:`FourierPositionEmbedding._map`) when it is built and applies: one
    coefficient set (tables (B|1, 1, T, D), as :meth:`FourierPositionEmbedding.tables` makes
    them: contiguous, S beside C in dtype and device), float32 CPU q and k with a contiguous
    last dim, no autograd (a decoding step, a no-grad forward), outside torch.compile. None
    otherwise. Few checks, each cheap: a decoding step calls it once per layer (the kernel
    checks shapes itself)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or cos_q.requires_grad or cos_k.requires_grad):
        return None
    f32 = torch.float32
    if (cos_q.shape[1] != 1 or q.dtype is not f32 or k.dtype is not f32 or cos_q.dtype is not f32
            or cos_k.dtype is not f32 or q.stride(-1) != 1 or k.stride(-1) != 1):
        return None
    return cpu_rope.kernel_on(q)


@dataclass(frozen=True)
class FopeState:
    """C and S at the query positions, (B|1, c, Tq, D) each, float32 or wider, S in its rolled
    form (:meth:`FourierPositionEmbedding.rolled`): what q and the keys new in this forward
    (self-attention) are multiplied by."""

    cos: Tensor
    sin: Tensor


@register(
    "fope",
    family="rotary",
    summary="FoPE: each dimension a learned Fourier series over the frequencies with a period < L; "
            "the others fixed (not rotated)",
    paper="Hua et al. 2025, Fourier Position Embedding: Enhancing Attention's Periodic Extension for "
          "Length Generalization",
    claims={
        "absolute": (True, _HUA + ": cos/sin of m theta_i, mixed per dimension"),
        "relative": (False, "coefficients mixing frequencies: cos(m a) cos(n b), a != b, is not a function of m - n"),
        "bounded": (True, "C and S are fixed sums of cos and sin: at most the coefficients' column sums"),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, _HUA + ": defined at every position, aimed at length generalization"),
        "linear_attention": (True, ROPE_FEATURES),
    },
)
class FourierPositionEmbedding(Float32Params, PositionalEncoding):
    """FoPE as a ``rotate`` hook; see the module docstring. ``cos_coef`` and ``sin_coef``
    (c, F, F) are parameters, kept float32 under a bf16 cast (vLLM mixes in float32)."""

    Config = FopeConfig
    float32_params = ("cos_coef", "sin_coef")

    def __init__(self, config: FopeConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        D, H, c = dims.head_dim, dims.num_heads, config.coef_heads
        if D % 2:
            raise ValueError(f"head_dim must be even for fope (half-layout pairs), got {D}")
        if config.num_inv_freq is not None and config.num_inv_freq > D // 2:
            raise ValueError(f"num_inv_freq must be <= head_dim / 2 ({D // 2}), got {config.num_inv_freq}")
        if H % c:
            raise ValueError(f"coef_heads must divide num_heads ({H}), got {c}")
        F = fope_kept_frequencies(D, config.base, config.max_position_embeddings, config.num_inv_freq).numel()
        self.num_kept = F
        self._inv_freq: dict = {}  # inv_freq per device and settings
        self.cos_coef = nn.Parameter(self._init_coef(c, F, config.init_gain))
        self.sin_coef = nn.Parameter(self._init_coef(c, F, config.init_gain))

    @staticmethod
    def _init_coef(c: int, F: int, gain: float) -> Tensor:
        w = torch.zeros(c, F, F)
        if F and gain > 0:
            nn.init.xavier_normal_(w, gain=gain)
        return w + torch.eye(F)  # (c, F, F)

    def inv_freq(self, device: torch.device | None = None) -> Tensor:
        """The kept theta_i, (F,) float64: computed, not a buffer, so no cast rounds it. Kept per
        device, keyed on everything it is computed from (a decoding step would otherwise spend
        a third of its tables here)."""
        c = self.config
        key = (self.dims.head_dim, c.base, c.max_position_embeddings, c.num_inv_freq, torch.device(device or "cpu"))
        cached = self._inv_freq.get(key)
        if cached is None:
            if len(self._inv_freq) >= 8:
                self._inv_freq.clear()
            cached = self._inv_freq[key] = fope_kept_frequencies(*key[:4]).to(key[4])
        return cached

    def tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """C and S at ``positions`` (B, T): (B, c, T, D) each, float32 or wider.

        Angles m theta_i are float64; the sums take the coefficients' dtype (float32 unless the
        module is float64). Positions must lie in [0, 2**53 - 1] (checked in eager mode)."""
        return self._laid_out(*self._sums(positions), rolled=False)

    def _sums(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The Fourier sums over the kept frequencies, (B, c, T, F) each (see :meth:`tables`)."""
        check_positions(positions)
        dt = torch.promote_types(self.cos_coef.dtype, torch.float32)
        ang = positions.to(torch.float64)[:, None, :, None] * self.inv_freq(positions.device)  # (B, 1, T, F)
        cos = torch.matmul(ang.cos().to(dt), self.cos_coef.to(dt))  # (B, c, T, F)
        sin = torch.matmul(ang.sin().to(dt), self.sin_coef.to(dt))
        return cos, sin

    def _laid_out(self, cos: Tensor, sin: Tensor, rolled: bool) -> tuple[Tensor, Tensor]:
        """C and S (B, c, T, D) from the sums: each half of D holds the F kept frequencies, then
        1 for the dropped ones (C = S = 1, as both sources); S in its :meth:`rolled` form with
        ``rolled``. Written into two tensors, no pads or concatenations (a decoding step makes
        them once per token)."""
        B, c, T, F = cos.shape
        h = self.dims.head_dim // 2
        C, S = cos.new_ones(B, c, T, 2 * h), sin.new_ones(B, c, T, 2 * h)
        C[..., :F], C[..., h:h + F] = cos, cos
        if rolled:
            S[..., :h] = -1.0
            S[..., :F], S[..., h:h + F] = -sin, sin
        else:
            S[..., :F], S[..., h:h + F] = sin, sin
        return C, S

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> FopeState:
        """C and S at the query positions, once per forward for every layer: the new keys of
        self-attention sit there too (``k_pos``, every key with the cache, is not rotated here)."""
        return FopeState(*self._laid_out(*self._sums(q_pos), rolled=True))

    @staticmethod
    def rolled(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """C and ``[-S₁ | S₂]`` from :meth:`tables`' C and S: x·C + rotate_half(x)·S is then
        x·C + roll(x, D/2)·[-S₁ | S₂], since rotate_half(x) = [-x₂ | x₁] and roll(x, D/2) = [x₂ | x₁]
        (the same products, the sign moved onto the table once per forward)."""
        h = sin.shape[-1] // 2
        return cos, torch.cat((-sin[..., :h], sin[..., h:]), dim=-1)

    def _map(self, x: Tensor, cos: Tensor, sin: Tensor, what: str) -> Tensor:
        """x (B, Hx, T, D) times its group's C and rolled S (:meth:`rolled`): (B|1, c, T, D) -> (B, Hx, T, D)."""
        B, Hx, T, D = x.shape
        c = cos.shape[1]
        if Hx % c:
            raise ValueError(f"coef_heads ({c}) must divide the heads of {what}, got {Hx}")
        dt = torch.promote_types(x.dtype, cos.dtype)
        xg = x.to(dt).view(B, c, Hx // c, T, D)  # (B, c, Hx/c, T, D): head h in group h // (Hx/c)
        out = torch.addcmul(xg * cos[:, :, None], xg.roll(D // 2, dims=-1), sin[:, :, None])
        return out.reshape(B, Hx, T, D).to(x.dtype)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor,
               state: FopeState | None = None) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, D) at q_pos (B, Tq) and k (B, Hkv, Tk, D) at k_pos (B, Tk), mapped by
        their positions' C and S. ``state``: :meth:`prepare`'s, for keys at the query positions."""
        if state is None:
            q_cs, k_cs = (self._laid_out(*self._sums(p), rolled=True) for p in (q_pos, k_pos))
        else:
            if k.shape[-2] != state.cos.shape[-2]:
                raise ValueError(
                    f"state is prepare()'s, for keys at the {state.cos.shape[-2]} query positions, but k has "
                    f"{k.shape[-2]}; pass state=None for keys at other positions"
                )
            q_cs = k_cs = (state.cos.to(q.device), state.sin.to(q.device))
        ext = _fused(q, k, q_cs[0], k_cs[0])
        if ext is not None:  # one coefficient set, no autograd: RoPE's rolled form, one call for q and k
            return ext.rotate_half_qk(q, k, *q_cs, *k_cs)
        return self._map(q, *q_cs, "q"), self._map(k, *k_cs, "k")

    def extra_repr(self) -> str:
        c = self.config
        return (f"kept={self.num_kept} of {self.dims.head_dim // 2}, base={c.base}, "
                f"max_position_embeddings={c.max_position_embeddings}, coef_heads={c.coef_heads}")
