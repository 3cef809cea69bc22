"""``posenc bench``: length generalization of positional encodings, measured.

Small decoder-only Transformers are trained with each registered encoding on

* synthetic sequence tasks (copy, reverse, sort, addition, parity, summation; Kazemnejad
  et al. 2023) and tested beyond the training length by greedy exact match;
* passkey retrieval (Mohtashami & Jaggi 2023), accuracy by context length and key depth;
* selective copy and counting, after CoPE's tasks (Golovneva et al. 2024), by exact match;
* byte-level language modelling, perplexity at 1x to 8x the training length;

with training-free RoPE scalings (PI, NTK-aware, dynamic NTK, YaRN) evaluated as extra
variants when the rotary encoding offers them. See docs/bench.md.

Modules: :mod:`.tasks` (what a task is, the registry, the example tasks), :mod:`.counting`
(CoPE's selective copy and counting), :mod:`.language` (the lm task), :mod:`.entries` (an
encoding spec with the bench's training options), :mod:`.randomized` (randomized positions in
training and evaluation), :mod:`.tokens` (the shared vocabulary, Example), :mod:`.data` (batches, corpus),
:mod:`.settings` (BenchSettings, presets), :mod:`.build` (one run's model, batches,
optimisation), :mod:`.preflight` (checks before any training: models, corpus, memory),
:mod:`.train` (harness), :mod:`.evaluate`, :mod:`.runs` (each run's folder and its checks),
:mod:`.runner` (orchestration), :mod:`.summary` (scores, summary, ranking), :mod:`.compare` (a
fresh table against a committed one), :mod:`.report` (table, plots, ``figures`` for the HTML
report). The results files and the output folder's layout are :mod:`posenc.results`'; strict
JSON, checksummed safetensors and the folder lock are :mod:`posenc.files`'. Its command line is
:mod:`posenc.cli.bench`.
"""

from . import counting  # noqa: F401  registers CoPE's tasks (selective_copy, count) after the example tasks
from . import language  # noqa: F401  registers the lm task last
from .report import figures, format_table
from .runner import run_bench
from .settings import PRESETS, BenchSettings, settings_for

__all__ = ["figures", "format_table", "PRESETS", "BenchSettings", "run_bench", "settings_for"]
