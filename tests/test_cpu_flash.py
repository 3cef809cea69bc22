"""The CPU flash path for a logit bias (posenc.backends.cpu_flash) and FIRE's Toeplitz rows.

Every result is compared with attention written out from its formula, one query row at a time
(softmax over the keys a row may see of q·k·scale + bias), and autograd through that loop.
"""

from __future__ import annotations

import pytest
import torch

from posenc import ModelConfig, Transformer, build, list_encodings
from posenc.backends.cpu_flash import SummedBias, backward_with_bias, flash_bias_attention
from posenc.speed.model import GOALS, goal_for


def reference(q, k, v, bias, scale, causal):
    """softmax(q_i·k_j·scale + bias_ij over the visible j)·v, row by row, in float64."""
    q, k, v, bias = (t.double() for t in (q, k, v, bias))
    rows = []
    for i in range(q.shape[2]):
        z = i + 1 if causal else k.shape[2]
        logits = (q[:, :, i : i + 1] @ k[:, :, :z].transpose(-1, -2)) * scale + bias[:, :, i : i + 1, :z]
        rows.append(torch.softmax(logits, dim=-1) @ v[:, :, :z])
    return torch.cat(rows, dim=2)


def inputs(B, H, T, D, dtype, bias_batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    bias_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    bias = torch.randn(bias_batch, H, T, T, generator=g, dtype=bias_dtype).requires_grad_()
    return q, k, v, bias


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias_batch", [1, 2])
@pytest.mark.parametrize("T", [1, 70, 130])  # one block, several blocks with a ragged last one
def test_forward_and_backward_equal_the_formula(causal, bias_batch, T):
    q, k, v, bias = inputs(2, 3, T, 8, torch.float64, bias_batch)
    out = flash_bias_attention(q, k, v, bias, scale=0.3, causal=causal)
    ref = reference(q, k, v, bias, 0.3, causal)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    w = torch.randn_like(ref)
    got = torch.autograd.grad((out * w).sum(), (q, k, v, bias))
    want = torch.autograd.grad((ref * w).sum(), (q, k, v, bias))
    for name, a, b in zip("q k v bias".split(), got, want):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0, msg=f"d{name}")


def test_fixed_bias_takes_the_kernel_backward_and_matches():
    # A bias without a gradient (ALiBi) uses the kernel's own backward.
    q, k, v, bias = inputs(2, 2, 90, 16, torch.float32, 1)
    bias = bias.detach()
    out = flash_bias_attention(q, k, v, bias, scale=0.25, causal=True)
    ref = reference(q, k, v, bias, 0.25, True)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)
    w = torch.randn_like(ref)
    got = torch.autograd.grad((out * w.float()).sum(), (q, k, v))
    want = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=5e-5, rtol=0)


def test_block_size_does_not_change_the_gradient():
    q, k, v, bias = (t.detach() for t in inputs(1, 2, 100, 8, torch.float64, 1))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, attn_mask=bias, scale=0.5)
    do = torch.randn_like(out)
    a = backward_with_bias(q, k, v, bias, out, lse, do, scale=0.5, causal=True, block=7)
    b = backward_with_bias(q, k, v, bias, out, lse, do, scale=0.5, causal=True, block=256)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=0)


def _layers(q, k, v, bias, *, causal):
    """Three attention calls in a chain sharing one bias, plus a direct use of the bias."""
    x = q
    for _ in range(3):
        x = flash_bias_attention(x, k, v, bias, scale=0.3, causal=causal)
    used = bias.tensor if isinstance(bias, SummedBias) else bias
    return x, (used[:, :, :2] * 0.7).sum()  # a second consumer of the shared tensor


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias_batch", [1, 2])
def test_summed_bias_gives_the_sum_of_every_use(causal, bias_batch):
    """Calls sharing a SummedBias add their gradients into one buffer; the bias's gradient is
    the same as autograd's sum over the calls and the other use, for q, k, v and the bias."""
    q, k, v, base = inputs(2, 3, 70, 8, torch.float64, bias_batch)
    w = torch.randn(2, 3, 70, 8, dtype=torch.float64)
    grads = []
    for summed in (False, True):
        bias = base * 1.5  # a non-leaf, as a model's bias is: the gradient must flow on to `base`
        out, extra = _layers(q, k, v, SummedBias(bias) if summed else bias, causal=causal)
        grads.append(torch.autograd.grad((out * w).sum() + extra, (q, k, v, base)))
    for name, a, b in zip("q k v bias".split(), *grads):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0, msg=f"d{name}")


