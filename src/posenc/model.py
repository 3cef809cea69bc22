"""A small pre-norm Transformer whose positional setup is declared per layer.

One :class:`ModelConfig` builds a decoder-only language model (``causal=True``) or a
bidirectional encoder (``causal=False``). Shapes: tokens (B, T); hidden (B, T, C).

Positional setup:
* ``encoding`` (an :class:`EncodingSpec` or a name) is used by every layer, unless
  ``layer_encodings`` gives a spec (or None for no encoding) per layer;
* specs with ``shared=True`` that are equal resolve to one module for all their layers, so a
  relative bias table (T5) is one set of parameters computed once per forward;
* ``embed`` hooks (the absolute family) run once: at the input, or, with
  ``absolute_before_last=N``, on the hidden states before the last N layers (DeBERTa's
  enhanced mask decoder).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Attention, AttentionContext, EncodingState, KVCache
from .backends import IMPLS
from .config import check_choice, check_fields, check_int, check_range
from .encoding import PositionalEncoding
from .positions import SequenceInfo
from .registry import build, get_info

__all__ = ["EncodingSpec", "ModelConfig", "Transformer", "preset", "PRESETS"]


def _config_items(config: Any, param: str) -> dict[str, Any]:
    """Encoding parameters given as a mapping or as (key, value) pairs (``to_dict``/JSON form)."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in config):
        keys = [k for k, _ in config]
        dup = sorted({k for k in keys if keys.count(k) > 1}, key=repr)
        if dup:
            raise ValueError(f"{param} gives {', '.join(map(repr, dup))} more than once: {config!r}")
        return dict(config)
    raise TypeError(f"{param} must be a dict of encoding parameters (or (key, value) pairs), "
                    f"got {type(config).__name__} {config!r}")


def _naming(param: str, e: Exception) -> Exception:
    """``e`` with ``param: `` in front of its message (same type), to say which input failed."""
    if type(e) in (TypeError, ValueError) and not str(e).startswith(f"{param}:"):
        return type(e)(f"{param}: {e}")
    return e


@dataclass(frozen=True)
class EncodingSpec:
    """Which encoding a layer uses: its registry name, config, and whether equal specs share.

    Checked on construction: ``name`` must be registered, ``config`` may only hold the
    encoding's parameters (an unknown key lists the valid ones) and is type- and range-checked
    by building the encoding's config. ``config`` is stored as sorted ``(key, value)`` pairs of
    the checked values (a JSON list for a tuple field becomes a tuple), so specs are hashable
    and equal specs compare equal; a mapping is accepted too.
    """

    name: str
    config: tuple[tuple[str, Any], ...] = ()
    shared: bool = True

    def __post_init__(self) -> None:
        info = get_info(self.name)  # a non-str or unknown name lists the valid ones
        if not isinstance(self.shared, bool):
            raise TypeError(f"shared must be a bool, got {type(self.shared).__name__} {self.shared!r}")
        given = _config_items(self.config, "config")
        checked = info.make_config(given)  # unknown keys, wrong types, bad values
        object.__setattr__(self, "config", tuple(sorted((k, getattr(checked, k)) for k in given)))

    @classmethod
    def of(cls, name: str, shared: bool = True, **config: Any) -> "EncodingSpec":
        """``EncodingSpec.of("rope", base=500000.0)``: the parameters as keywords."""
        return cls(name, tuple(config.items()), shared)

    @classmethod
    def coerce(cls, spec: "EncodingSpec | str | dict | None", param: str = "encoding") -> "EncodingSpec | None":
        """A spec from an :class:`EncodingSpec`, a registry name, a dict or None (no encoding).

        A dict has the key ``name`` and optionally ``shared``, ``config`` (a dict of
        parameters) and parameters at the top level: ``{"name": "rope", "base": 5e5}``.
        Errors start with ``param`` (the argument that held the spec).
        """
        if spec is None or isinstance(spec, EncodingSpec):
            return spec
        try:
            if isinstance(spec, str):
                return cls(spec)
            if isinstance(spec, Mapping):
                return cls._from_dict(dict(spec))
        except (TypeError, ValueError) as e:
            raise _naming(param, e) from None
        raise TypeError(f"{param} must be an EncodingSpec, an encoding name, a dict with 'name', or None; "
                        f"got {type(spec).__name__} {spec!r}")

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> "EncodingSpec":
        if "name" not in d:
            raise ValueError(f"a dict needs the key 'name' (the encoding's registry name); got keys: "
                             f"{', '.join(map(repr, d)) or 'none'}")
        name, shared = d.pop("name"), d.pop("shared", True)
        info = get_info(name)
        config = _config_items(d.pop("config", None), "config")
        for k in d:
            if (err := info.renamed_key_error(k, d[k])) is not None:
                raise err
        unknown = [k for k in d if k not in info.config_keys]
        if unknown:
            raise TypeError(
                f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for encoding {name!r}; "
                f"an encoding dict takes name, shared, config and the encoding's parameters: "
                f"{', '.join(info.config_keys) or 'none'}"
            )
        both = sorted(set(config) & set(d))
        if both:
            raise ValueError(f"{', '.join(map(repr, both))} given both in config and at the top level")
        return cls(name, tuple((config | d).items()), shared)


