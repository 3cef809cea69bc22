"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with
Rotary Position Embedding").

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), positions (B, T); r = rotary_dim <= D.

Each rotated pair j of q at position m turns by m * theta_j, theta_j = base^(-2j/r), and so
does k at position n; then q_m . k_n depends on m - n only. Channels r.. pass through
unchanged (partial rotary, GPT-NeoX). The frequencies may be rescaled for longer contexts by
a rope type from :data:`posenc.rotary.SCALINGS` (linear, NTK, dynamic NTK, YaRN, Llama 3,
LongRoPE), chosen in the config or swapped later with :meth:`RotaryEmbedding.set_scaling`.

Numerics: the frequencies are float64 Python-side tensors, not module buffers, so
``module.to(torch.bfloat16)`` cannot round them; angles are float64, the cos/sin tables
float32, and the rotation is float32 arithmetic rounded once to the input dtype.

torch.compile: in eager mode cos/sin come from a table cache that grows as needed. Inside a
compiled graph the cache is neither read nor written: cos/sin are computed from the
positions (the same float64 formula the tables are built with), and the current length of
length-dependent scalings is a tensor, so ``torch.compile(model, fullgraph=True,
dynamic=True)`` traces without graph breaks, host syncs or mutated state.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from collections.abc import Callable, MutableMapping
from typing import Any, Hashable

import torch
from torch import Tensor

from ..config import EncodingConfig, check_choice, check_even, check_positive, field_types
from ..encoding import Dims, PositionalEncoding
from ..limits import check_positions
from ..literature import SU
from ..registry import register
from .angles import angles_cos_sin
from .functional import KERNELS, QKTables, rotate_qk
from .kernels import half_rolled_tables
from .layout import LAYOUTS
from .scaling import SCALINGS, all_scaling_params, base_inv_freq, make_scaling_config
from .scaling.schema import ScalingConfig

__all__ = ["PositionTable", "RotaryConfig", "RotaryEmbedding", "RotaryState", "TableRows"]

# Cos/sin tables are built for positions [0, 2^k); past this many positions angles are
# computed per token instead (a 2^18 x 32 table pair is 64 MiB).
MAX_TABLE_POSITIONS = 1 << 18
_MAX_TABLES = 4  # cached (device, frequency set) pairs per module


@dataclass(eq=False)
class PositionTable:
    """A rotary module's per-position columns (:meth:`RotaryEmbedding.table_columns`) at
    positions [0, P), (P, r/2) float32 each, in pairs (cos, sin), for one device and frequency
    set, packed side by side in one (P, width) tensor so that a forward looks every row up in
    one gather. On CPU the packed rows also hold each pair's rolled form ``[cos | cos]``,
    ``[-sin | sin]`` (r wide, see :func:`~posenc.rotary.kernels.half_rolled_tables`), which
    the rotation of a small step on CPU reads (:func:`~posenc.rotary.functional.rotation_plan`)
    instead of building it every step."""

    packed: Tensor  # (P, width)
    widths: tuple[int, ...]  # of the columns, then of the rolled pairs (if held)
    n_columns: int

    @classmethod
    def of(cls, columns: tuple[Tensor, ...]) -> "PositionTable":
        parts = list(columns)
        if columns[0].device.type == "cpu":
            parts += [t[0, 0] for c, s in zip(columns[0::2], columns[1::2]) for t in half_rolled_tables(c[None], s[None])]
        return cls(torch.cat(parts, dim=-1), tuple(t.shape[-1] for t in parts), len(columns))

    @classmethod
    def covering(cls, store: MutableMapping, key: Hashable, hi: int,
                 columns: Callable[[Tensor], tuple[Tensor, ...]], device: torch.device) -> "PositionTable":
        """``store[key]`` if it holds position ``hi``, else a new table of the next power of two
        past ``hi`` rows (at least 64), ``columns(torch.arange(size))``, put in ``store[key]``.
        ``hi`` < :data:`MAX_TABLE_POSITIONS` is the caller's to check."""
        table = store.get(key)
        if table is None or table.positions <= hi:
            size = max(64, 1 << hi.bit_length())  # next power of two > hi
            table = store[key] = cls.of(columns(torch.arange(size, device=device)))
        return table

    @property
    def positions(self) -> int:
        return self.packed.shape[0]

    def rows(self, positions: Tensor, hi: int) -> "TableRows":
        """The rows at ``positions`` (B|1, T), every one < P (``hi``, their largest, checked by the caller)."""
        B, T = positions.shape
        # index_select: a plain row gather, cheaper than advanced indexing; the parts are views.
        parts = self.packed.index_select(0, positions.reshape(-1)).view(B, 1, T, -1).split(self.widths, dim=-1)
        n = self.n_columns
        return TableRows(tuple(t.squeeze(1) for t in parts[:n]), hi, parts[n:] or None)  # (B|1, T, r/2); (B|1, 1, T, r)


