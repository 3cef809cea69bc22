"""PaTH: position encoding by accumulating Householder transformations (Yang et al. 2025, "PaTH
Attention: Position Encoding via Accumulating Householder Transformations", arXiv:2505.16381,
NeurIPS 2025), as flash-linear-attention (FLA) implements it: the layer
``fla/layers/path_attn.py`` (``PaTHAttention``) and the reference ``fla/ops/path_attn/naive.py``
(``naive_path_attn``), github.com/fla-org/flash-linear-attention at commit
bc3b101dcb713ddc5bd8924b66754eb68b5ccf89.

Every token t carries, per head, a Householder-like matrix made from the attention layer's input
x_t (the normed hidden state):

    H_t = I - beta_t w_t w_tᵀ,    beta_t = 2 sigmoid(u·x_t + b) in (0, 2),   |w_t| = 1,

and the logit of a query i and a key j <= i is the bilinear form through the product of the
matrices of the tokens after the key, up to and including the query (the paper's
A_ij ∝ exp(k_jᵀ (prod_{s=j+1}^{i} H_s) q_i)):

    logit_ij = s · q_iᵀ P_ij k_j,    P_ij = H_i H_{i-1} ⋯ H_{j+1}    (P_ii = I),

then softmax as usual (s = 1/sqrt(D)). The order and the ends (H_i in, H_j out) are FLA's: its
decoding step multiplies every cached key by the new token's H_t before the new key joins the
cache (``rank_one_update`` in ``fla/layers/path_attn.py``), and its reference's within-chunk
term masks q_i·w_l to l <= i and w_l·k_j to l > j. β reaching past 1 gives negative eigenvalues
1 - β (the paper's "allowing negative eigenvalues"); at β = 2 every H_t is a reflection, at
β → 0 the identity (NoPE).

w and β as FLA's ``PaTHAttention`` makes them (``use_w_shortconv=True, use_low_rank_w=True``, its
defaults): ``w_proj`` = Linear(C, 32) then Linear(32, H·D), both without bias (``w_rank=0``:
one Linear(C, H·D), FLA's ``use_low_rank_w=False``); ``w_conv1d`` a causal depthwise convolution
of ``conv_size`` = 3 taps over the H·D channels, without bias, then SiLU (FLA's
``ShortConvolution``; ``conv_size=0``: none, ``use_w_shortconv=False``); then per head
w = y / sqrt(|y|² + 1e-6) (FLA's ``l2_norm``, its eps included, so |w| is 1 to within
1e-6/|y|²). ``bt_proj`` = Linear(C, H) with bias, β = 2 sigmoid of it. FLA makes w and β per
key/value head, shared by a group of query heads; posenc builds an encoding from (C, H, D)
alone, without the key/value head count, so here they are per query head (the same thing when
H = Hkv). FLA's optional forget gate (``use_forget_gate``: PaTH-FoX) is not part of this
encoding (:mod:`posenc.relative.fox` is FoX alone).

How posenc adds it. Without a KV cache the term is a :class:`~posenc.terms.HouseholderTerm`
(q, k, w, β and the scale): under a plain causal mask the planner gives it a leaf of its own,
:mod:`posenc.backends.householder_flash`, which computes the causal logits chunk by chunk, each
query carried back through the chunks before its own (FLA's parallel kernel's way,
``fla/ops/path_attn/parallel.py``), with a FlashAttention-style softmax and backward, and keeps
no (T, T) tensor. Every other backend or mask (eager, flex, padding, packed documents, a
bidirectional layer) adds the term's dense form, the difference

    term_ij = s · (q_iᵀ P_ij k_j - q_i·k_j),

to its own s·q_i·k_j. With a KV cache the cache keeps every key carried to the last token
(:class:`~posenc.householder.CarriedKeys`: a long part carried to a token r and the product of
the matrices since, with the keys since r apart, folded together every 64 tokens). A prompt
that starts the cache attends as without one (the HouseholderTerm) and hands the cache its keys
carried chunk by chunk (:func:`~posenc.householder.carried_keys`, no logits). A decoding
step reads the long part once, through the query carried back to r, and returns the logits as
a :class:`~posenc.terms.LogitsTerm`, whose leaf computes no q·kᵀ; a longer call after the prompt
takes the difference as a :class:`~posenc.terms.DenseTerm` from
:func:`~posenc.householder.path_scan`, which also gives the cache its carried keys. The products' algebra (chunks of 64 tokens, the UT transform) is
:mod:`posenc.householder`'s.

The KV cache keeps, per layer (``QKProjection.memory``, entries replaced, never written in
place), the cached keys carried through every Householder up to the last cached token (what
FLA's decoding keeps in place of its key cache) and the short convolution's last
``conv_size - 1`` inputs with their position ids: a decoding step carries the keys since the
last fold and the product through the new token's matrix (rank-one updates) and scans only the
new tokens. A sliding cache keeps the carried keys of the keys it keeps, which is all a query
needs.

Positions. PaTH reads no position ids: the order is the stream order (i, j and the tokens
between them are stream indices; the queries are the last Tq of the Tk keys, as in the mask).
Between two tokens that see each other there is no other document and no padding when documents
are contiguous in the stream and padding sits at the ends of a row, so the products need no
mask (packed == separate). The one place position ids enter is the short convolution's
boundary: FLA restarts the convolution at each packed document (``cu_seqlens``), and posenc's
``terms`` hook sees position ids but not document ids, so a tap reads the token s places back
only when that token's position id is the reading token's minus s: consecutive ids are one
document (packing restarts ids at 0, left padding gives padding ids that never continue into
the first real token's). Position ids with gaps (``randomized_positions``) therefore cut the
convolution at every gap.

Bidirectional attention: PaTH is causal. For a key after its query posenc mirrors the causal
rule instead of refusing (every registered encoding serves encoders):
P_ij = H_{i+1} H_{i+2} ⋯ H_j for j > i (the tokens after the query up to and including the key,
nearest the query first), computed by the same scan on the reversed stream. The term cannot
know whether the layer is causal, so it always holds both triangles: in a causal model the
mirror costs a second scan whose result the mask drops.

Precision: w, β, the products and the term in float32 (float64 in a float64 model), autocast
off: a bfloat16 product of Householders drifts with every token it passes. The KV cache's carried
keys are float32 too.

Shapes: x (B, t, C); q (B, H, Tq, D), k (B, H, Tk, D); w (B, H, T, D), β (B, H, T);
term (B, H, Tq, Tk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..config import EncodingConfig, check_int
from ..encoding import Dims, PositionalEncoding, QKProjection, cached_entry, layer_input
from ..householder import CHUNK, CarriedKeys, carried_keys, mirror_logits, path_logits, path_scan
from ..literature import LEARNED, UNTRAINED
from ..registry import register
from ..terms import DenseTerm, HouseholderTerm, LogitsTerm

__all__ = ["PathConfig", "PathAttention", "path_logits", "path_scan"]  # the last two: posenc.householder's

#: Keys of a layer's KV-cache dict: the cached keys carried through every Householder up to the
#: last cached token (a :class:`~posenc.householder.CarriedKeys`, shape (B, H, Tc, D)); the
#: short convolution's last inputs (B, n, H·D), n <= conv_size - 1, and their position ids (B, n).
MEMORY_KEYS = "path_carried_keys"
MEMORY_CONV = "path_conv_inputs"
MEMORY_CONV_POS = "path_conv_positions"
#: FLA's ``l2_norm`` eps (fla/modules/l2norm.py): w = y / sqrt(|y|² + eps).
L2_EPS = 1e-6
MAX_W_RANK = 4096
MAX_CONV_SIZE = 64
_PAPER = "Yang et al. 2025 (PaTH)"


@dataclass
class PathConfig(EncodingConfig):
    """Config of :class:`PathAttention` (defaults: FLA's ``PaTHAttention``).

    Attributes:
        w_rank: rank of the projection making w from the layer input, in [0, 4096]: 32 is FLA's
            ``use_low_rank_w=True`` (Linear(C, 32) then Linear(32, H·D)); 0 a full Linear(C, H·D)
            (``use_low_rank_w=False``).
        conv_size: taps of the causal depthwise short convolution on w's projection, in
            [0, 64]: 3 as FLA's ``conv_size``; 0 none (``use_w_shortconv=False``).
        conv_bias: the short convolution has a bias (FLA's ``conv_bias``, False).
    """

    w_rank: int = 32
    conv_size: int = 3
    conv_bias: bool = False

    def validate(self) -> None:
        check_int("w_rank", self.w_rank, minimum=0, maximum=MAX_W_RANK)
        check_int("conv_size", self.conv_size, minimum=0, maximum=MAX_CONV_SIZE)


@register(
    "path",
    family="relative",
    summary="PaTH: q_iᵀ H_i⋯H_{j+1} k_j, products of data-dependent Householders I - β w wᵀ of the layer input",
    paper="Yang et al. 2025, PaTH Attention: Position Encoding via Accumulating Householder Transformations",
    claims={
        "absolute": (False, _PAPER + ": no position ids; the logit passes through the Householders of the tokens "
                            "between j and i"),
        "relative": (UNTRAINED, _PAPER + ": the transform between j and i is made from the tokens between them "
                                "by learned projections of the input"),
        "bounded": (True, _PAPER + ": every H_t has eigenvalues 1 and 1 - β_t in (-1, 1), so "
                          "|q_iᵀ P_ij k_j| <= |q_i| |k_j| at every distance"),
        "decay": (UNTRAINED, LEARNED),
        "extrapolation": (True, _PAPER + ": no position ids, defined at every length (its length-extrapolation "
                                "experiments)"),
        "linear_attention": (False, _PAPER + ": softmax attention over a (Tq, Tk) term of products of the tokens' "
                                    "Householders; its linear-attention counterpart is DeltaNet's recurrence, "
                                    "not a feature map"),
    },
)
class PathAttention(PositionalEncoding):
    """PaTH as a content-dependent ``terms`` hook returning one :class:`~posenc.terms.HouseholderTerm`
    (or, with a KV cache, one :class:`~posenc.terms.DenseTerm`).

    Modules named as FLA's ``PaTHAttention`` (their weights load by name): ``w_proj`` (a
    Sequential of two bias-free Linears, or one with ``w_rank=0``), ``w_conv1d`` (a depthwise
    Conv1d, weight (H·D, 1, conv_size), absent with ``conv_size=0``), ``bt_proj``
    (Linear(C, H) with bias).
    """

    Config = PathConfig

    def __init__(self, config: PathConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        C, width = dims.d_model, dims.num_heads * dims.head_dim
        if config.w_rank:
            self.w_proj: nn.Module = nn.Sequential(nn.Linear(C, config.w_rank, bias=False),
                                                   nn.Linear(config.w_rank, width, bias=False))
        else:
            self.w_proj = nn.Linear(C, width, bias=False)
        if config.conv_size:
            self.w_conv1d = nn.Conv1d(width, width, config.conv_size, groups=width, padding=config.conv_size - 1,
                                      bias=config.conv_bias)
        self.bt_proj = nn.Linear(C, dims.num_heads)

    @property
    def reads_layer_input(self) -> bool:
        return True

    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The keys' position ids (B|1, Tk): the short convolution's boundaries, nothing else."""
        return k_pos

    def householders(self, x: Tensor, positions: Tensor | None = None,
                     past: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
        """Unit w (B, H, t, D) and β (B, H, t) of the t tokens of the layer input x (B, t, C),
        float32 or wider, and what the next tokens' short convolution reads.

        ``positions`` (B|1, t): the tokens' position ids, where the convolution restarts (None:
        one run of consecutive tokens). ``past``: the convolution's inputs (B, n, H·D) and
        position ids (B, n) of the n <= conv_size - 1 tokens just before these (a KV cache's);
        the third result is the same pair for the tokens after these.
        """
        dt = torch.promote_types(x.dtype, torch.float32)
        B, t = x.shape[:2]
        H, D = self.dims.num_heads, self.dims.head_dim
        x = x.to(dt)
        y = x
        for lin in (self.w_proj if isinstance(self.w_proj, nn.Sequential) else [self.w_proj]):
            y = F.linear(y, lin.weight.to(dt))  # (B, t, rank) then (B, t, H·D)
        pos = torch.arange(t, device=x.device).expand(B, t) if positions is None else positions.expand(B, t)
        if past is not None:
            y_all, pos_all = torch.cat([past[0].to(dt), y], dim=1), torch.cat([past[1], pos], dim=1)
        else:
            y_all, pos_all = y, pos
        first = y_all.shape[1] - min(max(self.config.conv_size - 1, 0), y_all.shape[1])  # the last conv_size - 1
        tail = (y_all[:, first:], pos_all[:, first:])
        if self.config.conv_size:
            y = self._short_conv(y_all, pos_all, t)
        w = y.view(B, t, H, D)
        w = w * torch.rsqrt((w * w).sum(-1, keepdim=True) + L2_EPS)  # FLA's l2_norm
        beta = 2 * torch.sigmoid(F.linear(x, self.bt_proj.weight.to(dt), self.bt_proj.bias.to(dt)))  # (B, t, H)
        return w.transpose(1, 2), beta.transpose(1, 2), tail

    def _short_conv(self, y: Tensor, pos: Tensor, t: int) -> Tensor:
        """silu(causal depthwise convolution) (B, t, H·D) of the last t of the tokens y (B, n + t, H·D)
        with position ids pos (B, n + t): a tap reads the token s back only when that token is
        there and its position id is this token's minus s."""
        size, first = self.config.conv_size, y.shape[1] - t
        if t == 0:
            return y[:, first:]
        present = F.pad(torch.ones_like(pos, dtype=torch.bool), (size - 1, 0))
        padded = F.pad(y, (0, 0, size - 1, 0))  # (B, size - 1 + n + t, H·D)
        win_pos = F.pad(pos, (size - 1, 0)).unfold(1, size, 1)[:, first:]  # (B, t, size)
        lag = torch.arange(size - 1, -1, -1, device=y.device)  # tap k reads the token size - 1 - k back
        taps = present.unfold(1, size, 1)[:, first:] & (win_pos == pos[:, first:, None] - lag)  # (B, t, size)
        weight = self.w_conv1d.weight.to(y.dtype)[:, 0]  # (H·D, size)
        # Tap by tap: autograd keeps views of one padded copy and (B, t) masks, not a (B, t, H·D,
        # size) window tensor.
        out = None
        for s in range(size):
            tap = (padded[:, first + s : first + s + t] * weight[:, s]) * taps[:, :, s, None].to(y.dtype)
            out = tap if out is None else out + tap  # (B, t, H·D)
        if self.w_conv1d.bias is not None:
            out = out + self.w_conv1d.bias.to(y.dtype)
        return F.silu(out)

    def terms(self, q: Tensor, k: Tensor, state: Any,
              proj: QKProjection | None = None) -> list[HouseholderTerm] | list[LogitsTerm] | list[DenseTerm]:
        """s·(q_iᵀ P_ij k_j - q_i·k_j) of the Tq queries against the Tk keys, the new tokens'
        w and β from ``proj.x``: without a KV cache, or for a prompt that starts one, a
        :class:`~posenc.terms.HouseholderTerm`. With a cache, the cached keys carried through
        their products come from ``proj.memory`` (which receives all Tk keys carried to the
        last, a :class:`~posenc.householder.CarriedKeys`); a decoding step (one new token)
        returns its logits as a :class:`~posenc.terms.LogitsTerm`, any other call after the
        prompt the difference as a :class:`~posenc.terms.DenseTerm`. The queries are the last
        Tq of the keys."""
        B, H, Tq, D = q.shape
        Tk = k.shape[2]
        x = layer_input(proj, "path", "Householders", q, k, self.dims.d_model)
        if not isinstance(state, Tensor) or state.shape[-1] != Tk:
            raise ValueError(f"path's state must be the {Tk} keys' position ids (prepare(q_pos, k_pos)), got "
                             f"{tuple(state.shape) if isinstance(state, Tensor) else type(state).__name__}")
        t = x.shape[1]
        memory, past, cached, _ = cached_entry(proj, MEMORY_KEYS, t, Tk, -2, "path", "Householders", "products")
        conv_past = (memory[MEMORY_CONV], memory[MEMORY_CONV_POS]) if cached and MEMORY_CONV in memory else None
        with torch.autocast(q.device.type, enabled=False):
            if memory is None and torch.is_grad_enabled() and not torch.compiler.is_compiling():
                # w and β recomputed in the backward from x: O(T·C) kept, not O(T·H·D) per layer
                # (under torch.compile the compiler decides what to keep; dynamo does not trace it)
                w, beta, _ = checkpoint(self.householders, x, state, None, use_reentrant=False)
            else:
                w, beta, tail = self.householders(x, state[..., cached:], conv_past)
            dt = w.dtype
            qd, kd = q.to(dt), k.to(dt)
            scale = self.attention_scale(D)
            if memory is None:
                return [HouseholderTerm(qd, kd, w, beta, scale, CHUNK)]
            if not cached and Tq == t:  # a prompt: attention as without a cache; the cache's keys from the chunks
                memory[MEMORY_KEYS] = CarriedKeys(carried_keys(kd, w, beta))
                memory[MEMORY_CONV], memory[MEMORY_CONV_POS] = tail
                return [HouseholderTerm(qd, kd, w, beta, scale, CHUNK)]
            keys = past.last(cached) if cached else None  # a sliding cache's carried keys: its last ones
            if cached and t == 1:  # a decoding step: the carried keys' long part read once
                logits, keys = keys.step(qd, kd[..., -1:, :], w, beta)
                term: LogitsTerm | DenseTerm = LogitsTerm(logits, qd, kd, scale)
            else:
                logits, carried = path_scan(qd, kd[..., cached:, :], w, beta, keys.all() if cached else None)
                if Tq > 1:  # keys after a query (bidirectional): the mirror among the last Tq tokens
                    mirror = mirror_logits(qd, kd[..., Tk - Tq:, :], w[..., t - Tq:, :], beta[..., t - Tq:])
                    logits = logits + F.pad(mirror, (Tk - Tq, 0))
                term, keys = DenseTerm(scale * (logits - qd @ kd.mT)), CarriedKeys(carried)
        memory[MEMORY_KEYS] = keys
        memory[MEMORY_CONV], memory[MEMORY_CONV_POS] = tail
        return [term]
