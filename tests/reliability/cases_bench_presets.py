"""posenc bench presets and the token-embedding convention (issue 14): unknown preset names,
the former name ``full`` (now an unknown name too), and an unknown embedding convention."""

from __future__ import annotations

from . import Case

A = "bench presets"


def _settings(preset, **kw):
    def run():
        from posenc.bench.settings import settings_for

        return settings_for(preset, **kw)

    return run


CASES = [
    Case(A, "an unknown preset name", r"unknown preset 'huge'; valid presets: micro, quick, standard, paper",
         run=_settings("huge")),
    Case(A, "a preset name in the wrong case (no fuzzy matching)", r"unknown preset 'Standard'; valid presets: ",
         run=_settings("Standard")),
    Case(A, "a preset that is not a string", r"unknown preset None; valid presets: ", run=_settings(None)),
    Case(A, "the former preset name 'full'", r"unknown preset 'full'; valid presets: micro, quick, standard, paper",
         run=_settings("full")),
    Case(A, "an unknown token-embedding convention", r"embedding must be one of 'matched', 'gpt2', 'unit'; got 'sqrt'",
         run=_settings("micro", embedding="sqrt")),
]
