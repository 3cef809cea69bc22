"""dynamic_bias: the MLP-of-distance bias against a slow loop over its formula and against
x-transformers' ``DynamicPositionBias`` on the same weights."""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.relative.dynamic_bias import DynamicPositionBias

F64 = torch.float64


def _enc(**config) -> DynamicPositionBias:
    torch.manual_seed(0)
    enc = posenc.build("dynamic_bias", d_model=32, num_heads=4, **config)
    with torch.no_grad():  # non-trivial LayerNorm gains and biases
        for p in enc.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return enc


def _slow_bias(enc: DynamicPositionBias, h: int, d: int) -> float:
    """The formula on one distance, in Python floats: Linear, [LayerNorm], SiLU per layer, then row h."""
    x = [math.copysign(math.log1p(abs(d)), d) if enc.config.log_distance else float(d)]
    for i, lin in enumerate(enc.linears):
        W, b = lin.weight.tolist(), lin.bias.tolist()
        x = [sum(W[o][k] * x[k] for k in range(len(x))) + b[o] for o in range(len(W))]
        if enc.config.norm:
            ln = enc.norms[i]
            mean = sum(x) / len(x)
            var = sum((v - mean) ** 2 for v in x) / len(x)
            gain = ln.weight.tolist()
            shift = [0.0] * len(x) if ln.bias is None else ln.bias.tolist()
            x = [(v - mean) / math.sqrt(var + ln.eps) * g + s for v, g, s in zip(x, gain, shift)]
        x = [v / (1.0 + math.exp(-v)) for v in x]  # SiLU
    W, b = enc.out.weight.tolist(), enc.out.bias.tolist()
    return sum(W[h][k] * x[k] for k in range(len(x))) + b[h]


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("log_distance", [False, True])
def test_dense_bias_equals_slow_loop_over_the_formula(log_distance, norm):
    enc = _enc(width=5, depth=2, log_distance=log_distance, norm=norm).to(F64)
    for q_pos, k_pos in (
        (torch.arange(0, 7)[None], torch.arange(0, 7)[None]),  # Toeplitz path
        (torch.tensor([[0, 1, 2, 0, 1, 9]]), torch.tensor([[0, 1, 2, 0, 1, 9]])),  # all pairs (packed)
    ):
        dense = enc.logit_bias().dense(q_pos, k_pos)[0]
        slow = torch.tensor([[[_slow_bias(enc, h, int(i - j)) for j in k_pos[0]] for i in q_pos[0]]
                             for h in range(4)], dtype=F64)
        torch.testing.assert_close(dense, slow, atol=1e-12, rtol=1e-12)


def test_bias_is_toeplitz_and_defined_far_beyond_training():
    enc = _enc(log_distance=True)
    near = enc.logit_bias().dense(torch.arange(8)[None], torch.arange(8)[None])
    far = enc.logit_bias().dense(torch.arange(10**6, 10**6 + 8)[None], torch.arange(10**6, 10**6 + 8)[None])
    torch.testing.assert_close(far, near, atol=1e-6, rtol=1e-6)
    long = enc.logit_bias().dense(torch.tensor([[5000]]), torch.tensor([[0, 2500, 5000]]))
    assert long.isfinite().all() and long[0, :, 0, 0].ne(long[0, :, 0, 1]).all()