@dataclass
class ModelConfig:
    """Configuration of :class:`Transformer` (all sizes in tokens or channels).

    Checked on construction: every field's type from its annotation (``causal="no"`` is a
    ``TypeError``), then ranges, then every layer's encoding spec and config are built, so an
    unknown encoding key or a bad encoding value fails here, naming ``encoding``,
    ``encoding_config`` or ``layer_encodings[i]``. ``encoding_config=None`` means no overrides.
    """

    vocab_size: int = 256
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None
    d_ff: int | None = None  # default 4 * d_model
    causal: bool = True  # decoder LM; False: bidirectional encoder
    dropout: float = 0.0
    encoding: EncodingSpec | str | dict = "rope"
    # Merged into `encoding`'s parameters; None = no overrides (stored as {}).
    encoding_config: dict[str, Any] | None = field(default_factory=dict)
    share_encoding: bool = True
    layer_encodings: tuple[EncodingSpec | str | dict | None, ...] | None = None
    absolute_before_last: int | None = None
    attn_impl: str = "sdpa"  # attention backend: eager | sdpa | flex | auto (posenc.backends)
    tie_weights: bool = True

    def __post_init__(self) -> None:
        if self.encoding_config is None:
            self.encoding_config = {}
        # Types from the annotations first (causal="no" is a TypeError, not a truthy str; a
        # list for layer_encodings is stored as a tuple), then the ranges below.
        check_fields(self)
        check_int("vocab_size", self.vocab_size, minimum=1)
        check_int("d_model", self.d_model, minimum=1)
        check_int("n_layer", self.n_layer, minimum=1)
        check_int("n_head", self.n_head, minimum=1)
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head is not None:
            check_int("n_kv_head", self.n_kv_head, minimum=1)
            if self.n_head % self.n_kv_head:
                raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.d_ff is not None:
            check_int("d_ff", self.d_ff, minimum=1)
        check_range("dropout", self.dropout, 0.0, 1.0, high_inclusive=False)
        check_choice("attn_impl", self.attn_impl, IMPLS)
        if self.absolute_before_last is not None:
            check_int("absolute_before_last", self.absolute_before_last, minimum=0)
            if self.absolute_before_last > self.n_layer:
                raise ValueError(
                    f"absolute_before_last must be <= n_layer ({self.n_layer}), got {self.absolute_before_last}"
                )
        if self.layer_encodings is not None:
            if len(self.layer_encodings) != self.n_layer:
                raise ValueError(
                    f"layer_encodings must have n_layer ({self.n_layer}) entries, got {len(self.layer_encodings)}"
                )
            if self.encoding_config:
                raise ValueError(
                    "encoding_config applies to `encoding`, which layer_encodings replaces; put the "
                    f"parameters in each layer's spec, got encoding_config={self.encoding_config!r}"
                )
        # Eager: every spec's encoding config is built here, so a bad name, key, type or value
        # fails at ModelConfig(...), not later at Transformer(...).
        self.layer_specs()

    def layer_specs(self) -> list[EncodingSpec | None]:
        """The checked :class:`EncodingSpec` (or None) of every layer."""
        if self.layer_encodings is not None:
            return [EncodingSpec.coerce(s, f"layer_encodings[{i}]") for i, s in enumerate(self.layer_encodings)]
        base = EncodingSpec.coerce(self.encoding, "encoding")
        if base is None:  # pragma: no cover - check_fields refuses encoding=None
            raise TypeError("encoding must not be None; use 'none' for no positional encoding")
        try:
            spec = EncodingSpec(base.name, dict(base.config) | self.encoding_config, base.shared and self.share_encoding)
        except (TypeError, ValueError) as e:
            raise _naming("encoding_config", e) from None
        return [spec] * self.n_layer

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=32, n_layer=2, n_head=4),
    "small": dict(d_model=128, n_layer=4, n_head=4),
    "base": dict(d_model=512, n_layer=6, n_head=8),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named model size (exact names only: ``tiny``, ``small``, ``base``) with overrides."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = [k for k in overrides if k not in fields]
    if unknown:
        raise TypeError(f"unknown ModelConfig field {', '.join(map(repr, unknown))}; valid fields: {', '.join(fields)}")
    return ModelConfig(**(PRESETS[name] | overrides))


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
        self.attn = Attention(cfg.d_model, cfg.n_head, cfg.n_kv_head, causal=cfg.causal, impl=cfg.attn_impl)
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
        for spec in cfg.layer_specs():
            if spec is None:
                layer_enc.append(None)
                continue
            if spec.shared and spec in shared:
                layer_enc.append(shared[spec])
                continue
            encodings.append(build(spec.name, d_model=cfg.d_model, num_heads=cfg.n_head, **dict(spec.config)))
            if spec.shared:
                shared[spec] = len(encodings) - 1
            layer_enc.append(len(encodings) - 1)
        # The model owns the encodings (once each, however many layers share one); layer i
        # uses encodings[layer_enc[i]] (None: no encoding), passed to it in every forward.
        self.encodings = nn.ModuleList(encodings)
        self.layer_enc = layer_enc
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

    def _apply_embed(self, x: Tensor, seq: SequenceInfo, cache: KVCache | None) -> Tensor:
        for i, pe in enumerate(self.encodings):
            if pe.has_embed:
                state = None if cache is None else cache.embed_state.setdefault(i, {})
                x = pe.embed(x, seq, state)
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
        no_encoding = ctx.prepare(None)
        x = self.drop(self.tok_emb(tokens) if inputs_embeds is None else inputs_embeds)  # (B, T, C)
        embed_at = self._embed_layer()
        for i, block in enumerate(self.blocks):
            if i == embed_at:
                x = self._apply_embed(x, seq, cache)
            j = self.layer_enc[i]
            x = block(x, ctx, no_encoding if j is None else states[j], cache, i)
        if embed_at == len(self.blocks):
            x = self._apply_embed(x, seq, cache)
        if cache is not None:
            cache.commit(ctx.k_seq, seq.positions.shape[1])
        x = self.ln_f(x)
        return x if return_hidden else self.head(x)

    def new_cache(self, max_length: int | None = None, detach: bool = False) -> KVCache:
        """An empty :class:`KVCache` with one layer per block (see KVCache for the arguments)."""
        return KVCache(len(self.blocks), max_length=max_length, detach=detach)

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
