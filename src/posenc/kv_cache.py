"""The KV cache: each layer's rotated keys and values, kept across decoding steps.

Shapes: k, v (B, Hkv, T, D); a latent layer's c_kv (B, T, R) and k_pe (B, T, r). Time is
dim -2 of every cached tensor. :class:`LayerCache` holds one layer's keys and values in
buffers that grow by doubling; :class:`LatentCache` is the slot of a multi-head latent
attention layer (:mod:`posenc.mla`): its normalised latents and its one rotated key slice;
:class:`KVCache` holds the layers, the keys' :class:`~posenc.positions.SequenceInfo`, the
stream counter and the encodings' decoding state (per encoding module for ``embed`` and
``prepare_cached``; per layer for ``terms``).
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
from torch import Tensor

from .config import check_int
from .positions import SequenceInfo

__all__ = ["KVCache", "LatentCache", "LayerCache"]


def _writable(t: Tensor) -> bool:
    """Whether ``t`` may be written in place now: an inference tensor (made under
    ``torch.inference_mode()``) may not be outside inference mode."""
    return not t.is_inference() or torch.is_inference_mode_enabled()


class LayerCache:
    """Keys and values of one layer, (B, Hkv, T, D), after rotation.

    Stored in buffers with spare capacity along T (dim -2) that double when full, so appending
    one decoded token writes one slot instead of copying the whole cache (amortized O(1) per
    token, not O(T)). ``k``/``v`` are views of the filled part.
    """

    def __init__(self) -> None:
        self.kbuf: Tensor | None = None
        self.vbuf: Tensor | None = None
        self.n = 0

    @property
    def k(self) -> Tensor | None:
        return None if self.kbuf is None else self.kbuf[..., : self.n, :]

    @property
    def v(self) -> Tensor | None:
        return None if self.vbuf is None else self.vbuf[..., : self.n, :]

    def set(self, k: Tensor, v: Tensor) -> None:
        """Replace the contents (the sliding-memory and autograd paths)."""
        self.kbuf, self.vbuf, self.n = k, v, k.shape[-2]

    def _check_batch(self, batch: int) -> None:
        if batch != self.kbuf.shape[0]:
            raise ValueError(
                f"batch size changed from {self.kbuf.shape[0]} to {batch} during decoding: a KVCache holds one "
                "batch; start a new cache (model.new_cache()) for another batch size"
            )

    def check(self, k: Tensor, v: Tensor, layer: int) -> None:
        """Raise ``ValueError`` unless k, v (B, Hkv, t, D) continue what this layer holds."""
        if self.kbuf is None:
            return
        self._check_batch(k.shape[0])
        (_, H, _, D), Dv = self.kbuf.shape, self.vbuf.shape[-1]
        if (k.shape[1], k.shape[3], v.shape[3]) != (H, D, Dv):
            raise ValueError(
                f"cache layer {layer} holds keys of {H} heads x {D} dims (values {Dv}) but this "
                f"attention makes {k.shape[1]} x {k.shape[3]} (values {v.shape[3]}): the cache was "
                "built for another model"
            )

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, Hkv, t, D) after the filled part, growing capacity by doubling.

        Buffers filled under ``torch.inference_mode()`` are copied into new ones on the first
        append outside it (a prefill in inference mode, decoding under ``no_grad``)."""
        need = self.n + k.shape[-2]
        buf = self.kbuf
        if (
            buf is None or need > buf.shape[-2] or buf.dtype != k.dtype or buf.device != k.device
            or not (_writable(buf) and _writable(self.vbuf))
        ):
            cap = max(need, 2 * (0 if buf is None else buf.shape[-2]), 16)
            kbuf = k.new_empty(*k.shape[:-2], cap, k.shape[-1])  # (B, Hkv, capacity, D)
            vbuf = v.new_empty(*v.shape[:-2], cap, v.shape[-1])
            if self.n:
                kbuf[..., : self.n, :] = self.k
                vbuf[..., : self.n, :] = self.v
            self.kbuf, self.vbuf = kbuf, vbuf
        self.kbuf[..., self.n : need, :] = k
        self.vbuf[..., self.n : need, :] = v
        self.n = need
        return self.k, self.v


