"""Each measured cell of ``posenc check`` against what the literature claims for it.

``posenc check`` measures whether an encoding has a property; the encoding's registration says
what its paper (or the paper that analysed it) expects (``@register(..., claims=...)``, see
:mod:`posenc.literature`), so each cell of the check table reads as "measured X, the
literature expects Y: agrees / differs", not as a grade of the encoding. ALiBi has no absolute
position by design; a table that says so in red would mislead.

An encoding without claims (a plugin, a user's module, a test double) reads "no claim" in every
measured cell.
"""

from __future__ import annotations

from ..literature import UNTRAINED
from ..registry import get_info, list_encodings
from .checks import CHECKS

__all__ = ["expected_for", "verdict"]


def expected_for(encoding: str, check: str) -> tuple[bool | str | None, str]:
    """``(expected, source)`` the registration of ``encoding`` declares for ``check``;
    ``(None, "")`` when it declares none (or ``encoding`` is not registered: a test double).

    A claim on a check ``posenc check`` does not have is a ``ValueError`` listing the checks, so
    a misspelt claim is not silently dropped from the table.
    """
    if encoding not in list_encodings():
        return None, ""
    claims = get_info(encoding).claims
    unknown = sorted(set(claims) - set(CHECKS))
    if unknown:
        raise ValueError(f"encoding {encoding!r} claims {', '.join(map(repr, unknown))}, not checks of "
                         f"posenc check (its checks: {', '.join(CHECKS)})")
    return claims.get(check, (None, ""))


def verdict(measured: str, expected: bool | str | None) -> str:
    """Compare a measured status ("yes" / "no" / "n/a" / "error") with the expectation.

    Returns "agrees", "differs", "untrained" (learned weights at init: no claim), "no claim",
    or the measured status itself when nothing was measured ("n/a", "error").
    """
    if measured not in ("yes", "no"):
        return measured
    if expected == UNTRAINED:
        return UNTRAINED
    if expected is None:
        return "no claim"
    return "agrees" if (measured == "yes") == expected else "differs"
