"""What ``posenc extend`` chose, as the exporters read it: :class:`Winner` (the measured rows, the
one the rule chose, the checkpoint's config, L and N) and the two questions every engine asks of
it: which row to ship when the engine cannot express the winner (:meth:`Winner.nearest`: the best
row by extend's own rule among those it can), and the RoPE a row means (:meth:`Winner.rope`:
posenc's reading of the config.json extend would write for it).

A row is one dict of extend's ``candidates`` (``label``, ``scaling`` / ``method`` and ``params``,
``hf``: the config entries of a scaling, and the measured ``ppl`` / ``passkey`` fields
:func:`posenc.hf.extend_grid.choose` reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["Winner", "static_ntk_at"]


@dataclass(frozen=True)
class Winner:
    """``rows``: extend's measured candidates in table order; ``index``: the row its rule chose;
    ``config``: the checkpoint's config.json; ``L`` / ``N``: its trained length and the target;
    ``checkpoint``: the folder an engine loads (the original checkpoint: the exports say how to
    serve it extended, without copying it)."""

    rows: tuple[Mapping[str, Any], ...]
    index: int
    config: Mapping[str, Any]
    L: int
    N: int
    checkpoint: str

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("Winner needs at least one candidate row, got none")
        if not 0 <= self.index < len(self.rows):
            raise ValueError(f"index must be in [0, {len(self.rows) - 1}], got {self.index}")
        if not 1 <= self.L < self.N:
            raise ValueError(f"L and N must satisfy 1 <= L < N, got L = {self.L}, N = {self.N}")

    @property
    def row(self) -> Mapping[str, Any]:
        """The chosen row."""
        return self.rows[self.index]

    def nearest(self, can: Callable[[Mapping[str, Any]], bool]) -> Mapping[str, Any] | None:
        """The row an engine ships when it cannot express the winner: the best of the rows ``can``
        accepts, by extend's rule (:func:`posenc.hf.extend_grid.choose` over them); None when it
        accepts none."""
        from ..extend_grid import choose

        fit = [r for r in self.rows if can(r)]
        return fit[choose(list(fit))[0]] if fit else None

    def hf_config(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The config.json extend writes for ``row`` (a method's row: the model's own RoPE)."""
        from ..extend import extended_config

        return extended_config(dict(self.config), row.get("hf") if row.get("method") is None else None, self.N)

    def rope(self, row: Mapping[str, Any]) -> Any:
        """posenc's RoPE of ``row``'s config (:func:`posenc.rotary.from_hf`)."""
        from ...rotary import from_hf

        return from_hf(self.hf_config(row))


def static_ntk_at(winner: Winner, row: Mapping[str, Any]) -> dict[str, Any]:
    """A dynamic-NTK row as the static base it has at N tokens: transformers' dynamic type
    (``_compute_dynamic_ntk_parameters``, transformers 5) uses base * (s n / L - (s - 1))^(d/(d-2))
    at a sequence of n > L tokens, so at n = N it is static NTK at s' = s N / L - (s - 1). Returns
    a row (``label``, ``scaling="ntk"``, ``params``, ``hf``) that writes it, the others copied."""
    from ...rotary import to_hf

    if row.get("scaling") != "dynamic":
        raise ValueError(f"static_ntk_at needs a dynamic NTK row, got scaling {row.get('scaling')!r}")
    s = float(row["params"].get("factor") or 1.0)
    trained = int(row["params"].get("original_max_position_embeddings") or winner.L)
    s_at_n = s * winner.N / trained - (s - 1)
    rope = winner.rope(dict(row, hf=None, method=None))  # the model's own RoPE
    rope.set_scaling("ntk", factor=s_at_n)
    return dict(row, label=f"NTK-aware x{s_at_n:g} (dynamic NTK at N = {winner.N})", scaling="ntk",
                params={"factor": s_at_n}, hf=to_hf(rope))
