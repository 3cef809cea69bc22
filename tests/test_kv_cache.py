"""The KV cache: a step that raises leaves it exactly as it was, and a cache that cannot
continue (another batch size, layer count or model shape) is refused before any layer runs.

The atomicity tests run a good prefix, a failing step, then a good step, and compare the
logits with a fresh cache that never saw the failing step: exact equality (same operations
on the same numbers), since a half-applied step shows as a 1e-2 logit difference.
"""

from __future__ import annotations

import pytest
import torch

from posenc import ModelConfig, SequenceInfo, Transformer
from posenc.kv_cache import KVCache
from helpers import all_encodings, tiny_model

V = 64


def _tokens(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def _layer_state(cache: KVCache) -> list:
    """Everything a later step reads: each layer's filled keys/values, the key info, the
    stream counter and the embed hooks' state (copied, so later writes cannot alias)."""
    seq = cache.seq
    info = None if seq is None else [None if t is None else t.clone() for t in (seq.positions, seq.segment_ids, seq.valid)]
    layers = [(c.n, None if c.k is None else c.k.clone(), None if c.v is None else c.v.clone()) for c in cache.layers]
    states = {i: dict(d) for i, d in cache.embed_state.items()}
    return [layers, info, cache.seen, states]


def _assert_same_state(a: list, b: list) -> None:
    (la, ia, sa, ea), (lb, ib, sb, eb) = a, b
    assert len(la) == len(lb) and sa == sb
    for (na, ka, va), (nb, kb, vb) in zip(la, lb):
        assert na == nb
        assert (ka is None) == (kb is None)
        if ka is not None:
            assert torch.equal(ka, kb) and torch.equal(va, vb)
    assert (ia is None) == (ib is None)
    if ia is not None:
        for x, y in zip(ia, ib):
            assert (x is None and y is None) or torch.equal(x, y)
    assert ea.keys() == eb.keys()
    for i in ea:
        assert ea[i].keys() == eb[i].keys()
        for key in ea[i]:
            x, y = ea[i][key], eb[i][key]
            # a tensor equal in value, or a value object equal by its own == (floater's rows)
            assert x is y or (torch.equal(x, y) if torch.is_tensor(x) else x == y), (i, key)


def _check_failed_step_is_undone(model, prefix, bad_step, good, *, max_length=None):
    """Prefix, a step that raises (``bad_step(cache)``), then ``good``: the same logits and
    cache as prefix then ``good`` on a fresh cache."""
    with torch.no_grad():
        clean = model.new_cache(max_length=max_length)
        model(prefix, cache=clean)
        want = model(good, cache=clean)

        cache = model.new_cache(max_length=max_length)
        model(prefix, cache=cache)
        before = _layer_state(cache)
        with pytest.raises((ValueError, RuntimeError)) as err:
            bad_step(cache)
        _assert_same_state(_layer_state(cache), before)
        got = model(good, cache=cache)
    assert torch.equal(got, want)
    _assert_same_state(_layer_state(cache), _layer_state(clean))
    return err.value


def test_position_past_learned_table_mid_model_is_undone():
    """Learned positions enter before the last layer (absolute_before_last=1): layer 0 has
    appended its keys when the table lookup of position 40 (rows 0..31) raises."""
    model = tiny_model("learned", n_layer=3, absolute_before_last=1, encoding_config={"max_len": 32})
    prefix = _tokens(2, 6)
    far = SequenceInfo.from_offset(2, 2, 40)
    err = _check_failed_step_is_undone(
        model, prefix, lambda c: model(_tokens(2, 2, 1), far, cache=c), _tokens(2, 3, 2)
    )
    assert "40" in str(err)


class _Boom(RuntimeError):
    pass


ENCODINGS = all_encodings()
# Sliding memory replaces tensors instead of writing slots: checked for one encoding per hook
# kind with decoding state (embed state, rotated keys, content scores).
SLIDING = ["recurrent", "convolutional", "rope", "shaw"]


def test_registry_is_not_empty():
    assert len(ENCODINGS) >= 10 and set(SLIDING) <= set(ENCODINGS)


@pytest.mark.parametrize(
    "name, max_length",
    [(n, None) for n in ENCODINGS] + [(n, 8) for n in SLIDING],
    ids=[f"{n}-append" for n in ENCODINGS] + [f"{n}-sliding" for n in SLIDING],
)
def test_fault_in_a_late_layer_is_undone(name, max_length, monkeypatch):
    """A fault injected in the last layer, after the embed hook updated its decoding state
    and every earlier layer appended (or, with a sliding memory, replaced) its keys."""
    model = tiny_model(name, n_layer=3)
    prefix, good = _tokens(2, 7), _tokens(2, 2, 2)
    last = model.blocks[-1]
    real = last.forward
    armed = {"on": False}

    def forward(*args, **kwargs):
        if armed["on"]:
            raise _Boom("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(last, "forward", forward)

    def bad(cache):
        armed["on"] = True
        try:
            model(_tokens(2, 3, 1), cache=cache)
        finally:
            armed["on"] = False

    err = _check_failed_step_is_undone(model, prefix, bad, good, max_length=max_length)
    assert isinstance(err, _Boom)


def test_sequence_info_of_bad_shape_leaves_cache_untouched():
    model = tiny_model("rope")
    with torch.no_grad():
        cache = model.new_cache()
        model(_tokens(2, 5), cache=cache)
        before = _layer_state(cache)
        with pytest.raises(ValueError, match="positions have shape"):
            model(_tokens(2, 2), SequenceInfo.from_offset(2, 3, 5), cache=cache)
        _assert_same_state(_layer_state(cache), before)


def test_other_batch_size_is_refused_before_any_layer():
    model = tiny_model("rope")
    with torch.no_grad():
        cache = model.new_cache()
        model(_tokens(2, 5), cache=cache)
        before = _layer_state(cache)
        with pytest.raises(ValueError, match=r"holds a batch of 2 sequences but the new tokens have batch size 3"):
            model(_tokens(3, 1), cache=cache)
        # The same with explicit positions (the offset is then not derived from the cache).
        with pytest.raises(ValueError, match=r"batch of 2 .* batch size 1"):
            model(_tokens(1, 1), SequenceInfo.from_offset(1, 1, 5), cache=cache)
        _assert_same_state(_layer_state(cache), before)


def test_cache_for_fewer_layers_is_refused():
    model = tiny_model("rope", n_layer=3)
    with pytest.raises(ValueError, match=r"cache has 2 layers but the model has 3"):
        model(_tokens(1, 4), cache=KVCache(2))
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        model(_tokens(1, 4), cache={})


def test_cache_of_another_model_shape_is_refused():
    small = tiny_model("none", n_head=4)  # keys of 4 heads x 8 dims
    other = tiny_model("none", n_head=2)  # 2 heads x 16 dims, same width and depth
    with torch.no_grad():
        cache = small.new_cache()
        small(_tokens(1, 4), cache=cache)
        before = _layer_state(cache)
        with pytest.raises(ValueError, match=r"cache layer 0 holds keys of 4 heads x 8 dims .* makes 2 x 16"):
            other(_tokens(1, 1), cache=cache)
        _assert_same_state(_layer_state(cache), before)


def test_update_checks_layer_index():
    cache = KVCache(2)
    with pytest.raises(ValueError, match=r"layer must be in \[0, 1\] for a cache of 2 layers, got 2"):
        cache.update(2, torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4))


def test_cache_of_another_model_from_config():
    """A cache built by a deeper model: refused by layer count, with the counts named."""
    deep = Transformer(ModelConfig(vocab_size=V, d_model=32, n_head=4, n_layer=4, encoding="rope"))
    shallow = Transformer(ModelConfig(vocab_size=V, d_model=32, n_head=4, n_layer=2, encoding="rope"))
    with pytest.raises(ValueError, match=r"cache has 4 layers but the model has 2"):
        shallow(_tokens(1, 3), cache=deep.new_cache())


def test_default_continuation_follows_a_padded_prompt():
    """Without ``seq``, a step continues each cached row (``cache.seq.next``): a left-padded
    prompt's rows continue from their own last position, valid, as generate does."""
    model = tiny_model("rope")
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    seq = SequenceInfo.from_padding_mask(mask)
    prompt, nxt = _tokens(2, 5), _tokens(2, 2, 1)
    with torch.no_grad():
        a, b = model.new_cache(), model.new_cache()
        model(prompt, seq, cache=a)
        model(prompt, seq, cache=b)
        got = model(nxt, cache=a)
        want = model(nxt, seq.next(2), cache=b)
    assert torch.equal(got, want)
    assert a.seq.positions.tolist() == [[0, 0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6]]


def test_an_empty_first_step_then_a_real_step_equals_the_full_forward():
    model = tiny_model("rope")
    tokens = torch.randint(0, 64, (2, 6))
    cache = model.new_cache()
    with torch.no_grad():
        empty = model(tokens[:, :0], cache=cache)
        got = model(tokens, cache=cache)
        want = model(tokens)
    assert empty.shape == (2, 0, 64)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


# ---- a cache crosses inference_mode, no_grad and autograd ------------------------------------------
MODES = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
    "grad": lambda: torch.enable_grad(),
}
# A prompt and four decoding steps, each under another mode (and back).
STEPS = [(4, "inference_mode"), (1, "no_grad"), (2, "grad"), (1, "inference_mode"), (1, "grad"), (1, "no_grad")]


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
@pytest.mark.parametrize("name", all_encodings())
def test_decoding_across_grad_modes_equals_the_full_forward(name, impl, monkeypatch):
    """A cache filled under torch.inference_mode() continues under no_grad and with autograd
    (and back), for every encoding and backend, and gives the full forward's logits. flex runs
    uncompiled; on CPU it has no backward, so its grad-enabled steps run with frozen weights."""
    from posenc.backends import flex

    monkeypatch.setattr(flex, "COMPILE", False)
    model = tiny_model(name, impl=impl, dtype=torch.float64, n_kv_head=2)
    if impl == "flex" and model.encodings[0].has_value_terms:
        pytest.skip("flex cannot apply value terms (refused by the plan, tests/test_backends.py)")
    if impl == "flex":
        model.requires_grad_(False)
    T = sum(n for n, _ in STEPS)
    tokens = _tokens(2, T, seed=3)
    with torch.no_grad():
        want = model(tokens)
    cache, parts, t = model.new_cache(), [], 0
    for n, mode in STEPS:
        with MODES[mode]():
            out = model(tokens[:, t : t + n], cache=cache)
            assert torch.is_grad_enabled() == (mode == "grad")
        if mode == "grad" and impl != "flex":
            assert out.requires_grad
            out.sum().backward()  # the step's graph is usable
        parts.append(out.detach().clone())
        t += n
    torch.testing.assert_close(torch.cat(parts, dim=1), want, atol=1e-10, rtol=1e-10)
