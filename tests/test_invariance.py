"""Invariances every registered encoding must satisfy (parametrized over the registry).

* KV-cache decoding equals one full forward;
* a packed batch equals each sequence alone; a padded batch equals the unpadded sequences;
* the eager and SDPA attention paths agree;
* gradients are right (gradcheck, float64).
"""

from __future__ import annotations

import pytest
import torch

from posenc import SequenceInfo
from helpers import all_encodings, all_hybrids, tiny_model

ENCODINGS = all_encodings()
MODELS = ENCODINGS + all_hybrids()  # every encoding, then the named NoPE/RoPE hybrids (posenc.hybrids)
V = 64


@pytest.mark.parametrize("name", MODELS)
def test_kv_cache_matches_full_forward(name):
    model = tiny_model(name, n_kv_head=2)
    tokens = torch.randint(0, V, (2, 13))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        parts = [model(tokens[:, :5], cache=cache)]
        for t in range(5, 9):
            parts.append(model(tokens[:, t : t + 1], cache=cache))
        parts.append(model(tokens[:, 9:], cache=cache))
    inc = torch.cat(parts, dim=1)
    torch.testing.assert_close(inc, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", MODELS)
def test_packed_equals_separate(name, causal):
    model = tiny_model(name, causal=causal)
    lengths = [5, 7, 4]
    seqs = [torch.randint(0, V, (1, n)) for n in lengths]
    cu = torch.tensor([0, 5, 12, 16])
    with torch.no_grad():
        packed = model(torch.cat(seqs, dim=1), SequenceInfo.from_cu_seqlens(cu))
        alone = torch.cat([model(s) for s in seqs], dim=1)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", MODELS)
def test_padded_equals_unpadded(name, causal, side):
    model = tiny_model(name, causal=causal)
    a, b = torch.randint(0, V, (1, 9)), torch.randint(0, V, (1, 5))
    pad = torch.zeros(1, 4, dtype=torch.long)
    if side == "left":
        batch = torch.cat([a, torch.cat([pad, b], 1)])
        mask = torch.tensor([[1] * 9, [0] * 4 + [1] * 5], dtype=torch.bool)
    else:
        batch = torch.cat([a, torch.cat([b, pad], 1)])
        mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4], dtype=torch.bool)
    with torch.no_grad():
        out = model(batch, SequenceInfo.from_padding_mask(mask))
        ra, rb = model(a), model(b)
    torch.testing.assert_close(out[0:1], ra, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1:2][mask[1:2]], rb[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_left_padded_generation_matches_unpadded(name):
    model = tiny_model(name)
    a, b = torch.randint(0, V, (1, 7)), torch.randint(0, V, (1, 4))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], 1)])
    mask = torch.tensor([[1] * 7, [0] * 3 + [1] * 4], dtype=torch.bool)
    out = model.generate(batch, 5, SequenceInfo.from_padding_mask(mask))
    torch.testing.assert_close(out[0:1, 7:], model.generate(a, 5)[:, 7:])
    torch.testing.assert_close(out[1:2, 7:], model.generate(b, 5)[:, 4:])


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", MODELS)
def test_eager_matches_sdpa(name, causal, plans):
    # The sdpa model must not take the eager leaf: that would compare eager with itself.
    from posenc.backends import Leaf

    torch.manual_seed(0)
    fast = tiny_model(name, causal=causal, impl="sdpa", n_kv_head=2)
    slow = tiny_model(name, causal=causal, impl="eager", n_kv_head=2)
    slow.load_state_dict(fast.state_dict())
    tokens = torch.randint(0, V, (2, 11))
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, :3] = False
    seq = SequenceInfo.from_padding_mask(mask)
    with torch.no_grad():
        got = fast(tokens), fast(tokens, seq)
        taken = {p.leaf for p in plans}  # the sdpa model's calls only
        want = slow(tokens), slow(tokens, seq)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert taken and Leaf.EAGER not in taken, f"the sdpa model took the eager leaf: {taken}"


@pytest.mark.parametrize("name", ENCODINGS)
def test_gradcheck(name):
    model = tiny_model(name, dtype=torch.float64, d_model=8, n_head=2, n_layer=1, impl="eager")
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    params = {n: p for n, p in model.named_parameters() if n.startswith("encodings.")}
    names = list(params)

    def f(x, *ps):
        out = torch.func.functional_call(model, dict(zip(names, ps)), (None,), {"inputs_embeds": x, "return_hidden": True})
        return out

    inputs = (x, *[p.detach().clone().requires_grad_(True) for p in params.values()])
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)


@pytest.mark.parametrize("name", ENCODINGS)
def test_config_rejects_nan_and_inf(name):
    import dataclasses

    from posenc import get_info

    cfg_cls = get_info(name).config_cls
    for f in dataclasses.fields(cfg_cls):
        if isinstance(f.default, float):
            for bad in (float("nan"), float("inf")):
                with pytest.raises(ValueError, match=f.name):
                    cfg_cls(**{f.name: bad})


@pytest.mark.parametrize("name", ENCODINGS)
def test_config_rejects_unknown_key(name):
    from posenc import build

    with pytest.raises(TypeError):
        build(name, d_model=32, num_heads=4, not_a_parameter=1)