@dataclass(eq=False)
class TableRows:
    """Table columns at some positions, (B|1, T, r/2) each. ``hi``: the largest position (None
    under torch.compile). ``rolled``: the rolled pair of each (cos, sin) pair of columns,
    (B|1, 1, T, r) each, when the table holds them (:class:`PositionTable` on CPU), what
    :class:`~posenc.rotary.functional.QKTables` takes as ``rolled`` (None: it builds them
    from the columns when it needs them)."""

    columns: tuple[Tensor, ...]
    hi: int | None = None
    rolled: tuple[Tensor, ...] | None = None


@dataclass(frozen=True)
class RotaryState:
    """Per-forward rotary state: cos/sin (B|1, Tq, r/2) float32 at the query positions, for
    the frequencies of ``seq_len`` (None unless the scaling depends on the length).

    It rotates q and the keys new in this forward, which sit at the query positions
    (self-attention): ``tables`` holds cos/sin for both, with their rolled form made once
    for every layer when the rotation plan takes it (a decoding step on CPU)."""

    seq_len: int | Tensor | None
    cos: Tensor
    sin: Tensor
    tables: QKTables


@dataclass(init=False, eq=False)
class RotaryConfig(EncodingConfig):
    """Config of :class:`RotaryEmbedding`.

    Attributes:
        base: theta_j = base^(-2j/r); > 0 and != 1. 10000 (RoFormer), 500000 (Llama 3).
        rotary_dim: r, the rotated channels per head (even, <= head_dim); None = head_dim.
        layout: "half" (GPT-NeoX / HF rotate_half) or "interleaved" (GPT-J / Meta / RoFormer).
        scaling: rope type, a key of :data:`~posenc.rotary.SCALINGS`.
        kernel: "auto" (compiled for large inputs when torch.compile works, else eager),
            "eager" or "compiled"; see :mod:`posenc.rotary.functional`.

    The scaling's parameters are keywords beside these fields, exactly the fields of that
    type's config (``SCALINGS[scaling].params``; a parameter of another type is an error
    listing the ones it takes)::

        RotaryConfig(scaling="yarn", factor=4.0, original_max_position_embeddings=2048)

    They are checked by the type's config and held, typed, in :attr:`scaling_config`; each
    reads back as an attribute (``config.factor``; None for a parameter the type does not
    take). A new scaling type adds its parameters here by being registered, with no edit to
    this class. (``dataclasses.replace`` sees only the fields above: use :meth:`with_scaling`
    or :meth:`replace`.)
    """

    base: float = 10000.0
    rotary_dim: int | None = None
    layout: str = "half"
    scaling: str = "default"
    kernel: str = "auto"

    def __init__(self, **params: Any) -> None:
        for f in dataclasses.fields(self):
            if f.init:
                setattr(self, f.name, params.pop(f.name, f.default))
        known = set(all_scaling_params())
        unknown = [k for k in params if k not in known]
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unknown parameter(s) {', '.join(map(repr, unknown))}; valid: "
                f"{', '.join(self.config_keys())}"
            )
        self._scaling_params = params  # checked (and typed) by validate()
        self.__post_init__()

    @classmethod
    def config_keys(cls) -> tuple[str, ...]:
        """Every keyword the config takes: its fields, then every registered scaling parameter."""
        return tuple(field_types(cls)) + all_scaling_params()

    def validate(self) -> None:
        check_positive("base", self.base)
        if self.base == 1.0:
            raise ValueError("base must be != 1 (every pair would rotate at the same rate), got 1.0")
        if self.rotary_dim is not None:
            check_even("rotary_dim", self.rotary_dim)
        if self.layout == "halves":  # sinusoidal's old spelling
            raise ValueError("layout must be one of 'half', 'interleaved'; got 'halves' (spelled 'half' now)")
        check_choice("layout", self.layout, LAYOUTS)
        check_choice("kernel", self.kernel, KERNELS)
        given = {k: v for k, v in self._scaling_params.items() if v is not None}  # None: the type's default
        self.scaling_config: ScalingConfig = make_scaling_config(self.scaling, **given)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: a scaling parameter reads from scaling_config.
        cfg = self.__dict__.get("scaling_config")
        if cfg is not None and not name.startswith("_") and name in all_scaling_params():
            return getattr(cfg, name, None)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def scaling_params(self) -> dict[str, Any]:
        """The scaling parameters that were given (not None), as the scaling config stores them."""
        return {k: getattr(self.scaling_config, k) for k, v in self._scaling_params.items() if v is not None}

    def with_scaling(self, rope_type: str, **params: Any) -> "RotaryConfig":
        """A copy with another scaling and its parameters (the old parameters are dropped)."""
        return type(self)(**(self._fields() | {"scaling": rope_type} | params))

    def replace(self, **changes: Any) -> "RotaryConfig":
        """A copy with ``changes`` applied to the fields and scaling parameters (kept unless changed)."""
        return type(self)(**(self._fields() | self.scaling_params() | changes))

    def to_dict(self) -> dict[str, Any]:
        """The fields and the given scaling parameters: ``RotaryConfig(**d)`` rebuilds it."""
        return self._fields() | self.scaling_params()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # mutable, like every dataclass config with eq

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"


