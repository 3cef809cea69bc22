"""fire: the MLP of the normalised distance against a slow loop over the paper's formula, forward
and backward; the piecewise-linear form equals the MLP; positions in any layout; progressive
interpolation; bad parameters named."""

from __future__ import annotations

import pytest
import torch

from posenc import build

from bias_reference import K_POS, Q_POS, bias64, check_against_reference


def test_fire_against_reference():
    enc, bias = bias64("fire", mlp_width=5, init_L=6.0)

    def ref(b, h, i, j):
        qi, kj = int(Q_POS[b, i]), int(K_POS[b, j])
        c = enc.c.abs()
        L = (enc.L_multiplier * 6.0).abs()
        x = torch.log(1 + c * abs(qi - kj)) / (torch.log(1 + c * torch.maximum(torch.tensor(float(qi), dtype=torch.float64), L)) + 1e-6)
        out = enc.fc2.bias[h]
        for k in range(5):
            out = out + enc.fc2.weight[h, k] * torch.relu(enc.fc1.weight[k, 0] * x + enc.fc1.bias[k])
        return out

    check_against_reference(enc, bias, ref)


def test_fire_piecewise_linear_mlp_matches_the_mlp_everywhere():
    # score_bias evaluates f_theta as slopes/intercepts per piece between the units' knots.
    # Compare with the MLP written out, on a grid holding every knot exactly, points beside
    # them, and far outside; units with w1 < 0, w1 = 0 (b1 > 0 and b1 < 0) included.
    torch.manual_seed(1)
    enc = build("fire", d_model=12, num_heads=3, mlp_width=7).double()
    with torch.no_grad():
        enc.fc1.weight[2, 0] = 0.0
        enc.fc1.bias[2] = 0.4
        enc.fc1.weight[3, 0] = 0.0
        enc.fc1.bias[3] = -0.2
        enc.fc1.weight[4, 0] = -abs(enc.fc1.weight[4, 0])
    w1, b1 = enc.fc1.weight[:, 0], enc.fc1.bias
    knots = torch.stack([-b1[k] / w1[k] for k in range(7) if w1[k] != 0])
    x = torch.cat([knots, knots - 1e-3, knots + 1e-3, torch.linspace(-5, 5, 101, dtype=torch.float64)])
    want = torch.stack(
        [
            torch.stack([enc.fc2.bias[h] + sum(enc.fc2.weight[h, k] * torch.relu(w1[k] * xi + b1[k]) for k in range(7))
                         for h in range(3)])
            for xi in x
        ]
    )  # (N, H)
    sorted_knots, slopes, intercepts = enc.mlp_pieces(torch.float64)
    piece = torch.searchsorted(sorted_knots, x)
    got = slopes[piece] * x[:, None] + intercepts[piece]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_fire_contiguous_positions_past_the_threshold_against_reference():
    # The model's default positions (one shared row), queries on both sides of L = 6.
    enc = build("fire", d_model=12, num_heads=3, mlp_width=5, init_L=6.0).double()
    pos = torch.arange(13)[None]
    bias = enc.score_bias(pos, pos)[0]  # (H, T, T)
    c, L = enc.c.abs(), (enc.L_multiplier * 6.0).abs()
    for i in range(13):
        for j in range(13):
            x = torch.log1p(c * abs(i - j)) / (torch.log1p(c * torch.clamp(L, min=float(i))) + 1e-6)
            want = enc.mlp(x)  # (H,): the MLP itself, on this one input
            torch.testing.assert_close(bias[:, i, j], want, atol=1e-12, rtol=1e-12)


def _layouts(pos: torch.Tensor) -> dict[str, torch.Tensor]:
    """``pos`` (B, T) in three non-contiguous layouts with the same values."""
    return {
        "transposed": pos.t().contiguous().t(),
        "strided": torch.stack([pos, pos], -1)[..., 0],
        "expanded": pos[:1].expand_as(pos) if bool((pos == pos[:1]).all()) else pos.t().contiguous().t(),
    }


