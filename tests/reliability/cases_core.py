"""Core API: positions, the KV cache, the model's forward, attention numerics (issue 10)."""

from __future__ import annotations

import torch

from posenc import Attention, ModelConfig, SequenceInfo, Transformer
from posenc.kv_cache import KVCache
from posenc.masks import AttentionMask
from posenc.model_config import LayerSpec

from . import Case

P, F, K, A = "positions", "forward", "kv cache", "attention"
L = "layer pattern"  # hybrids: per-layer encodings and mask kinds (issue 23)


def _model(n_layer: int = 2, **over) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(**(dict(vocab_size=50, d_model=32, n_head=4, n_layer=n_layer, encoding="rope") | over))
    return Transformer(cfg).eval()


def _tokens(B: int, T: int) -> torch.Tensor:
    return torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(1))


def _cached(model: Transformer, B: int = 2, T: int = 5) -> KVCache:
    cache = model.new_cache()
    with torch.no_grad():
        model(_tokens(B, T), cache=cache)
    return cache


def _continue(model: Transformer, cache: KVCache, *args) -> None:
    with torch.no_grad():
        model(*args, cache=cache)


def _failed_step_undone() -> str:
    """A position past a learned table (rows 0..31) raised before the last layer, after the
    first had appended its keys; the next good step must equal a cache that never saw it."""
    model = _model(n_layer=2, encoding="learned", encoding_config={"max_len": 32}, absolute_before_last=1)
    good = _tokens(2, 1)
    clean, cache = _cached(model), _cached(model)
    with torch.no_grad():
        want = model(good, cache=clean)
        try:
            model(_tokens(2, 1), SequenceInfo.from_offset(2, 1, 40), cache=cache)
        except ValueError:
            pass
        else:
            raise AssertionError("position 40 in a 32-row table did not raise")
        got = model(good, cache=cache)
    lengths = [c.n for c in cache.layers]
    assert torch.equal(got, want) and lengths == [c.n for c in clean.layers]
    return f"the step raised ValueError and left the cache as it was: layers of {lengths} keys, next step exact"


def _float64_attention() -> str:
    attn = Attention(32, 4, impl="eager").double()
    out = attn(torch.randn(1, 4, 32, dtype=torch.float64), SequenceInfo.from_offset(1, 4))
    return f"logits, score terms and output stay {out.dtype}"


def _float_mask_01() -> str:
    s = SequenceInfo.from_padding_mask(torch.tensor([[0.0, 1.0, 1.0]]))
    return f"accepted as 0/1: valid={s.valid.tolist()}, positions={s.positions.tolist()}"


