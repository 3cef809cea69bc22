"""The ntk_alpha RoPE scaling (Hunyuan's fixed alpha): its parameter refused by name."""

from __future__ import annotations

from posenc import build

from . import Case


def _rope(**config):
    return build("rope", d_model=32, num_heads=2, scaling="ntk_alpha", **config)


A = "RoPE scaling ntk_alpha"
CASES = [
    Case(A, "scaling='ntk_alpha' without alpha", r"^alpha is required for rope type 'ntk_alpha' .*got None$",
         run=lambda: _rope()),
    Case(A, "ntk_alpha alpha=0", r"^alpha must be > 0, got 0.0$", run=lambda: _rope(alpha=0.0)),
    Case(A, "ntk_alpha alpha=1e300 (the stretched base overflows)",
         r"^alpha=1e\+300 makes the base base \* alpha\^\(d/\(d-2\)\) = inf at base=10000.0, rotary_dim=16: "
         r"it must be finite, > 0 and != 1$", run=lambda: _rope(alpha=1e300)),
    Case(A, "ntk_alpha on a rotary_dim of 2", r"^rope type 'ntk_alpha' needs rotary_dim >= 4 .*got 2$",
         run=lambda: _rope(alpha=2.0, rotary_dim=2)),
]