def test_summed_bias_starts_again_on_a_second_backward():
    q, k, v, base = inputs(1, 2, 40, 8, torch.float64, 1)
    out, _ = _layers(q, k, v, SummedBias(base * 1.0), causal=True)
    out.sum().backward(retain_graph=True)
    once = base.grad.clone()
    out.sum().backward()
    torch.testing.assert_close(base.grad, 2 * once, atol=1e-12, rtol=0)


def test_summed_bias_without_autograd_is_the_bias_itself():
    bias = torch.randn(1, 2, 5, 5, requires_grad=True)
    with torch.no_grad():
        assert SummedBias(bias).tensor is bias
    assert SummedBias(bias.detach()).tensor is not bias  # no gradient wanted: no node
    assert SummedBias(bias).tensor.grad_fn is not None


def test_summed_bias_refuses_what_is_not_a_float_tensor():
    with pytest.raises(TypeError, match="bias must be a floating-point tensor, got list"):
        SummedBias([[0.0]])
    with pytest.raises(TypeError, match="bias must be a floating-point tensor, got a torch.int64 tensor"):
        SummedBias(torch.zeros(1, 2, 3, 3, dtype=torch.long))


def test_summed_bias_leaves_no_reference_cycle():
    # The node's context holds the SummedBias, which must not hold the node's output: with
    # the garbage collector off, the bias is freed as soon as the last reference goes.
    import gc
    import weakref

    gc.disable()
    try:
        q, k, v, base = inputs(1, 2, 20, 8, torch.float64, 1)
        bias = base * 1.0
        alive = weakref.ref(bias)
        out, _ = _layers(q, k, v, SummedBias(bias), causal=True)
        out.sum().backward()
        del out, bias
        assert alive() is None
    finally:
        gc.enable()


def test_backward_into_a_buffer_adds_to_it():
    q, k, v, bias = (t.detach() for t in inputs(2, 2, 50, 8, torch.float64, 1))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, attn_mask=bias, scale=0.5)
    do = torch.randn_like(out)
    *_, alone = backward_with_bias(q, k, v, bias, out, lse, do, scale=0.5, causal=True, block=16)
    into = torch.full_like(bias, 0.25)
    *_, none = backward_with_bias(q, k, v, bias, out, lse, do, scale=0.5, causal=True, block=16, into=into)
    assert none is None
    torch.testing.assert_close(into, alone + 0.25, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="into must be a torch.float64 tensor of the bias's shape"):
        backward_with_bias(q, k, v, bias, out, lse, do, scale=0.5, causal=True, into=into.float())
    with pytest.raises(ValueError, match="into must be"):
        backward_with_bias(q, k, v, bias, out, lse, do, scale=0.5, causal=True, into=into[:, :, 1:])


def test_summed_float64_bias_with_float32_inputs_and_another_use():
    q, k, v, _ = inputs(1, 2, 30, 8, torch.float32, 1)
    base = torch.randn(1, 2, 30, 30, dtype=torch.float64, requires_grad=True)
    grads = []
    for summed in (False, True):
        bias = base * 1.0
        out, extra = _layers(q, k, v, SummedBias(bias) if summed else bias, causal=True)
        (g,) = torch.autograd.grad(out.double().sum() + extra, (base,))
        grads.append(g)
    assert grads[1].dtype == torch.float64
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=0)


def test_a_wider_bias_than_the_inputs_backward():
    # A float64 bias with float32 q, k, v: the kernel reads it as float32; its gradient comes
    # back float64, equal to the formula's within float32 rounding.
    q, k, v, _ = inputs(1, 2, 30, 8, torch.float32, 1)
    bias = torch.randn(1, 2, 30, 30, dtype=torch.float64, requires_grad=True)
    out = flash_bias_attention(q, k, v, bias, scale=0.3, causal=True)
    ref = reference(q, k, v, bias.float(), 0.3, True)
    w = torch.randn_like(ref)
    (got,) = torch.autograd.grad((out.double() * w).sum(), (bias,))
    (want,) = torch.autograd.grad((ref * w).sum(), (bias,))
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_bfloat16_inputs_give_their_dtypes_back():
    q, k, v, bias = inputs(1, 2, 40, 16, torch.bfloat16, 1)
    out = flash_bias_attention(q, k, v, bias, scale=0.25, causal=True)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert (q.grad.dtype, bias.grad.dtype) == (torch.bfloat16, torch.float32)
    ref = reference(q, k, v, bias, 0.25, True)
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=0)