@pytest.mark.parametrize("side", ["query", "key", "both"])
@pytest.mark.parametrize("layout", ["transposed", "strided", "expanded"])
def test_fire_pairs_take_positions_in_any_layout(layout, side):
    """FIRE's per-pair bias (forward and every parameter's gradient) with query and/or key
    positions given as a non-contiguous tensor equals the result for contiguous ones (its
    forward and backward called ``.view`` on the normalised distances, which follow the
    positions' strides)."""
    torch.manual_seed(0)
    enc = build("fire", d_model=12, num_heads=3, init_L=3.0).double()
    q_pos = torch.tensor([[0, 3, 4, 5, 6, 11], [2, 5, 5, 9, 20, 21]])
    k_pos = torch.tensor([[0, 1, 5, 6, 7, 8], [0, 2, 3, 4, 5, 6]])
    if layout == "expanded":  # equal rows, so that the batch can be a stride-0 expand
        q_pos, k_pos = q_pos[:1].repeat(2, 1), k_pos[:1].repeat(2, 1)
    q_odd = _layouts(q_pos)[layout] if side in ("query", "both") else q_pos
    k_odd = _layouts(k_pos)[layout] if side in ("key", "both") else k_pos
    assert not (q_odd.is_contiguous() and k_odd.is_contiguous())
    params = list(enc.parameters())
    want = enc.logit_bias().all_pairs(q_pos, k_pos)
    got = enc.logit_bias().all_pairs(q_odd, k_odd)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    w = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad((got * w).sum(), params), torch.autograd.grad((want * w).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-13, rtol=0)


def test_fire_non_finite_threshold_is_named():
    enc = build("fire", d_model=8, num_heads=2)
    pos = torch.arange(5)[None]
    for value in (float("nan"), float("inf"), float("-inf")):
        with torch.no_grad():
            enc.L_multiplier.fill_(value)
        with pytest.raises(ValueError, match=r"^FIRE's threshold L = \|L_multiplier \* init_L\| must be finite"):
            enc.logit_bias().dense(pos, pos)


