"""registry.py: build, register and list_encodings refuse what they cannot do."""

from __future__ import annotations

import pytest

import posenc


def test_build_and_registry_errors():
    with pytest.raises(ValueError, match="valid encodings: none"):
        posenc.build("nonexistent", d_model=32, num_heads=4)
    with pytest.raises(ValueError, match="divisible"):
        posenc.build("none", d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="already registered"):
        posenc.register("none", family="none", summary="", paper="")(type("X", (posenc.PositionalEncoding,), {}))
    with pytest.raises(ValueError, match="family"):
        posenc.list_encodings("nonsense")
