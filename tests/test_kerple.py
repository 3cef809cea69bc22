"""kerple: both kernels (log, power) against a slow loop over the paper's formula, forward and
backward; parameters clamped to the kernel's range; bad parameters named."""

from __future__ import annotations

import pytest
import torch

from posenc import build

from bias_reference import K_POS, Q_POS, bias64, check_against_reference


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_against_reference(variant):
    enc, bias = bias64("kerple", variant=variant)

    def ref(b, h, i, j):
        d = abs(int(Q_POS[b, i]) - int(K_POS[b, j]))
        r1, r2 = enc.r1[h], enc.r2[h]
        if variant == "log":
            return -r1 * torch.log(1 + r2 * d)
        return -r1 * d**r2 if d > 0 else r1 * 0.0

    check_against_reference(enc, bias, ref)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_parameters_clamped_to_kernel_range(variant):
    enc = build("kerple", d_model=8, num_heads=2, variant=variant).double()
    with torch.no_grad():
        enc.r1.copy_(torch.tensor([-1.0, 0.5]))
        enc.r2.copy_(torch.tensor([-3.0, 7.0]))
    r1, r2 = enc.kernel_parameters()
    hi = 2.0 if variant == "power" else 7.0
    assert r1.tolist() == [0.01, 0.5] and r2.tolist() == [0.01, hi]
    # The clamp's gradient passes straight through: a parameter past the floor is not frozen.
    (r1.sum() + r2.sum()).backward()
    assert enc.r1.grad.tolist() == [1.0, 1.0] and enc.r2.grad.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    "config,match",
    [
        (dict(r1_init=-1.0), "r1_init"),
        (dict(r2_init=float("nan")), "r2_init"),
        (dict(variant="power", r2_init=2.5), "r2_init"),
        (dict(eps=0.0), "eps"),
        (dict(variant="cubic"), "variant"),
    ],
)
def test_kerple_rejects_bad_parameters(config, match):
    with pytest.raises(ValueError, match=match):
        build("kerple", d_model=16, num_heads=4, **config)