def test_fire_pairs_function_equals_its_definition():
    # FireBias.all_pairs (one x per pair, a per-piece scatter in backward, x recomputed) against
    # BiasTerm.all_pairs on the same fn (gather per head, autograd): values and every
    # parameter's gradient, with queries before and at L (a tie of max(L, i)), keys after
    # their query, per-row positions and a unit with w1 = 0.
    from posenc.terms import BiasTerm

    torch.manual_seed(3)
    enc = build("fire", d_model=12, num_heads=3, mlp_width=6, init_L=5.0).double()
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if n != "L_multiplier":
                p.normal_()
        enc.fc1.weight[1, 0] = 0.0
    q_pos = torch.tensor([[0, 3, 4, 5, 6, 11], [2, 5, 5, 9, 20, 21]])
    k_pos = torch.tensor([[0, 1, 5, 6, 7, 8, 30], [0, 2, 3, 4, 5, 6, 22]])
    fast = enc.logit_bias().all_pairs(q_pos, k_pos)
    slow = BiasTerm.all_pairs(enc.logit_bias(), q_pos, k_pos)
    torch.testing.assert_close(fast, slow, atol=1e-13, rtol=0)
    w = torch.randn_like(slow)
    params = list(enc.parameters())
    for (n, _), a, b in zip(enc.named_parameters(), torch.autograd.grad((fast * w).sum(), params),
                            torch.autograd.grad((slow * w).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0, msg=n)


def test_fire_pairs_one_gather_equals_a_gather_per_head(monkeypatch):
    """Few pairs gather every head's slope and intercept in one call, many one head at a time:
    the same numbers, bit for bit."""
    from posenc.relative import fire

    enc = build("fire", d_model=12, num_heads=3, mlp_width=6, init_L=5.0)
    pos = torch.arange(40)[None]
    one = enc.logit_bias().all_pairs(pos, pos)
    monkeypatch.setattr(fire, "_ONE_GATHER", 0)
    per_head = enc.logit_bias().all_pairs(pos, pos)
    assert torch.equal(one, per_head)


def test_fire_progressive_interpolation():
    # Past the threshold, psi(i - j) / psi(i) maps each query's visible keys onto [0, 1]: the
    # first key gets 1 and the query itself 0, at any query position.
    from posenc.relative.fire import fire_normalized_distance

    c, L = torch.tensor(0.1, dtype=torch.float64), torch.tensor(4.0, dtype=torch.float64)
    for i in (10, 1000, 100_000):
        x = fire_normalized_distance(torch.tensor([[i]]), torch.tensor([[0, i]]), c, L, eps=0.0)[0, 0]
        torch.testing.assert_close(x, torch.tensor([1.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize(
    "config,match",
    [
        (dict(init_c=-0.1), "init_c"),
        (dict(init_c=float("nan")), "init_c"),
        (dict(init_L=0.0), "init_L"),
        (dict(mlp_width=0), "mlp_width"),
        (dict(eps=-1e-6), "eps"),
    ],
)
def test_fire_rejects_bad_parameters(config, match):
    with pytest.raises(ValueError, match=match):
        build("fire", d_model=16, num_heads=4, **config)


@pytest.mark.parametrize("offset", [0, 3, 9])
@pytest.mark.parametrize("block,causal", [(4, True), (5, False), (13, True)])
def test_fire_block_sums_equal_the_dense_gradient(offset, block, causal):
    """The blockwise gradient (FireBias.block_sums: no (Tq, Tk) gradient) equals autograd
    through the dense bias for any gradient: blocks of query rows in and past the Toeplitz rows
    below L = 6, causal blocks stopping at their last query, positions starting at ``offset``,
    and two layers' gradients summed in one accumulator."""
    enc = build("fire", d_model=12, num_heads=3, mlp_width=5, init_L=6.0).double()
    pos = torch.arange(offset, offset + 13)[None]
    term = enc.logit_bias()
    inputs, make = enc.logit_bias().block_sums(pos, pos)  # a graph of its own
    g = torch.Generator().manual_seed(offset + block)
    grads = [torch.randn(1, 3, 13, 13, generator=g, dtype=torch.float64) for _ in range(2)]
    if causal:
        grads = [x.tril() for x in grads]
    params = [p for p in enc.parameters() if p.requires_grad]
    want = torch.autograd.grad((term.dense(pos, pos) * (grads[0] + grads[1])).sum(), params)
    acc = make(torch.float64)
    for grad in grads:
        for i0 in range(0, 13, block):
            i1 = min(i0 + block, 13)
            z = i1 if causal else 13
            acc.add(i0, grad[:, :, i0:i1, :z])
    outs = [(t, d) for t, d in zip(inputs, acc.grads()) if d is not None]
    got = torch.autograd.grad([t for t, _ in outs], params, [d for _, d in outs])
    for name, a, b in zip([n for n, p in enc.named_parameters() if p.requires_grad], got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=name)


def test_fire_trains_through_the_cpu_flash_leaf_without_a_dense_gradient(plans, monkeypatch):
    """A FIRE model (float64, L below T so both parts of the bias are used): impl='sdpa' takes
    the CPU flash leaf, whose layers sum their gradients in FIRE's own accumulator, and its
    loss and every gradient equal impl='eager''s."""
    from helpers import assert_impls_train_alike, tiny_model
    from posenc.backends import Leaf
    from posenc.relative.fire import _FireSums

    made, real = [], _FireSums.__init__
    monkeypatch.setattr(_FireSums, "__init__", lambda self, *a, **kw: made.append(self) or real(self, *a, **kw))
    torch.manual_seed(0)
    model = tiny_model("fire", dtype=torch.float64, encoding_config={"init_L": 20.0})
    assert_impls_train_alike(model, torch.randint(0, 64, (2, 71)))
    assert len(made) == 1  # one accumulator for the sdpa step's layers, none for eager
    assert {p.leaf for p in plans[:2]} == {Leaf.CPU_FLASH_BIAS}
