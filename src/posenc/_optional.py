"""Optional dependencies: ``pip install posenc`` needs torch alone.

The rest sits in extras, each named by the error raised where it is first needed::

    plt = require("matplotlib.pyplot", extra="plot")
    # ImportError: matplotlib is not installed; posenc needs it for figures: pip install 'posenc[plot]'

=========  =============================================  ==========================
extra      packages                                       used by
=========  =============================================  ==========================
plot       matplotlib, numpy                              figures (plot, report, probe)
bench      tqdm, safetensors, numpy, matplotlib           bench: checkpoints, bars, plots/
hf         transformers                                   posenc.hf (patch_model, probe, bench --model)
all        every extra above
=========  =============================================  ==========================
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtra", "require", "available"]

# extra -> the distributions it installs (pyproject.toml's optional-dependencies say the same;
# tests/test_lean_install.py checks that they agree)
EXTRAS: dict[str, tuple[str, ...]] = {
    "plot": ("matplotlib", "numpy"),
    "bench": ("tqdm", "safetensors", "numpy", "matplotlib"),
    "hf": ("transformers", "gguf", "accelerate"),
}

# what each extra gives, for the error message
_PURPOSE = {"plot": "figures", "bench": "posenc bench", "hf": "Hugging Face checkpoints"}


class MissingExtra(ImportError):
    """An optional package is not installed (the CLI prints it as one line, exit 2)."""


def require(module: str, *, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtra` (an ImportError) naming the package and
    the extra that installs it."""
    if extra not in EXTRAS:
        raise ValueError(f"extra must be one of {', '.join(EXTRAS)}, got {extra!r}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if e.name is not None and e.name.split(".")[0] != top:
            raise  # the package is there but one of its own imports failed: its own error says which
        raise MissingExtra(
            f"{top} is not installed; posenc needs it for {_PURPOSE[extra]}: pip install 'posenc[{extra}]'",
            name=top,
        ) from None


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    from importlib.util import find_spec

    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False
