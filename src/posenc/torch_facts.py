"""What posenc relies on about the installed torch, each fact stated once, with how it was seen.

Docstrings and messages elsewhere name these constants instead of restating a torch version;
``tests/test_torch_facts.py`` checks every fact that can be checked in a second against the
torch that runs the tests, so an upgrade that changes one fails there, in one place.

Observed with torch 2.13.0+cpu (:data:`OBSERVED_WITH`) on a 2-core AMD EPYC.
"""

from __future__ import annotations

__all__ = ["OBSERVED_WITH", "FLEX_HAS_CPU_BACKWARD", "FLEX_CPU_COMPILE_SECONDS", "flex_has_cpu_backward"]

OBSERVED_WITH = "2.13.0+cpu"

#: ``flex_attention``'s backward on CPU raises ``NotImplementedError`` ("FlexAttention does not
#: support backward on CPU"), compiled or not. So ``impl="auto"`` never picks flex on CPU, and
#: training with ``impl="flex"`` on CPU is refused with a ``ValueError`` naming ``impl``.
#: Checked by :func:`flex_has_cpu_backward`.
FLEX_HAS_CPU_BACKWARD = False

#: Compiling ``flex_attention`` costs about a minute per new shape on a small CPU (2 cores),
#: more than a test or a short run: tests run flex uncompiled on CPU, and ``auto`` does not
#: pick it there. Measured by timing the first call of each shape; not re-checked by the tests.
FLEX_CPU_COMPILE_SECONDS = 60


def flex_has_cpu_backward() -> bool:
    """Whether the installed torch runs ``flex_attention``'s backward on CPU (uncompiled, tiny)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 1, 4, 2, requires_grad=True)
    try:
        flex_attention(q, q, q).sum().backward()
    except NotImplementedError:
        return False
    return True
