"""torch.compile of every relative encoding: a tiny model compiles with fullgraph=True and
dynamic lengths, gives the eager result, and mutates no buffer.

Under compile the layouts take the gather path with static (config) bounds, and
Transformer-XL without a clamp its angle-identity form: no shape depends on position values.
"""

from __future__ import annotations

import pytest
import torch

import posenc
from helpers import tiny_model

pytestmark = pytest.mark.compile


def test_every_relative_encoding_compiles():
    names = [n for n in posenc.list_encodings() if posenc.build(n, d_model=32, num_heads=4).family == "relative"]
    assert {"shaw", "relative_key", "relative_key_query", "transformer_xl", "deberta"} <= set(names)
    for name in names:
        torch._dynamo.reset()
        model = tiny_model(name, n_layer=1)  # one layer: compile time is what this test spends
        compiled = torch.compile(model, fullgraph=True, dynamic=True)
        buffers = {n: (b, b._version) for n, b in model.named_buffers()}
        with torch.no_grad():
            for T in (9, 17):
                x = torch.randint(0, 64, (2, T))
                torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")
        assert [n for n, _ in model.named_buffers()] == list(buffers), f"{name}: forward added or removed a buffer"
        for n, b in model.named_buffers():
            assert buffers[n][0] is b and buffers[n][1] == b._version, f"{name}: buffer {n} changed"
