"""A small pre-norm Transformer whose positional setup is declared per layer.

One :class:`~posenc.model_config.ModelConfig` builds a decoder-only language model
(``causal=True``) or a bidirectional encoder (``causal=False``); the configuration and its
checks live in :mod:`posenc.model_config`. Here: the modules, the forward (with its input
checks) and greedy generation. Shapes: tokens (B, T); hidden (B, T, C).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Attention
from .context import AttentionContext, EncodingState
from .kv_cache import KVCache
from .config import check_int
from .encoding import PositionalEncoding
from .mla import MultiHeadLatentAttention
from .model_config import EncodingSpec, ModelConfig
from .positions import SequenceInfo
from .registry import build

__all__ = ["Transformer"]


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    """Pre-norm attention + MLP. Its encoding is the model's; the forward receives its state."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        if cfg.mla is None:
            self.attn = Attention(cfg.d_model, cfg.n_head, cfg.n_kv_head, causal=cfg.causal, impl=cfg.attn_impl)
        else:
            self.attn = MultiHeadLatentAttention(cfg.mla, causal=cfg.causal, impl=cfg.attn_impl)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg.d_model, cfg.d_ff or 4 * cfg.d_model, cfg.dropout)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, ctx: AttentionContext, encoding: EncodingState, cache: KVCache | None, layer: int) -> Tensor:
        x = x + self.drop(self.attn(self.ln1(x), ctx, encoding=encoding, cache=cache, layer=layer))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Decoder-only LM or bidirectional encoder with per-layer positional encodings.

    >>> model = Transformer(ModelConfig(encoding="alibi", d_model=64, n_head=4))
    >>> logits = model(torch.randint(0, 256, (2, 16)))  # (2, 16, 256)
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Resolve specs to modules: equal shared specs -> one module.
        encodings: list[PositionalEncoding] = []
        shared: dict[EncodingSpec, int] = {}
        layer_enc: list[int | None] = []
        # Multi-head latent attention rotates only its qk_rope_head_dim slice of each head.
        head_dim = None if cfg.mla is None else cfg.mla.qk_rope_head_dim
        for spec in cfg.layer_specs():
            if spec is None:
                layer_enc.append(None)
                continue
            if spec.shared and spec in shared:
                layer_enc.append(shared[spec])
                continue
            encodings.append(build(spec.name, d_model=cfg.d_model, num_heads=cfg.n_head, head_dim=head_dim, **dict(spec.config)))
            if cfg.mla is not None:
                MultiHeadLatentAttention.check_encoding(encodings[-1], cfg.mla)
            if spec.shared:
                shared[spec] = len(encodings) - 1
            layer_enc.append(len(encodings) - 1)
        # The model owns the encodings (once each, however many layers share one); layer i
        # uses encodings[layer_enc[i]] (None: no encoding), passed to it in every forward.
        self.encodings = nn.ModuleList(encodings)
        self.layer_enc = layer_enc
        # Layer i's mask kind: AttentionMask.build keywords ({} global, window=, chunk=).
        self.layer_masks = [kind.mask for kind in cfg.layer_kinds()]
        self.blocks = nn.ModuleList(Block(cfg) for _ in layer_enc)
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.tok_emb.weight
        self.drop = nn.Dropout(cfg.dropout)
        # Encodings own their initialisation; the model initialises only its own layers.
        for mod in (self.tok_emb, self.blocks, self.head):
            mod.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding) and m.weight.shape[0] > 0:
            nn.init.normal_(m.weight, std=0.02)

    def encoding_of(self, layer: int) -> PositionalEncoding | None:
        """The encoding module layer ``layer`` uses (None: no encoding)."""
        check_int("layer", layer, minimum=0, maximum=len(self.blocks) - 1)
        i = self.layer_enc[layer]
        return None if i is None else self.encodings[i]

    def _embed_layer(self) -> int:
        n = self.cfg.absolute_before_last
        return 0 if n is None else self.cfg.n_layer - n

    def embed_positions(self, x: Tensor, seq: SequenceInfo, cache: KVCache | None = None) -> Tensor:
        """Hidden states (B, T, C) with the absolute encodings' ``embed`` hooks applied, as the
        forward applies them (in ``cfg.embed_scale`` coordinates; ``cache``: decoding state)."""
        s = self.cfg.embed_scale
        for i, pe in enumerate(self.encodings):
            if pe.has_embed:
                state = None if cache is None else cache.embed_state.setdefault(i, {})
                x = pe.embed(x, seq, state) if s is None else pe.embed(x / s, seq, state) * s  # (B, T, C)
        return x

    def forward(
        self,
        tokens: Tensor | None,
        seq: SequenceInfo | None = None,
        *,
        cache: KVCache | None = None,
        return_hidden: bool = False,
        inputs_embeds: Tensor | None = None,
    ) -> Tensor:
        """tokens (B, T) -> logits (B, T, vocab) (or hidden states (B, T, C)).

        ``seq`` defaults to positions 0..T-1, or with a non-empty cache to the tokens that follow
        each cached row (``cache.seq.next(T)``: padded and packed prompts continue too). With a
        ``cache`` the new keys/values are appended and the cache advances by T tokens; a step
        that raises leaves the cache exactly as it was. ``inputs_embeds`` (B, T, C), in the
        model's dtype, replaces the token embedding lookup (pass ``tokens=None``).

        Bad inputs raise ``TypeError``/``ValueError`` naming the argument: tokens that are not
        integers or lie outside ``[0, vocab_size)`` (checked in eager mode, one host read),
        ``seq`` or tokens on another device, a cache of another batch size or layer count.
        """
        B, T, device = self._check_inputs(tokens, inputs_embeds)
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be a KVCache (model.new_cache()) or None, got {type(cache).__name__}")
            if len(cache.layers) != len(self.blocks):
                raise ValueError(
                    f"cache has {len(cache.layers)} layers but the model has {len(self.blocks)}: "
                    "build it with model.new_cache()"
                )
            cache.check_batch(B)
        if seq is None and (cache is None or cache.length == 0):
            seq = SequenceInfo.from_offset(B, T, device=device)
        elif seq is None:
            # Continue each cached row (its positions, its last document, valid tokens).
            seq = cache.seq.next(T)
        if not isinstance(seq, SequenceInfo):
            raise TypeError(f"seq must be a SequenceInfo or None, got {type(seq).__name__}")
        if tuple(seq.positions.shape) != (B, T):
            raise ValueError(f"positions have shape {tuple(seq.positions.shape)} but tokens have {(B, T)}")
        if seq.positions.device != device:
            raise ValueError(f"seq is on {seq.positions.device} but the tokens are on {device}: move it with seq.to(device)")
        if cache is None:
            return self._run(tokens, inputs_embeds, seq, None, return_hidden)
        with cache.atomic():  # a step that raises in layer i must not leave layers < i advanced
            return self._run(tokens, inputs_embeds, seq, cache, return_hidden)

    def _check_inputs(self, tokens: Tensor | None, inputs_embeds: Tensor | None) -> tuple[int, int, torch.device]:
        """(B, T, device) of the input, after checking it against the model."""
        weight = self.tok_emb.weight
        if inputs_embeds is not None:
            if tokens is not None:
                raise ValueError("pass either tokens or inputs_embeds, not both")
            if not isinstance(inputs_embeds, Tensor):
                raise TypeError(f"inputs_embeds must be a tensor, got {type(inputs_embeds).__name__}")
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.cfg.d_model:
                raise ValueError(f"inputs_embeds must have shape (B, T, {self.cfg.d_model}), got {tuple(inputs_embeds.shape)}")
            # No silent cast: float64 embeddings through a float32 model would give float64
            # logits of float32 math (or the reverse); the caller chooses with .to(dtype).
            if inputs_embeds.dtype != weight.dtype:
                raise TypeError(
                    f"inputs_embeds must have the model's dtype {weight.dtype}, got {inputs_embeds.dtype}: "
                    f"cast it with .to({weight.dtype}) or the model with .to({inputs_embeds.dtype})"
                )
            x = inputs_embeds
        else:
            if not isinstance(tokens, Tensor) or tokens.dim() != 2:
                got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
                raise ValueError(f"tokens must have shape (B, T), got {got}")
            if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
                raise TypeError(f"tokens must be an integer tensor of token ids, got {tokens.dtype}")
            x = tokens
        if x.device != weight.device:
            name = "tokens" if inputs_embeds is None else "inputs_embeds"
            raise ValueError(f"{name} are on {x.device} but the model is on {weight.device}")
        if inputs_embeds is None and tokens.numel() and not torch.compiler.is_compiling():
            # Embedding would raise IndexError on CPU and a device-side assert on CUDA.
            low, high = (int(v) for v in torch.aminmax(tokens))
            if low < 0 or high >= self.cfg.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(f"tokens must be in [0, {self.cfg.vocab_size}) (vocab_size), got {bad}")
        return x.shape[0], x.shape[1], x.device

    def _run(
        self,
        tokens: Tensor | None,
        inputs_embeds: Tensor | None,
        seq: SequenceInfo,
        cache: KVCache | None,
        return_hidden: bool,
    ) -> Tensor:
        """The forward proper, on checked inputs."""
        # The per-forward state: one mask description, one EncodingState per encoding module
        # (prepare state, bias), handed to each layer explicitly.
        ctx = AttentionContext.build(seq, causal=self.cfg.causal, cache=cache)
        # Decoding without autograd: each encoding may keep parameter-only work across steps.
        memo = cache is not None and not torch.is_grad_enabled()
        states = [ctx.prepare(pe, cache.prepare_memo.setdefault(i, {}) if memo else None) for i, pe in enumerate(self.encodings)]
        states.append(ctx.prepare(None))  # index -1: no encoding
        # Hybrids: one context per mask kind (sliding window, chunk) and one state per
        # (encoding, kind), each built on first use and shared by the layers of that pair.
        contexts: dict[tuple, AttentionContext] = {}
        layer_states: dict[tuple, EncodingState] = {}
        x = self.drop(self.tok_emb(tokens) if inputs_embeds is None else inputs_embeds)  # (B, T, C)
        embed_at = self._embed_layer()
        for i, block in enumerate(self.blocks):
            if i == embed_at:
                x = self.embed_positions(x, seq, cache)
            j = -1 if self.layer_enc[i] is None else self.layer_enc[i]
            kind = tuple(self.layer_masks[i].items())
            if kind not in contexts:
                contexts[kind] = ctx.local(**self.layer_masks[i])
            if (j, kind) not in layer_states:
                layer_states[(j, kind)] = states[j].under(contexts[kind].mask)
            x = block(x, contexts[kind], layer_states[(j, kind)], cache, i)
        if embed_at == len(self.blocks):
            x = self.embed_positions(x, seq, cache)
        if cache is not None:
            cache.commit(ctx.k_seq, seq.positions.shape[1])
        x = self.ln_f(x)
        return x if return_hidden else self.head(x)

    def new_cache(self, max_length: int | None = None, detach: bool = False) -> KVCache:
        """An empty :class:`KVCache` with one layer per block (see KVCache for the arguments)."""
        latent = range(len(self.blocks)) if self.cfg.mla is not None else ()  # MLA layers cache latents
        return KVCache(len(self.blocks), max_length=max_length, detach=detach, latent_layers=latent)

    @torch.no_grad()
    def generate(self, tokens: Tensor, max_new_tokens: int, seq: SequenceInfo | None = None) -> Tensor:
        """Greedy decoding with the KV cache: (B, T) -> (B, T + max_new_tokens).

        For a left-padded batch pass ``seq = SequenceInfo.from_padding_mask(mask)``.
        """
        if not self.cfg.causal:
            raise ValueError("generate() needs a causal (decoder) model")
        check_int("max_new_tokens", max_new_tokens, minimum=0)
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[1] < 1:
            got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be a (B, T) tensor with T >= 1 (the prompt), got {got}")
        cache = self.new_cache()
        if seq is None:
            seq = SequenceInfo.from_offset(tokens.shape[0], tokens.shape[1], device=tokens.device)
        out = [tokens]
        logits = self(tokens, seq, cache=cache)
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            out.append(nxt)
            if step + 1 < max_new_tokens:
                seq = seq.next(1)
                logits = self(nxt, seq, cache=cache)
        return torch.cat(out, dim=1)

    def num_parameters(self, encodings_only: bool = False) -> int:
        mods = self.encodings if encodings_only else self
        return sum(p.numel() for p in mods.parameters())