CASES = [
    # ---- positions ------------------------------------------------------------------------
    Case(P, "SequenceInfo.from_offset with a negative int offset", r"^offset must be >= 0, got -1$",
         run=lambda: SequenceInfo.from_offset(2, 4, -1)),
    Case(P, "SequenceInfo.from_offset with a negative tensor offset", r"^offset must be >= 0, got a minimum of -3$",
         run=lambda: SequenceInfo.from_offset(2, 4, torch.tensor([0, -3]))),
    Case(P, "SequenceInfo.from_offset with a float tensor offset", r"^offset tensor must hold integers, got torch.float32$",
         run=lambda: SequenceInfo.from_offset(2, 4, torch.tensor([0.0, 1.5])), error=TypeError),
    Case(P, "SequenceInfo.from_offset(batch='2')", r"^batch must be an int, got str '2'$",
         run=lambda: SequenceInfo.from_offset("2", 4), error=TypeError),
    Case(P, "SequenceInfo.from_offset(length=-1)", r"^length must be >= 0, got -1$",
         run=lambda: SequenceInfo.from_offset(2, -1)),
    Case(P, "from_padding_mask given an additive 0/-inf mask (Hugging Face's extended mask)",
         r"^mask must hold only 0 and 1 \(1 = real token\), got -inf; it looks like an additive attention mask .* pass mask == 0$",
         run=lambda: SequenceInfo.from_padding_mask(torch.tensor([[float("-inf"), 0.0, 0.0]]))),
    Case(P, "from_padding_mask given an integer mask holding 2", r"^mask must hold only 0 and 1 \(1 = real token\), got 2$",
         run=lambda: SequenceInfo.from_padding_mask(torch.tensor([[1, 2]]))),
    Case(P, "from_padding_mask given a float 0/1 mask", r"^accepted as 0/1", run=_float_mask_01, error=None),
    Case(P, "from_cu_seqlens([0, 5.7, 10])", r"^cu_seqlens must hold ints, got 5.7 \(float\) in \[0, 5.7, 10\]$",
         run=lambda: SequenceInfo.from_cu_seqlens([0, 5.7, 10]), error=TypeError),
    Case(P, "from_cu_seqlens given a float tensor", r"^cu_seqlens must be an integer tensor, got torch.float32$",
         run=lambda: SequenceInfo.from_cu_seqlens(torch.tensor([0.0, 5.0, 10.0])), error=TypeError),
    Case(P, "SequenceInfo(positions=<list>)", r"^positions must be a \(B, T\) integer tensor, got list \(convert with torch.as_tensor",
         run=lambda: SequenceInfo(positions=[[0, 1, 2]]), error=TypeError),
    Case(P, "SequenceInfo with a negative position", r"^positions must be >= 0, got a minimum of -1$",
         run=lambda: SequenceInfo(torch.tensor([[0, -1, 2]]))),
    Case(P, "SequenceInfo with float positions", r"^positions must be an integer tensor \(int64 or int32\), got torch.float32$",
         run=lambda: SequenceInfo(torch.zeros(1, 3)), error=TypeError),
    Case(P, "SequenceInfo with valid on another device than positions", r"^valid is on meta but positions are on cpu$",
         run=lambda: SequenceInfo(torch.zeros(1, 2, dtype=torch.long), valid=torch.ones(1, 2, dtype=torch.bool, device="meta"))),
    # ---- forward --------------------------------------------------------------------------
    Case(F, "token id == vocab_size", r"^tokens must be in \[0, 50\) \(vocab_size\), got 50$",
         run=lambda: _model()(torch.tensor([[1, 50, 2]]))),
    Case(F, "a negative token id", r"^tokens must be in \[0, 50\) \(vocab_size\), got -1$",
         run=lambda: _model()(torch.tensor([[1, -1, 2]]))),
    Case(F, "float token tensor", r"^tokens must be an integer tensor of token ids, got torch.float32$",
         run=lambda: _model()(torch.tensor([[1.0, 2.0]])), error=TypeError),
    Case(F, "seq on another device than the tokens", r"^seq is on meta but the tokens are on cpu: move it with seq.to\(device\)$",
         run=lambda: _model()(torch.tensor([[1, 2]]), SequenceInfo(torch.zeros(1, 2, dtype=torch.long, device="meta")))),
    Case(F, "float64 inputs_embeds into a float32 model",
         r"^inputs_embeds must have the model's dtype torch.float32, got torch.float64: cast it",
         run=lambda: _model()(None, inputs_embeds=torch.zeros(1, 3, 32, dtype=torch.float64)), error=TypeError),
    Case(F, "generate with an empty prompt", r"^tokens must be a \(B, T\) tensor with T >= 1 \(the prompt\), got \(1, 0\)$",
         run=lambda: _model().generate(torch.zeros(1, 0, dtype=torch.long), 2)),
    # ---- KV cache -------------------------------------------------------------------------
    Case(K, "continuing a cache with another batch size",
         r"^this KVCache holds a batch of 2 sequences but the new tokens have batch size 3; start a new cache",
         run=lambda: (lambda m: _continue(m, _cached(m), _tokens(3, 1)))(_model())),
    Case(K, "a cache built for fewer layers than the model", r"^cache has 1 layers but the model has 2: build it with model.new_cache\(\)$",
         run=lambda: _model()(_tokens(1, 2), cache=KVCache(1))),
    Case(K, "a cache from a model with other heads", r"^cache layer 0 holds keys of 4 heads x 8 dims \(values 8\) but this attention makes 2 x 16",
         run=lambda: _continue(_model(n_head=2), _cached(_model()), _tokens(2, 1))),
    Case(K, "a step that raises half way (position past a learned table)", r"left the cache as it was",
         run=_failed_step_undone, error=None),
    Case(K, "KVCache(max_length=0)", r"^max_length must be >= 1, got 0$", run=lambda: KVCache(2, max_length=0)),
    Case(K, "KVCache(num_layers=2.0)", r"^num_layers must be an int, got float 2.0$", run=lambda: KVCache(2.0), error=TypeError),
    # ---- attention ------------------------------------------------------------------------
    Case(A, "float64 q/k in eager attention", r"stay torch.float64$", run=_float64_attention, error=None),
    Case(A, "Attention(d_model=32.0)", r"^d_model must be an int, got float 32.0$",
         run=lambda: Attention(32.0, 4), error=TypeError),
    Case(A, "Attention(causal='no')", r"^causal must be a bool, got str 'no'$",
         run=lambda: Attention(32, 4, causal="no"), error=TypeError),
    Case(A, "standalone Attention given x of shape (T, C)", r"^x must have shape \(B, T, 32\), got \(5, 32\)$",
         run=lambda: Attention(32, 4)(torch.randn(5, 32), SequenceInfo.from_offset(1, 5))),
    Case(A, "standalone Attention given x of another width", r"^x must have shape \(B, T, 32\), got \(1, 5, 31\)$",
         run=lambda: Attention(32, 4)(torch.randn(1, 5, 31), SequenceInfo.from_offset(1, 5))),
    Case(A, "AttentionMask.build(window=0)", r"^window must be >= 1, got 0$",
         run=lambda: AttentionMask.build(SequenceInfo.from_offset(1, 4), causal=True, window=0)),
    Case(A, "AttentionMask.build(chunk=8.0)", r"^chunk must be an int, got float 8.0$",
         run=lambda: AttentionMask.build(SequenceInfo.from_offset(1, 4), causal=True, chunk=8.0), error=TypeError),
    # ---- layer pattern ---------------------------------------------------------------------
    Case(L, "LayerSpec(attention='local')", r"^attention must be one of 'global', 'sliding', 'chunked'; got 'local'$",
         run=lambda: LayerSpec("rope", "local", 4)),
    Case(L, "a sliding layer without its window", r"^size must be given for attention='sliding' \(the window in keys\)$",
         run=lambda: LayerSpec("rope", "sliding")),
    Case(L, "a global layer given a size", r"^size must be None for attention='global' \(every key is seen\), got 8$",
         run=lambda: LayerSpec(None, "global", 8)),
    Case(L, "a chunked layer of chunk 0", r"^size must be >= 1, got 0$", run=lambda: LayerSpec("rope", "chunked", 0)),
    Case(L, "a layer pattern longer than n_layer",
         r"^layer_pattern must have 1 to n_layer \(2\) entries \(it repeats over the layers\), got 3$",
         run=lambda: ModelConfig(n_layer=2, layer_pattern=(LayerSpec("rope"),) * 3)),
    Case(L, "layer_pattern together with layer_encodings",
         r"^layer_pattern gives every layer's encoding; layer_encodings must be unset with it",
         run=lambda: ModelConfig(n_layer=2, layer_pattern=(LayerSpec("rope"),), layer_encodings=("rope", None))),
    Case(L, "a layer pattern dict with an unknown key",
         r"^layer_pattern\[0\] takes the keys 'encoding' \(required\), 'attention' and 'size', got 'encoding', 'window'$",
         run=lambda: ModelConfig(n_layer=2, layer_pattern=({"encoding": "rope", "window": 4},))),
    Case(L, "posenc.hybrids.gemma3 with window=0", r"^window must be >= 1, got 0$", run=lambda: _hybrids().gemma3(window=0)),
    Case(L, "posenc.hybrids.gemma3 with a negative global base", r"^global_base must be > 0, got -1.0$",
         run=lambda: _hybrids().gemma3(global_base=-1.0)),
    Case(L, "posenc.hybrids.llama4 with chunk=0", r"^chunk must be >= 1, got 0$", run=lambda: _hybrids().llama4(chunk=0)),    Case(L, "posenc.hybrids.llama4 with an unknown rope encoding", r"^rope: unknown encoding 'ropee'; valid encodings: ",
         run=lambda: _hybrids().llama4(rope="ropee")),
    Case(L, "posenc.hybrids.smollm3 with rope=5",
         r"^rope must be an EncodingSpec, an encoding name, a dict with 'name', or None; got int 5$",
         error=TypeError, run=lambda: _hybrids().smollm3(rope=5)),
    Case(L, "posenc.hybrids.gemma3 with local_base=1", r"^local_base: base must be != 1 .*got 1.0$",
         run=lambda: _hybrids().gemma3(local_base=1.0)),
    Case(L, "posenc.hybrids.llama4 with temperature='no'", r"^temperature must be a bool, got str 'no'$",
         error=TypeError, run=lambda: _hybrids().llama4(temperature="no")),
]


def _hybrids():
    import posenc.hybrids

    return posenc.hybrids
