"""Multi-head latent attention, MLA (DeepSeek-V2, arXiv 2405.04434, §2.1; DeepSeek-V3, Kimi K2),
with its decoupled RoPE and a cache of latents.

Shapes: x (B, T, C); H heads; R = kv_lora_rank; dn = qk_nope_head_dim, dr = qk_rope_head_dim,
dv = v_head_dim; q (B, H, Tq, dn + dr); the latents c_kv (B, Tk, R) and the rotated key slice
k_pe (B, Tk, dr), one slice that every head shares.

The layer (the paper's eqs. 9-19, with DeepSeek-V3's module names)::

    q          = q_b_proj(q_a_layernorm(q_a_proj(x)))  or  q_proj(x)   (B, H, T, dn + dr) = [q_nope | q_pe]
    c_kv, k_pe = kv_a_proj_with_mqa(x)                                 (B, T, R), (B, T, dr)
    c_kv       = kv_a_layernorm(c_kv)                                  cached
    q_pe, k_pe = the encoding's rotate hook on these dr channels only  k_pe cached
    k_nope, v  = kv_b_proj(c_kv), per head                             (B, H, Tk, dn), (B, H, Tk, dv)
    logits     = (q_nope·k_nope + q_pe·k_pe) · scale
    out        = o_proj(softmax(logits) · v)

``scale`` is the encoding's ``attention_scale(dn + dr)`` (1/sqrt(dn + dr) for RoPE) times
:func:`softmax_mscale`: DeepSeek's mscale(s, mscale_all_dim)² under YaRN, read from the encoding
at each call. The layout of the rotated pairs is the encoding's (DeepSeek's checkpoints rotate
interleaved pairs: ``layout="interleaved"``, what transformers' ``rope_interleave=True`` does).

Two paths compute the same attention (:meth:`MultiHeadLatentAttention.path_for` picks one per
call; both run through :func:`posenc.backends.run`, so the mask and the backend are posenc's):

* naive: every key's latent expanded into per-head k_nope and v, then attention with head dim
  dn + dr and value dim dv (DeepSeek-V3's ``attn_impl="naive"``);
* absorbed (§2.1.2): kv_b_proj's key half W_UK (H, dn, R) folded into the query,
  q_lat = q_nope·W_UK (B, H, Tq, R), so that q_nope·k_nope = q_lat·c_kv; attention is then
  multi-query attention of [q_lat | q_pe] against the one key head [c_kv | k_pe] with the
  latents as values (the key itself, its first R channels kept), and the value half W_UV
  (H, dv, R) is applied after: out = (softmax · c_kv)·W_UVᵀ (DeepSeek-V3's
  ``attn_impl="absorb"``, inference/model.py). No per-key tensor is expanded: a decoding step
  reads the R + dr numbers cached per token.

The cache slot is a :class:`~posenc.kv_cache.LatentCache` of a :class:`~posenc.kv_cache.KVCache`
(``KVCache(n, latent_layers=[...])``; ``Transformer.new_cache()`` makes them for MLA layers).

Weights: the parameter names and shapes are transformers' ``DeepseekV3Attention``'s (and
DeepSeek-V2's), so the key map is the identity: ``mla.load_state_dict(hf_attn.state_dict())``;
from a whole checkpoint, :func:`deepseek_v3_keys` strips ``model.layers.{i}.self_attn.``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backends import IMPLS, Impl, LayerTerms, run
from .config import check_choice, check_even, check_fields, check_int, check_positive
from .context import AttentionContext, EncodingState, layer_context
from .encoding import PositionalEncoding
from .kv_cache import KVCache, LatentCache
from .positions import SequenceInfo
from .registry import build
from .rotary.scaling.yarn import yarn_mscale

__all__ = ["MLAConfig", "MultiHeadLatentAttention", "PATHS", "RMSNorm", "deepseek_v3_keys", "multiply_adds",
           "softmax_mscale"]

#: how attention runs from the latents: "naive", "absorbed", or "auto" (fewer multiply-adds)
PATHS = ("naive", "absorbed", "auto")
Path = Literal["naive", "absorbed", "auto"]


@dataclass(frozen=True)
class MLAConfig:
    """Sizes of one multi-head latent attention layer (DeepSeek-V3's config names).

    Attributes:
        d_model: model width C (transformers' ``hidden_size``).
        num_heads: query heads H (``num_attention_heads``).
        kv_lora_rank: R, the width of the cached latent c_kv (512 in DeepSeek-V2/V3).
        qk_nope_head_dim: dn, the unrotated channels of each head's q and k (128).
        qk_rope_head_dim: dr, the rotated channels (even: RoPE pairs; 64); k's are one slice
            shared by all heads.
        v_head_dim: dv, each head's value width (128).
        q_lora_rank: the query's low-rank width (1536 in V3), or None for one q_proj (V2-Lite).
        bias: a bias on q_a_proj, kv_a_proj_with_mqa and o_proj (``attention_bias``; q_proj,
            q_b_proj and kv_b_proj never have one).
        norm_eps: the RMSNorms' epsilon (DeepSeek-V3's attention norms use 1e-6).
    """

    d_model: int
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    bias: bool = False
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("d_model", "num_heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            check_int(name, getattr(self, name), minimum=1)
        check_even("qk_rope_head_dim", self.qk_rope_head_dim)
        if self.q_lora_rank is not None:
            check_int("q_lora_rank", self.q_lora_rank, minimum=1)
        check_positive("norm_eps", self.norm_eps)

    @property
    def qk_head_dim(self) -> int:
        """dn + dr: the width of each head's q and k."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cached_per_token(self) -> int:
        """Numbers the cache keeps per token and layer: R + dr (the latent and the key slice)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def from_hf(cls, config: Any) -> "MLAConfig":
        """The sizes of a DeepSeek-V2/V3 (or Kimi K2) config: a transformers config or its dict."""
        d = config.to_dict() if hasattr(config, "to_dict") else config
        if not isinstance(d, Mapping):
            raise TypeError(f"config must be a transformers config or a dict, got {type(config).__name__}")
        keys = ("hidden_size", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        missing = [k for k in keys if d.get(k) is None]
        if missing:
            raise ValueError(f"config lacks {', '.join(missing)}: not a multi-head latent attention config "
                             f"(model_type {d.get('model_type')!r})")
        return cls(d["hidden_size"], d["num_attention_heads"], d["kv_lora_rank"], d["qk_nope_head_dim"],
                   d["qk_rope_head_dim"], d["v_head_dim"], d.get("q_lora_rank"), bool(d.get("attention_bias", False)))

    def build_encoding(self, name: str = "rope", **config: Any) -> PositionalEncoding:
        """Encoding ``name`` for these layers: heads H, head dim dr (the rotated slice).
        DeepSeek's checkpoints take ``layout="interleaved"``."""
        return build(name, d_model=self.d_model, num_heads=self.num_heads, head_dim=self.qk_rope_head_dim, **config)


class RMSNorm(nn.Module):
    """x / rms(x) · weight (Zhang & Sennrich 2019), as DeepSeek-V3's ``DeepseekV3RMSNorm``: the
    mean of squares in float32 for half types (float64 for float64), the result rounded to x's
    dtype before the weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def softmax_mscale(pe: PositionalEncoding | None) -> float:
    """DeepSeek's factor on the softmax scale: mscale(s, mscale_all_dim)², mscale(s, m) =
    0.1·m·ln s + 1 for s > 1 (else 1), when ``pe``'s RoPE scaling carries a non-zero
    ``mscale_all_dim`` (YaRN as DeepSeek-V2/V3 configure it), else 1.

    It multiplies every logit, the unrotated channels too, which is why it lives in the
    attention and not in the rotation (DeepSeek-V2 §2.1 with YaRN; transformers'
    ``yarn_apply_mscale`` in modeling_deepseek_v3.py). The rotation itself carries YaRN's
    attention factor mscale(s, mscale) / mscale(s, mscale_all_dim) on cos and sin
    (``posenc.rotary.scaling.yarn``).
    """
    # Read from the scaling's typed config, not from a scaling name: any scaling whose config
    # has the field follows.
    scaling = getattr(getattr(pe, "config", None), "scaling_config", None)
    m = getattr(scaling, "mscale_all_dim", None)
    if not m:
        return 1.0
    return yarn_mscale(scaling.factor, m) ** 2


def multiply_adds(cfg: MLAConfig, path: str, tq: int, tk: int) -> int:
    """Multiply-adds per batch row of ``path`` ("naive" or "absorbed") for Tq queries against
    Tk keys, dense (the mask ignored), the projections both paths share left out.

    naive: expand every key's latent (Tk·R·(dn + dv) per head), then scores and values over one
    width W = max(dn + dr, dv); absorbed: fold W_UK into each query and W_UV into each output
    (Tq·R·(dn + dv)), scores and values over R + dr (the key is the value).
    """
    check_choice("path", path, PATHS[:2])
    R, dn, dr, dv, H = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.num_heads
    if path == "naive":
        return H * (tk * R * (dn + dv) + tq * tk * 2 * max(dn + dr, dv))
    return H * (tq * R * (dn + dv) + tq * tk * 2 * (R + dr))


def deepseek_v3_keys(state_dict: Mapping[str, Tensor], layer: int) -> dict[str, Tensor]:
    """Layer ``layer``'s attention weights from a DeepSeek-V2/V3 checkpoint's state dict,
    keyed for :class:`MultiHeadLatentAttention` (``model.layers.{layer}.self_attn.`` removed;
    the rest of each name is the same)."""
    check_int("layer", layer, minimum=0)
    prefix = f"model.layers.{layer}.self_attn."
    out = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    if not out:
        raise ValueError(f"no key starts with {prefix!r}: not a DeepSeek checkpoint, or no layer {layer}")
    return out


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (see the module docstring) with posenc's encodings and backends.

    Args:
        config: the sizes (:class:`MLAConfig`).
        pe: for standalone use, the encoding this layer owns (a submodule), built for the rope
            slice (``config.build_encoding(...)``). In a :class:`~posenc.model.Transformer` the
            model owns the encodings and passes each layer its :class:`EncodingState`.
            Encodings with content-dependent terms are refused: those read the layer's q/k
            projections, which MLA does not have as one matrix each.
        causal: causal (decoder) or bidirectional self-attention.
        impl: the backend, one of "eager", "sdpa", "flex", "auto" (:mod:`posenc.backends`).
        path: "naive", "absorbed" or "auto" (per call, the one with fewer multiply-adds:
            naive for a prefill, absorbed for decoding steps); see :meth:`path_for`.
    """

    def __init__(
        self,
        config: MLAConfig,
        pe: PositionalEncoding | None = None,
        *,
        causal: bool = True,
        impl: Impl = "sdpa",
        path: Path = "auto",
    ) -> None:
        super().__init__()
        if not isinstance(config, MLAConfig):
            raise TypeError(f"config must be an MLAConfig, got {type(config).__name__}")
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
        check_choice("impl", impl, IMPLS)
        check_choice("path", path, PATHS)
        if pe is not None:
            self.check_encoding(pe, config)
        self.config, self.causal, self.impl, self.path = config, causal, impl, path
        c, H = config, config.num_heads
        if c.q_lora_rank is None:
            self.q_proj = nn.Linear(c.d_model, H * c.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(c.d_model, c.q_lora_rank, bias=c.bias)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.norm_eps)
            self.q_b_proj = nn.Linear(c.q_lora_rank, H * c.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.d_model, c.kv_lora_rank + c.qk_rope_head_dim, bias=c.bias)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.norm_eps)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.o_proj = nn.Linear(H * c.v_head_dim, c.d_model, bias=c.bias)
        self.pe = pe  # a registered submodule (or None): standalone use only

    @staticmethod
    def check_encoding(pe: PositionalEncoding, cfg: MLAConfig) -> None:
        """Raise unless ``pe`` can serve layers of ``cfg``: no content-dependent terms, and built
        for H heads of the rope slice's dr dims."""
        if not isinstance(pe, PositionalEncoding):
            raise TypeError(f"pe must be a PositionalEncoding or None, got {type(pe).__name__}")
        if pe.has_terms or pe.has_value_terms:
            raise ValueError(f"encoding {pe.name!r} has content-dependent terms, which read a layer's q/k projections: "
                             "multi-head latent attention takes rotations and content-independent biases only")
        if (pe.dims.num_heads, pe.dims.head_dim) != (cfg.num_heads, cfg.qk_rope_head_dim):
            raise ValueError(
                f"encoding {pe.name!r} is built for {pe.dims.num_heads} heads of {pe.dims.head_dim} dims, but this "
                f"attention rotates {cfg.num_heads} heads of qk_rope_head_dim={cfg.qk_rope_head_dim}: build it with "
                "MLAConfig.build_encoding(...)"
            )

    def path_for(self, tq: int, tk: int) -> str:
        """The path a call of ``tq`` queries against ``tk`` keys takes: ``self.path``, or under
        "auto" the one of fewer :func:`multiply_adds` (naive on a tie)."""
        if self.path != "auto":
            return self.path
        naive, absorbed = (multiply_adds(self.config, p, tq, tk) for p in PATHS[:2])
        return "absorbed" if absorbed < naive else "naive"

    def query(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> q (B, H, T, dn + dr), before rotation."""
        B, T, _ = x.shape
        q = self.q_proj(x) if self.config.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        return q.view(B, T, self.config.num_heads, self.config.qk_head_dim).transpose(1, 2)  # (B, H, T, dn + dr)

    def latents(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, T, C) -> (c_kv (B, T, R) normalised, k_pe (B, T, dr) before rotation)."""
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.config.kv_lora_rank, self.config.qk_rope_head_dim], dim=-1)
        return self.kv_a_layernorm(c_kv), k_pe

    def forward(
        self,
        x: Tensor,
        ctx: AttentionContext | SequenceInfo,
        *,
        encoding: EncodingState | None = None,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> Tensor:
        """x (B, Tq, C) -> (B, Tq, C).

        ``ctx``: an :class:`AttentionContext` (as the model passes; with a cache, built with it)
        or the queries' :class:`SequenceInfo` for standalone use. ``encoding``: this layer's
        :class:`EncodingState` (the model passes it); None prepares ``self.pe``'s. ``cache``: a
        :class:`KVCache` whose slot ``layer`` is a :class:`LatentCache`; the step's latents and
        rotated key slices are appended (call ``cache.commit(ctx.k_seq, Tq)`` after a standalone
        step; the model does).
        """
        c = self.config
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != c.d_model:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, T, {c.d_model}), got {got}")
        ctx, encoding = layer_context(ctx, encoding, self.pe, causal=self.causal, cache=cache,
                                      owner="MultiHeadLatentAttention", handle="mla")
        if encoding.pe is not None and encoding.pe is not self.pe:
            self.check_encoding(encoding.pe, c)
        if cache is not None and not isinstance(cache.layers[layer] if 0 <= layer < len(cache.layers) else None, LatentCache):
            raise ValueError(f"cache layer {layer} is not a LatentCache: build the cache with "
                             f"KVCache(n, latent_layers=[..., {layer}, ...]) (model.new_cache() does)")
        B, Tq, _ = x.shape
        if ctx.q_seq.positions.shape[1] != Tq:
            raise ValueError(f"positions cover {ctx.q_seq.positions.shape[1]} tokens but x has {Tq}")

        q_nope, q_pe = self.query(x).split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)  # (B, H, Tq, dn), (B, H, Tq, dr)
        c_kv, k_pe = self.latents(x)  # (B, Tq, R), (B, Tq, dr)
        # The new keys sit at the query positions: the prepared state rotates both. k_pe is one head.
        q_pe, k_pe = encoding.rotate(q_pe, k_pe[:, None])  # (B, H, Tq, dr), (B, 1, Tq, dr)
        k_pe = k_pe[:, 0]  # (B, Tq, dr)
        if cache is not None:
            c_kv, k_pe = cache.update(layer, c_kv, k_pe)  # (B, Tcache + Tq, R), (B, Tcache + Tq, dr)
            if c_kv.shape[1] != ctx.mask.tk:
                raise ValueError(
                    f"cache layer {layer} holds {c_kv.shape[1]} keys with this step's but the context describes "
                    f"{ctx.mask.tk}: after a standalone step, call cache.commit(ctx.k_seq, T) (the model does)"
                )
        terms = LayerTerms.of(encoding.q_pos, encoding.k_pos, encoding.bias, [])
        scale = encoding.scale(c.qk_head_dim) * softmax_mscale(encoding.pe)
        if self.path_for(Tq, c_kv.shape[1]) == "absorbed":
            out = self._absorbed(q_nope, q_pe, c_kv, k_pe, ctx, scale, terms)
        else:
            out = self._naive(q_nope, q_pe, c_kv, k_pe, ctx, scale, terms)  # (B, H, Tq, dv)
        return self.o_proj(out.transpose(1, 2).reshape(B, Tq, c.num_heads * c.v_head_dim))

    def logits(self, x: Tensor, seq: SequenceInfo, encoding: EncodingState | None = None) -> Tensor:
        """(B, H, T, T) scaled logits (q_nope·k_nope + q_pe·k_pe)·scale of self-attention over x
        at ``seq``, before the mask and any bias: the dense form for tests and analysis (the
        forward's paths never build it). ``encoding`` as :meth:`forward`'s."""
        c = self.config
        ctx = AttentionContext.build(seq, causal=self.causal)
        encoding = ctx.prepare(self.pe) if encoding is None else encoding
        q_nope, q_pe = self.query(x).split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        c_kv, k_pe = self.latents(x)
        q_pe, k_pe = encoding.rotate(q_pe, k_pe[:, None])  # (B, H, T, dr), (B, 1, T, dr)
        B, T, _ = x.shape
        k_nope = self.kv_b_proj(c_kv).view(B, T, c.num_heads, -1)[..., : c.qk_nope_head_dim].transpose(1, 2)  # (B, H, T, dn)
        scale = encoding.scale(c.qk_head_dim) * softmax_mscale(encoding.pe)
        return (q_nope @ k_nope.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)) * scale  # (B, H, T, T)

    def _naive(self, q_nope, q_pe, c_kv, k_pe, ctx, scale, terms) -> Tensor:
        """Every key's latent expanded per head; (B, H, Tq, dv)."""
        c = self.config
        (B, Tk, _), H, dv = c_kv.shape, c.num_heads, c.v_head_dim
        kv = self.kv_b_proj(c_kv).view(B, Tk, H, c.qk_nope_head_dim + dv).transpose(1, 2)  # (B, H, Tk, dn + dv)
        k_nope, v = kv.split([c.qk_nope_head_dim, dv], dim=-1)  # (B, H, Tk, dn), (B, H, Tk, dv)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, Tk, c.qk_rope_head_dim)], dim=-1)  # (B, H, Tk, dn + dr)
        q = torch.cat([q_nope, q_pe], dim=-1)  # (B, H, Tq, dn + dr)
        # One width for q, k and v, zeros appended to the narrower side (logits and the first dv
        # output channels unchanged): SDPA's flash kernels and posenc's CPU flash leaf need it
        # (torch 2.13: "Flash attention requires q,k,v to have the same last dimension"; SDPA
        # otherwise falls back to its math kernel, which keeps the (Tq, Tk) probabilities).
        width = max(q.shape[-1], dv)
        q, k = (F.pad(t, (0, width - t.shape[-1])) for t in (q, k))
        v = F.pad(v, (0, width - dv))  # (B, H, Tk, width)
        return run(self.impl, q, k, v, scale=scale, mask=ctx.mask, terms=terms)[..., :dv]

    def _absorbed(self, q_nope, q_pe, c_kv, k_pe, ctx, scale, terms) -> Tensor:
        """kv_b_proj folded into the query and the output: attention against the latents; (B, H, Tq, dv)."""
        c = self.config
        (B, Tk, R), H = c_kv.shape, c.num_heads
        w = self.kv_b_proj.weight.view(H, c.qk_nope_head_dim + c.v_head_dim, R)
        w_uk, w_uv = w.split([c.qk_nope_head_dim, c.v_head_dim], dim=1)  # (H, dn, R), (H, dv, R)
        q = torch.cat([torch.einsum("bhtd,hdr->bhtr", q_nope, w_uk), q_pe], dim=-1)  # (B, H, Tq, R + dr)
        # One key head for all query heads (multi-query attention): an expanded view, not copies.
        # It is the value too: the output's first R channels are softmax · c_kv (the key slice's
        # dr channels cost dr / R more multiply-adds, and q, k, v keep one width, see _naive).
        k = torch.cat([c_kv, k_pe], dim=-1)[:, None].expand(B, H, Tk, R + c.qk_rope_head_dim)  # (B, H, Tk, R + dr)
        out = run(self.impl, q, k, k, scale=scale, mask=ctx.mask, terms=terms)[..., :R]  # (B, H, Tq, R)
        return torch.einsum("bhtr,hvr->bhtv", out, w_uv)  # (B, H, Tq, dv)

    def extra_repr(self) -> str:
        c = self.config
        return (f"heads={c.num_heads}, kv_lora_rank={c.kv_lora_rank}, q_lora_rank={c.q_lora_rank}, "
                f"qk_nope_head_dim={c.qk_nope_head_dim}, qk_rope_head_dim={c.qk_rope_head_dim}, "
                f"v_head_dim={c.v_head_dim}, impl={self.impl!r}, path={self.path!r}")