class LatentCache(LayerCache):
    """One multi-head latent attention layer's slot (:mod:`posenc.mla`, DeepSeek-V2 §2.1):
    ``latent`` (B, T, R), the normalised compressed latents c_kv, and ``k_pe`` (B, T, r), the
    rotated key slice every head shares: R + r numbers per token, where a :class:`LayerCache`
    of the expanded keys and values would hold H·(D + Dv).

    The buffers (``kbuf`` the latents, ``vbuf`` the key slices) grow by doubling along T and
    leave inference mode as :class:`LayerCache`'s do; :class:`KVCache` makes one for each of
    its ``latent_layers``.
    """

    @property
    def latent(self) -> Tensor | None:
        return self.k

    @property
    def k_pe(self) -> Tensor | None:
        return self.v

    def check(self, latent: Tensor, k_pe: Tensor, layer: int) -> None:
        """Raise ``ValueError`` unless latent (B, t, R) and k_pe (B, t, r) continue this slot."""
        if latent.dim() != 3 or k_pe.dim() != 3:
            raise ValueError(
                f"cache layer {layer} holds latents (B, T, R) and key slices (B, T, r) of multi-head latent "
                f"attention, got tensors of shapes {tuple(latent.shape)} and {tuple(k_pe.shape)}: build the "
                f"cache with latent_layers naming only the MLA layers (model.new_cache() does)"
            )
        if self.kbuf is None:
            return
        self._check_batch(latent.shape[0])
        if (latent.shape[-1], k_pe.shape[-1]) != (self.kbuf.shape[-1], self.vbuf.shape[-1]):
            raise ValueError(
                f"cache layer {layer} holds latents of {self.kbuf.shape[-1]} and key slices of {self.vbuf.shape[-1]} "
                f"dims but this attention makes {latent.shape[-1]} and {k_pe.shape[-1]}: the cache was built for "
                "another model"
            )


