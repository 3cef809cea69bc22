"""What the literature claims about an encoding's properties, as its registration declares them.

An encoding states its claims where it is registered (``@register(..., claims={...})``): per
check of ``posenc check`` (absolute, relative, linear_map, bounded, decay, extrapolation,
linear_attention), an ``(expected, source)`` pair. ``expected`` is ``True`` when the property
is claimed, ``False`` when its absence is claimed or follows from the construction the paper
gives, and :data:`UNTRAINED` when the property depends on learned weights that the probe only
has at random initialisation (no claim at init). A check without an entry has no claim; an
encoding that declares none reads "no claim" in every cell. Sources are short citations; the
checks' docstrings give the equations. ``posenc check`` compares each measurement with the
claim (:mod:`posenc.analysis.claims`), so ALiBi's "no absolute position" reads as agreeing
with its paper, not as a fault.

The phrases below are the sources several encodings share, kept in one place so they read
the same in every row.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Union

__all__ = [
    "UNTRAINED", "Claims", "check_claims",
    "LEARNED", "NO_ABSOLUTE", "RELATIVE_BY_CONSTRUCTION", "NOT_A_FEATURE_MAP", "TABLE_END",
    "EMBEDDINGS_ONLY", "ROPE_FEATURES", "NORMS_PRESERVED", "SU",
]

UNTRAINED = "untrained"

Claims = Mapping[str, tuple[Union[bool, str], str]]  # check -> (expected, source)

LEARNED = "learned weights; the probe has them at random init"
NO_ABSOLUTE = "sees only i - j: no absolute position by construction"
RELATIVE_BY_CONSTRUCTION = "a function of i - j by construction"
NOT_A_FEATURE_MAP = "Su et al. 2021, §3.3: additive relative terms do not factor through per-token features"
TABLE_END = "a table of max_len rows (Press et al. 2022: learned tables stop at their length)"
EMBEDDINGS_ONLY = "positions enter the embeddings only"
ROPE_FEATURES = "per-token features, as RoPE"
NORMS_PRESERVED = "rotations preserve norms"
SU = "Su et al. 2021 (RoFormer)"


def check_claims(encoding: str, claims: Claims) -> Mapping[str, tuple[bool | str, str]]:
    """``claims`` checked and frozen: str check names, each an ``(expected, source)`` pair with
    ``expected`` True, False or :data:`UNTRAINED` and a non-empty source. Which check names
    exist is the analysis' to say (it refuses an unknown one when it reads the claims)."""
    if not isinstance(claims, Mapping):
        raise TypeError(f"claims of encoding {encoding!r} must be a mapping check -> (expected, source), "
                        f"got {type(claims).__name__} {claims!r}")
    for check, claim in claims.items():
        if not isinstance(check, str):
            raise TypeError(f"claims of encoding {encoding!r}: check names must be str, got {check!r}")
        if not (isinstance(claim, tuple) and len(claim) == 2):
            raise TypeError(f"claim {check!r} of encoding {encoding!r} must be a pair (expected, source), got {claim!r}")
        expected, source = claim
        if expected is not True and expected is not False and expected != UNTRAINED:
            raise ValueError(f"claim {check!r} of encoding {encoding!r}: expected must be True, False or "
                             f"{UNTRAINED!r}, got {expected!r}")
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"claim {check!r} of encoding {encoding!r} needs its source (a citation), got {source!r}")
    return MappingProxyType(dict(claims))