def test_empty_sequence_gives_an_empty_output():
    q = torch.zeros(2, 2, 0, 8, requires_grad=True)
    out = flash_bias_attention(q, q, q, torch.zeros(1, 2, 0, 0), scale=0.3, causal=True)
    out.sum().backward()
    assert out.shape == (2, 2, 0, 8) and q.grad.shape == q.shape


def test_bad_input_is_named():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="Tq=3, Tk=4"):
        flash_bias_attention(q[:, :, :3], q, q, torch.zeros(1, 2, 3, 4), scale=1.0, causal=True)
    with pytest.raises(ValueError, match="bias must have shape"):
        flash_bias_attention(q, q, q, torch.zeros(1, 3, 4, 4), scale=1.0, causal=True)
    with pytest.raises(ValueError, match="k must be a 4-D floating-point tensor"):
        flash_bias_attention(q, q[0], q, torch.zeros(1, 2, 4, 4), scale=1.0, causal=True)
    with pytest.raises(ValueError, match="must share B, H and dtype"):
        flash_bias_attention(q, q.double(), q, torch.zeros(1, 2, 4, 4), scale=1.0, causal=True)
    with pytest.raises(ValueError, match="bias must be a 4-D floating-point tensor"):
        flash_bias_attention(q, q, q, torch.zeros(1, 2, 4, 4, dtype=torch.long), scale=1.0, causal=True)


BIAS = [n for n in list_encodings() if build(n, d_model=32, num_heads=4).has_bias]


def test_some_encodings_have_a_bias():
    assert len(BIAS) >= 2, BIAS


@pytest.mark.parametrize("name", BIAS)
def test_model_training_step_equals_eager(name, plans):
    """The model's sdpa backend (flash with the shared bias) against the eager backend:
    same logits and the same gradient for every parameter, the bias's own included."""
    from posenc.backends import Leaf

    torch.manual_seed(0)
    cfg = dict(encoding=name, d_model=32, n_head=4, n_layer=2, vocab_size=50)
    if name == "fire":
        cfg["encoding_config"] = {"init_L": 40.0}  # 70 tokens: Toeplitz rows and per-pair rows
    fast = Transformer(ModelConfig(**cfg, attn_impl="sdpa")).double()
    slow = Transformer(ModelConfig(**cfg, attn_impl="eager")).double()
    slow.load_state_dict(fast.state_dict())
    tokens = torch.randint(0, 50, (2, 70))
    a = fast(tokens)
    assert plans and {p.leaf for p in plans} == {Leaf.CPU_FLASH_BIAS}, plans
    b = slow(tokens)
    torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    a.square().mean().backward()
    b.square().mean().backward()
    for (n, p), q in zip(fast.named_parameters(), slow.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-9, rtol=0, msg=n)