class KVCache:
    """Cache for incremental decoding and Transformer-XL style segment memory.

    Args:
        num_layers: one :class:`LayerCache` per layer.
        max_length: keep at most this many past tokens (a sliding memory); None keeps all.
        detach: store keys/values without gradient (Transformer-XL's memory).
        latent_layers: the layers of multi-head latent attention (:mod:`posenc.mla`), whose
            slot is a :class:`LatentCache` (latents and one shared key slice per token).

    ``seq`` holds the positions/segments/validity of the cached tokens (shared by all layers);
    ``embed_state`` is where stateful ``embed`` hooks (recurrent, convolutional) keep context;
    ``prepare_memo`` where ``prepare_cached`` hooks keep what they computed from parameters and
    positions alone (Transformer-XL's projected distance rows), one dict per encoding module;
    ``layer_state(i)`` where a layer's ``terms`` hook keeps per-key state of the cached tokens
    (FoX's prefix sums of log forget gates: each layer has its own gates), one dict per layer.
    Those entries assume the weights do not change while the cache is in use (one decoding run,
    without autograd); start a new cache after changing them.

    A cache may be filled under ``torch.inference_mode()`` and continued under ``no_grad`` or
    with autograd: keys and values are then copied out of inference tensors on their next
    append, and :meth:`atomic` (every model step) drops the memo entries made in inference mode
    (``prepare_cached`` recomputes them) and copies the embed hooks' and layers' inference
    tensors. With ``detach``, the layers' state is detached at ``commit`` like the keys.
    """

    def __init__(
        self, num_layers: int, max_length: int | None = None, detach: bool = False, *, latent_layers: Iterable[int] = ()
    ) -> None:
        check_int("num_layers", num_layers, minimum=1)
        if max_length is not None:
            check_int("max_length", max_length, minimum=1)
        if not isinstance(detach, bool):
            raise TypeError(f"detach must be a bool, got {type(detach).__name__} {detach!r}")
        latent = set()
        for i in latent_layers:
            check_int("latent_layers entry", i, minimum=0, maximum=num_layers - 1)
            latent.add(i)
        self.layers = [LatentCache() if i in latent else LayerCache() for i in range(num_layers)]
        self.max_length = max_length
        self.detach = detach
        self.seq: SequenceInfo | None = None
        self.seen = 0  # tokens processed so far (stream index of the next token)
        self.embed_state: dict = {}
        self.prepare_memo: dict = {}
        self.layer_states: list[dict] = [{} for _ in range(num_layers)]

    def layer_state(self, layer: int) -> dict:
        """Layer ``layer``'s dict for its encoding's per-key state (entries replaced, never
        written in place)."""
        if not 0 <= layer < len(self.layers):
            raise ValueError(f"layer must be in [0, {len(self.layers) - 1}] for a cache of {len(self.layers)} layers, got {layer}")
        return self.layer_states[layer]

    @property
    def batch_size(self) -> int | None:
        """Rows of the cached batch, or None while the cache is empty."""
        return None if self.seq is None else self.seq.positions.shape[0]

    def check_batch(self, batch: int) -> None:
        """Raise ``ValueError`` unless a step of ``batch`` rows may continue this cache."""
        if self.batch_size is not None and self.batch_size != batch:
            raise ValueError(
                f"this KVCache holds a batch of {self.batch_size} sequences but the new "
                f"tokens have batch size {batch}; start a new cache (model.new_cache()) for another batch"
            )

    def _leave_inference_mode(self) -> None:
        """Outside inference mode, make the decoding state writable again (see the class docstring)."""
        if torch.is_inference_mode_enabled():
            return
        # a tensor, or a value object of tensors that says so the same way (PaTH's CarriedKeys)
        frozen = lambda x: callable(getattr(x, "is_inference", None)) and x.is_inference()  # noqa: E731
        for memo in self.prepare_memo.values():
            if any(frozen(x) or isinstance(x, tuple) and any(map(frozen, x)) for x in memo.values()):
                memo.clear()
        for state in (*self.embed_state.values(), *self.layer_states):
            for key, x in state.items():
                if frozen(x):
                    state[key] = x.clone()

    @contextlib.contextmanager
    def atomic(self) -> Iterator["KVCache"]:
        """All or nothing: if the body raises, the cache is put back exactly as it was.

        A forward writes each layer's keys in turn; one that fails half way (a position past a
        learned table, in layer 2 of 4) would otherwise leave layers of different lengths, and
        the next, correct step would attend to a stale half-step. Appended slots are undone by
        resetting each layer's length (writes past it are never read); replaced tensors (the
        sliding-memory path) and the embed hooks' state entries are put back from references
        (both are replaced, never written where an earlier entry reads: FLOATER's codes grow a
        buffer past the rows the earlier entry holds, as the layers' keys do).
        """
        self._leave_inference_mode()
        layers = [(c, c.kbuf, c.vbuf, c.n) for c in self.layers]
        states = [(key, d, dict(d)) for key, d in self.embed_state.items()]
        per_layer = [dict(d) for d in self.layer_states]
        seq, seen = self.seq, self.seen
        try:
            yield self
        except BaseException:
            for c, kbuf, vbuf, n in layers:
                c.kbuf, c.vbuf, c.n = kbuf, vbuf, n
            self.embed_state.clear()
            for key, d, content in states:
                d.clear()
                d.update(content)
                self.embed_state[key] = d
            for d, content in zip(self.layer_states, per_layer):
                d.clear()
                d.update(content)
            self.seq, self.seen = seq, seen
            raise

    @property
    def length(self) -> int:
        return 0 if self.seq is None else self.seq.positions.shape[1]

    def keys_info(self, new: SequenceInfo) -> tuple[SequenceInfo, Tensor, Tensor]:
        """(k_seq, q_index, k_index) for a step adding ``new`` tokens; does not modify the cache."""
        device = new.positions.device
        t_new = new.positions.shape[1]
        q_index = torch.arange(self.seen, self.seen + t_new, device=device)
        k_index = torch.arange(self.seen - self.length, self.seen + t_new, device=device)
        if self.seq is None:
            return new, q_index, k_index
        self.check_batch(new.positions.shape[0])
        old = self.seq
        if (old.segment_ids is None) != (new.segment_ids is None) or (old.valid is None) != (new.valid is None):
            raise ValueError("a cached batch and its continuation must both have (or lack) segment_ids and valid")
        if old.num_axes != new.num_axes:
            raise ValueError(
                f"the cached tokens carry {old.num_axes} position axes but the new ones {new.num_axes}: "
                "continue with cache.seq.next(T) or give the new tokens the same axes"
            )
        cat = lambda a, b, dim=1: None if a is None else torch.cat([a, b], dim=dim)  # noqa: E731
        k_seq = SequenceInfo.from_checked(
            cat(old.positions, new.positions), cat(old.segment_ids, new.segment_ids), cat(old.valid, new.valid),
            cat(old.axes, new.axes, dim=2),
        )
        return k_seq, q_index, k_index

    def commit(self, k_seq: SequenceInfo, t_new: int) -> None:
        """Record the step's key info (after all layers updated)."""
        keep = self._keep(k_seq.positions.shape[1])
        cut = lambda t: None if t is None else t[..., -keep:]  # noqa: E731
        self.seq = SequenceInfo.from_checked(cut(k_seq.positions), cut(k_seq.segment_ids), cut(k_seq.valid), cut(k_seq.axes))
        self.seen += t_new
        if self.detach:
            for d in self.layer_states:
                d.update({key: x.detach() for key, x in d.items() if isinstance(x, Tensor)})

    def _keep(self, total: int) -> int:
        return total if self.max_length is None else min(total, self.max_length)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's k, v to layer ``layer``; return all keys/values to attend to."""
        if not 0 <= layer < len(self.layers):
            raise ValueError(f"layer must be in [0, {len(self.layers) - 1}] for a cache of {len(self.layers)} layers, got {layer}")
        c = self.layers[layer]
        c.check(k, v, layer)
        tracked = torch.is_grad_enabled() and (k.requires_grad or v.requires_grad)
        if self.max_length is None and not tracked:
            return c.append(k, v)
        # Sliding memory, or keys that carry gradient (in-place writes would break autograd).
        if c.kbuf is not None:
            k, v = torch.cat([c.k, k], dim=-2), torch.cat([c.v, v], dim=-2)
        keep = self._keep(k.shape[-2])
        ck, cv = k[..., -keep:, :], v[..., -keep:, :]
        c.set(ck.detach(), cv.detach()) if self.detach else c.set(ck, cv)
        return k, v
