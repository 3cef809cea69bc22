"""Ship what ``posenc extend`` chose to the engines users serve with: ``--export hf,vllm,llama.cpp``.

* ``hf``: the transformers checkpoint folder (:func:`posenc.hf.extend.write_extended`: config.json,
  the weights, extend.json), written by extend itself;
* ``vllm``: ``vllm.json`` (the ``--hf-overrides``) and ``vllm.sh`` (the ``vllm serve`` line), :mod:`.vllm`;
* ``llama.cpp``: ``llama.cpp.sh`` (the flags) and, with ``--gguf PATH``, a GGUF with the rope
  metadata and its tensor hashes, :mod:`.llamacpp` and :mod:`.gguf_rope`.

Each engine's function takes the :class:`~.winner.Winner` and the output folder and returns
``{target, files, command, notes, written}``; where an engine cannot express the winner, one
note says so and the files give the nearest it can (the best measured row it can express).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .llamacpp import llamacpp_export
from .vllm import vllm_export
from .winner import Winner

__all__ = ["ENGINE_EXPORTS", "TARGETS", "Winner", "check_export", "export_engines", "parse_targets"]

#: target -> its function (winner, out folder, gguf path or None) -> what it wrote
ENGINE_EXPORTS: dict[str, Callable[..., dict[str, Any]]] = {
    "vllm": lambda winner, out, gguf=None: vllm_export(winner, out),
    "llama.cpp": llamacpp_export,
}
#: every --export target, hf first (the default)
TARGETS = ("hf", *ENGINE_EXPORTS)


def parse_targets(value: str) -> tuple[str, ...]:
    """``"hf,vllm"`` -> ("hf", "vllm"): a comma list of :data:`TARGETS`, each once, in order;
    ValueError naming the allowed values for anything else."""
    names = [v.strip() for v in str(value).split(",")]
    bad = [n for n in names if n not in TARGETS]
    if bad or not names:
        raise ValueError(f"--export must be a comma list of {', '.join(TARGETS)}; got {value!r}")
    return tuple(dict.fromkeys(names))


def check_export(targets: tuple[str, ...], out: Any, gguf: Any) -> None:
    """Refuse, before anything runs: an unknown target, engine targets without ``out``, ``gguf``
    without llama.cpp among the targets, a ``gguf`` that is missing or not a GGUF file."""
    for t in targets:
        if t not in TARGETS:
            raise ValueError(f"--export must be a comma list of {', '.join(TARGETS)}; got {t!r}")
    if out is None and targets != ("hf",):
        raise ValueError(f"--export {','.join(targets)} writes files: give --out DIR")
    if gguf is not None:
        if "llama.cpp" not in targets:
            raise ValueError(f"--gguf is the llama.cpp export's input: add llama.cpp to --export (got "
                             f"{','.join(targets)})")
        from .gguf_rope import open_gguf

        open_gguf(Path(gguf))


def export_engines(targets: tuple[str, ...], winner: Winner, out: str | Path,
                   gguf: str | Path | None = None) -> list[dict[str, Any]]:
    """Run each engine target of ``targets`` (``hf`` is extend's own folder) into ``out``."""
    return [ENGINE_EXPORTS[t](winner, Path(out), gguf) for t in targets if t != "hf"]