def test_default_width_is_a_quarter_of_d_model_like_x_transformers():
    assert posenc.build("dynamic_bias", d_model=64, num_heads=4).width == 16
    assert posenc.build("dynamic_bias", d_model=2, num_heads=2).width == 1


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("log_distance", [False, True])
def test_parity_with_x_transformers(log_distance, norm):
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(3)
    peer = xt.DynamicPositionBias(8, heads=4, depth=3, log_distance=log_distance, norm=norm)
    with torch.no_grad():
        for p in peer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    enc = posenc.build("dynamic_bias", d_model=32, num_heads=4, width=8, depth=3, log_distance=log_distance, norm=norm)
    ps = peer.state_dict()
    mine = {}
    for i in range(3):
        mine[f"linears.{i}.weight"], mine[f"linears.{i}.bias"] = ps[f"mlp.{i}.0.weight"], ps[f"mlp.{i}.0.bias"]
        if norm:
            mine[f"norms.{i}.weight"] = ps[f"mlp.{i}.1.gamma" if i == 0 else f"mlp.{i}.1.weight"]
            if i > 0:
                mine[f"norms.{i}.bias"] = ps[f"mlp.{i}.1.bias"]
    mine["out.weight"], mine["out.bias"] = ps["mlp.3.weight"], ps["mlp.3.bias"]
    enc.load_state_dict(mine, strict=True)
    for i, j in ((9, 9), (3, 12)):  # queries are the last i of j keys
        want = peer(i, j)  # (H, i, j)
        got = enc.logit_bias().dense(torch.arange(j - i, j)[None], torch.arange(j)[None])[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_gradients_reach_every_parameter():
    enc = _enc(norm=True)
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    enc.logit_bias().dense(pos, pos).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())


@pytest.mark.parametrize("key,value,error,match", [
    ("width", 0, ValueError, r"^width must be in \[1, 4096\], got 0$"),
    ("width", 4097, ValueError, r"^width must be in \[1, 4096\], got 4097$"),
    ("depth", 0, ValueError, r"^depth must be in \[1, 16\], got 0$"),
    ("depth", 17, ValueError, r"^depth must be in \[1, 16\], got 17$"),
    ("log_distance", "yes", TypeError, "log_distance"),
])
def test_config_refuses_bad_values_by_name(key, value, error, match):
    with pytest.raises(error, match=match):
        posenc.build("dynamic_bias", d_model=32, num_heads=4, **{key: value})


def test_decoding_reads_the_bias_from_a_table_kept_per_cache():
    """A cached decoding step reads MLP(d) from a per-cache (H, 2n + 1) table (made once, n
    doubled when a step reaches past it), equal to the bias the full forward computes, and the
    decoded logits equal the full forward's."""
    torch.manual_seed(1)
    model = posenc.Transformer(posenc.ModelConfig(encoding="dynamic_bias", d_model=32, n_head=4, n_layer=2,
                                                  vocab_size=50, encoding_config={"log_distance": True})).to(F64)
    tokens = torch.randint(0, 50, (2, 150))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :40], cache=cache)]
        n_first = cache.prepare_memo[0]["dynamic_bias_table"][0]
        for t in range(40, 150):
            steps.append(model(tokens[:, t : t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=1e-12)
    n, table = cache.prepare_memo[0]["dynamic_bias_table"]
    assert n_first == 64 and n == 256  # made at the prompt, doubled at reaches 65 and 129
    enc = model.encodings[0]
    d = torch.arange(-n, n + 1)
    want = enc.logit_bias().all_pairs(d[None], torch.zeros(1, 1, dtype=torch.long))[0, :, :, 0]  # (H, 2n + 1)
    torch.testing.assert_close(table, want, atol=0, rtol=0)


def test_decoding_at_sparse_positions_runs_the_mlp_per_key():
    """Positions far apart (reach beyond four times the keys): no table of every distance is
    made; the step equals the full forward."""
    torch.manual_seed(2)
    model = posenc.Transformer(posenc.ModelConfig(encoding="dynamic_bias", d_model=32, n_head=4, n_layer=1,
                                                  vocab_size=50)).to(F64)
    tokens = torch.randint(0, 50, (1, 6))
    pos = torch.tensor([[0, 1000, 2000, 3000, 4000, 5000]])
    with torch.no_grad():
        full = model(tokens, posenc.SequenceInfo(pos))
        cache = model.new_cache()
        model(tokens[:, :5], posenc.SequenceInfo(pos[:, :5]), cache=cache)
        step = model(tokens[:, 5:], posenc.SequenceInfo(pos[:, 5:]), cache=cache)
    torch.testing.assert_close(step, full[:, 5:], atol=1e-12, rtol=1e-12)
    assert "dynamic_bias_table" not in cache.prepare_memo[0]