@pytest.mark.parametrize("L, start, T", [(20.0, 0, 30), (20.5, 5, 30), (20.0, 17, 8), (0.3, 0, 12), (100.0, 0, 12)])
def test_fire_toeplitz_rows_equal_every_pair(L, start, T):
    """FIRE's dense bias takes the rows strictly below L from one evaluation per distance;
    values and gradients (c, L and the MLP) equal evaluating every pair."""
    torch.manual_seed(1)
    enc = build("fire", d_model=32, num_heads=4, init_L=L).double()
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if n != "L_multiplier":
                p.normal_()
    q_pos, k_pos = torch.arange(start, start + T)[None], torch.arange(0, start + T)[None]
    fast = enc.logit_bias().dense(q_pos, k_pos)
    slow = enc.logit_bias().all_pairs(q_pos, k_pos)
    torch.testing.assert_close(fast, slow, atol=0, rtol=0)
    w = torch.randn_like(slow)
    params = list(enc.parameters())
    for a, b in zip(torch.autograd.grad((fast * w).sum(), params), torch.autograd.grad((slow * w).sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0)


def test_speed_goals_follow_the_hooks():
    """goal_for reads the encoding's hooks: a bias has a memory goal; two logit terms get 2x."""
    goal = {n: goal_for(Transformer(ModelConfig(encoding=n, d_model=32, n_head=4)))[0]
            for n in ("none", "rope", "alibi", "fire", "shaw", "relative_key", "relative_key_query", "deberta",
                      "cope", "fox", "per_row_alibi")}
    assert goal["none"] == goal["rope"] == "rotary/absolute"
    assert goal["alibi"] == goal["fire"] == "position bias" and GOALS["position bias"] == (1.15, 1.10)
    assert goal["shaw"] == goal["relative_key"] == goal["cope"] == goal["per_row_alibi"] == "content-dependent, one term"
    assert GOALS["content-dependent, one term"] == (1.6, 1.3)
    assert goal["fox"] == "prefix sums" and GOALS["prefix sums"] == GOALS["position bias"]  # O(T) sums: a bias's cost
    assert goal["relative_key_query"] == goal["deberta"] == "content-dependent, two terms"



@pytest.mark.parametrize("i0, rows, z", [(0, 1, 1), (0, 5, 5), (3, 4, 7), (10, 6, 16), (2, 6, 20)])
def test_diagonal_sums_of_a_block_equal_a_loop(i0, rows, z):
    """DiagonalSums.add: a block's dbias summed along its diagonals into the Toeplitz values,
    value w = Tq - 1 - i + j, element by element."""
    from posenc.backends.cpu_flash import DiagonalSums

    H, Tq, Tk = 3, 16, 20
    block = torch.randn(1, H, rows, z, dtype=torch.float64)
    sums = DiagonalSums(H, Tq, Tk, torch.float64, torch.device("cpu"))
    sums.add(i0, block)
    want = torch.zeros(1, H, Tq + Tk - 1, dtype=torch.float64)
    for r in range(rows):
        for j in range(z):
            want[0, :, Tq - 1 - (i0 + r) + j] += block[0, :, r, j]
    torch.testing.assert_close(sums.values, want, atol=1e-14, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_toeplitz_summed_bias_hands_its_values_the_gradient(causal, spy):
    """SummedBias.toeplitz: the layers' gradients summed per diagonal (no dense buffer) equal
    autograd's through the dense Toeplitz layout, with a second use of the bias as well."""
    from posenc.backends import cpu_flash
    from posenc.terms import BiasTerm

    T = 70
    q, k, v, _ = inputs(2, 3, T, 8, torch.float64, 1)
    base = torch.randn(1, 3, 2 * T - 1, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, T, 8, dtype=torch.float64)
    grads = []
    for toeplitz in (False, True):
        values = base * 1.5  # a non-leaf, as a model's values are
        taken = spy(cpu_flash, "backward_with_bias")
        bias = SummedBias.toeplitz(values, T, T) if toeplitz else BiasTerm.toeplitz_layout(values, T, T)
        out, extra = _layers(q, k, v, bias, causal=causal)
        grads.append(torch.autograd.grad((out * w).sum() + extra, (q, k, v, base)))
        assert len(taken) == 3
    for name, a, b in zip("q k v values".split(), *grads):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0, msg=f"d{name}")


def test_toeplitz_summed_bias_keeps_no_dense_gradient():
    """With a Toeplitz bias the backward's accumulator is the (1, H, Tq + Tk - 1) values, not a
    (1, H, Tq, Tk) buffer."""
    from posenc.backends.cpu_flash import DiagonalSums

    T = 40
    q, k, v, _ = inputs(1, 2, T, 8, torch.float32, 1)
    values = torch.randn(1, 2, 2 * T - 1, requires_grad=True)
    summed = SummedBias.toeplitz(values, T, T)
    seen = []
    real = summed.sum.accumulator
    summed.sum.accumulator = lambda dtype: seen.append(real(dtype)) or seen[-1]
    flash_bias_attention(q, k, v, summed, scale=0.3, causal=True).sum().backward()
    assert seen and all(isinstance(s, DiagonalSums) and s.values.shape == (1, 2, 2 * T - 1) for s in seen)
    assert values.grad.shape == (1, 2, 2 * T - 1)