@register(
    "rope",
    family="rotary",
    summary="rotary position embedding: q, k pairs rotated by m*theta (2 layouts, partial, every SCALINGS entry)",
    paper="Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding",
    claims={
        "absolute": (True, SU + ": encodes absolute position with a rotation"),
        "relative": (True, SU + ", eq. 16"),
        "linear_map": (True, SU + ": R_{p+k} = R_k R_p"),
        "bounded": (True, SU + ": rotations preserve norms"),
        "decay": (True, SU + ", §3.4.3"),
        "extrapolation": (True, "defined at every position (quality beyond L is the bench's question)"),
        "linear_attention": (True, SU + ", §3.3"),
    },
)
class RotaryEmbedding(PositionalEncoding):
    """RoPE as a ``rotate`` hook. See the module docstring; build with ``posenc.build("rope", ...)``,
    or from a Hugging Face config with :func:`posenc.rotary.from_hf`; :meth:`to_hf` writes it back.

    >>> rope = posenc.build("rope", d_model=512, num_heads=8, scaling="yarn", factor=4.0,
    ...                     original_max_position_embeddings=2048)
    >>> q, k = rope.rotate(q, k, q_pos, k_pos)
    """

    Config = RotaryConfig

    def __init__(self, config: RotaryConfig, dims: Dims) -> None:
        super().__init__(config, dims)
        r = dims.head_dim if config.rotary_dim is None else config.rotary_dim
        check_even("rotary_dim" if config.rotary_dim is not None else "head_dim (the default rotary_dim)", r)
        if r > dims.head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim ({dims.head_dim}), got {r}")
        self.rotary_dim = r
        self._base_inv_freq = base_inv_freq(r, config.base)  # (r/2,) float64, CPU: not a buffer
        self._cache: OrderedDict[Hashable, PositionTable] = OrderedDict()
        self._set_scaling_config(config.scaling_config)

    # ---- frequencies -------------------------------------------------------------------
    def _set_scaling_config(self, scfg: ScalingConfig) -> None:
        self._scaling_cfg = scfg
        self._scaling_fn = SCALINGS[self.config.scaling].fn
        freqs = self.frequencies()  # fail now on a parameter that only the rotary dim can check
        # A scaling that does not depend on the length has one set of frequencies: computed here,
        # once per scaling (a decoding step then only looks its cos/sin up).
        self._fixed = None if scfg.length_dependent else (*freqs, self._freq_key(*freqs))
        self._cache.clear()

    def set_scaling(self, rope_type: str, **params: Any) -> None:
        """Swap the frequency scaling in place, e.g. to evaluate a model trained with plain
        RoPE at a longer length with a training-free scaling::

            model.encodings[0].set_scaling("yarn", factor=4.0, original_max_position_embeddings=512)

        Parameters not given take the type's defaults (the old ones are dropped).
        """
        new = self.config.with_scaling(rope_type, **params)  # validates
        old = (self.config, self._scaling_cfg, self._scaling_fn)
        self.config = new
        try:
            self._set_scaling_config(new.scaling_config)
        except Exception:  # a parameter only the rotary dim can check: keep the old scaling
            self.config, self._scaling_cfg, self._scaling_fn = old
            raise

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        """(inv_freq (r/2,) float64, attention_factor) for sequences of length ``seq_len``."""
        return self._scaling_fn(self._base_inv_freq, self._scaling_cfg, base=self.config.base, seq_len=seq_len)

    @property
    def inv_freq(self) -> Tensor:
        """theta_j after scaling, (r/2,) float64 (at seq_len=None for length-dependent types)."""
        return self.frequencies()[0]

    @property
    def attention_factor(self) -> float:
        """Multiplier of cos and sin (so of rotated q and k; logits get its square)."""
        return self.frequencies()[1]

    # ---- cos/sin -----------------------------------------------------------------------
    @staticmethod
    def _freq_key(inv_freq: Tensor, factor: float) -> Hashable:
        return tuple(inv_freq.tolist()), factor  # no numpy: the core needs torch alone

    def current_length(self, q_pos: Tensor, k_pos: Tensor) -> int | Tensor | None:
        """n = max position + 1 over q and k, for length-dependent scalings (None otherwise).

        One length for q and k, so both use the same frequencies. Under torch.compile a 0-dim
        tensor (an int would be a host sync and a graph break).
        """
        if not self._scaling_cfg.length_dependent or k_pos.numel() == 0:
            return None
        n = torch.maximum(q_pos.max(), k_pos.max()) + 1
        return n if torch.compiler.is_compiling() else int(n)

    def cos_sin(self, positions: Tensor, seq_len: int | Tensor | None = None) -> tuple[Tensor, Tensor]:
        """cos and sin (B or 1, T, r/2) float32 at integer ``positions`` (B, T).

        Eager: looked up in a table for positions [0, P) cached per device and frequency set;
        the table grows (to the next power of two) when a position reaches its end, and
        positions past ``MAX_TABLE_POSITIONS`` are computed per token: nothing is ever read past
        the end. Under torch.compile: computed from the positions (no table, no state touched;
        negative positions are not checked there, as that would need a host sync).
        ``seq_len`` (default max position + 1) selects the frequencies of length-dependent types.
        """
        return self.rows(positions, seq_len).columns  # type: ignore[return-value]

    #: How many columns :meth:`table_columns` returns.
    table_width = 2

    def table_columns(self, positions: Tensor, inv_freq: Tensor, factor: float) -> tuple[Tensor, ...]:
        """What the tables hold at integer ``positions`` (any shape), pairs of (..., r/2) float32:
        RoPE's cos and sin (times the attention factor). A subclass with other per-position
        columns (xPos: q's and k's scaled pairs) overrides this; the cache and lookup are shared."""
        return angles_cos_sin(positions, inv_freq, factor)

    def rows(self, positions: Tensor, seq_len: int | Tensor | None = None) -> "TableRows":
        """:meth:`table_columns` at integer ``positions`` (B, T), as :class:`TableRows` (B|1, T, r/2),
        looked up in the cached table (see :meth:`cos_sin`), with their rolled form on demand."""
        if positions.dim() != 2:
            raise ValueError(f"positions must have shape (B, T), got {tuple(positions.shape)}")
        if positions.is_floating_point():
            raise TypeError(f"positions must be integers, got {positions.dtype}")
        if positions.shape[0] > 1 and positions.stride(0) == 0:
            positions = positions[:1]  # the same row for the whole batch (from_offset): look it up once
        if torch.compiler.is_compiling():
            if seq_len is None and self._scaling_cfg.length_dependent:
                seq_len = self.current_length(positions, positions)
            return TableRows(self.table_columns(positions, *self.frequencies(seq_len)))
        if positions.numel() == 0:
            z = torch.zeros(*positions.shape, self.rotary_dim // 2, device=positions.device)
            return TableRows((z,) * self.table_width)
        hi = check_positions(positions)  # float64 angles: every integer up to 2**53 - 1, no further
        if seq_len is None:
            seq_len = hi + 1
        if self._fixed is not None:
            inv_freq, factor, freq_key = self._fixed
        else:
            inv_freq, factor = self.frequencies(seq_len)
            freq_key = None if hi >= MAX_TABLE_POSITIONS else self._freq_key(inv_freq, factor)
        if hi >= MAX_TABLE_POSITIONS:
            return TableRows(self.table_columns(positions, inv_freq, factor), hi=hi)
        key = (positions.device.type, positions.device.index, freq_key)
        table = PositionTable.covering(self._cache, key, hi, lambda p: self.table_columns(p, inv_freq, factor),
                                       positions.device)
        self._cache.move_to_end(key)
        while len(self._cache) > _MAX_TABLES:
            self._cache.popitem(last=False)
        return table.rows(positions, hi)  # hi < P checked above

    # ---- the hook ----------------------------------------------------------------------
    def prepare(self, q_pos: Tensor, k_pos: Tensor) -> RotaryState:
        """cos/sin at the query positions, once per forward for every layer that shares this
        module. In self-attention the new keys sit at the query positions, so ``rotate`` uses
        the same tables for k; ``k_pos`` (all keys, cache included) is not rotated here."""
        seq_len = self.current_length(q_pos, q_pos)
        rows = self.rows(q_pos, seq_len)
        cos, sin = rows.columns
        return RotaryState(seq_len, cos, sin, QKTables.shared(cos, sin, rolled=rows.rolled))

    def rotate(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, state: RotaryState | None = None
    ) -> tuple[Tensor, Tensor]:
        """Rotate q (B, H, Tq, D) at q_pos (B, Tq) and k (B, Hkv, Tk, D) at k_pos (B, Tk).

        ``state``: :meth:`prepare`'s result for this forward, for keys at the query positions
        (self-attention: ``k_pos`` is then ``q_pos``); None makes q's and k's tables here,
        at one length for both (length-dependent scalings). The way to rotate is
        :func:`~posenc.rotary.functional.rotation_plan`'s.
        """
        if state is None:
            seq_len = self.current_length(q_pos, k_pos)
            tables = QKTables(*self.cos_sin(q_pos, seq_len), *self.cos_sin(k_pos, seq_len))
        else:
            if k.shape[-2] != state.cos.shape[-2]:
                raise ValueError(
                    f"state is prepare()'s, for keys at the {state.cos.shape[-2]} query positions, but k has "
                    f"{k.shape[-2]}; pass state=None for keys at other positions"
                )
            tables = state.tables
        return rotate_qk(q, k, tables, self.config.layout, self.config.kernel)

    def extra_repr(self) -> str:
        c = self.config
        parts = [f"rotary_dim={self.rotary_dim}", f"base={c.base}", f"layout={c.layout!r}", f"scaling={c.scaling!r}"]
        parts += [f"{k}={v!r}" for k, v in c.scaling_params().items()]
        return ", ".join(parts)

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face config entries of this RoPE (``rope_parameters`` and the top-level
        keys it needs); see :func:`posenc.rotary.to_hf`."""
        from .hf_write import to_hf  # hf_write imports this module

        return to_hf(self)
