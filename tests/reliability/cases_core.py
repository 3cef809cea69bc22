"""Core API: positions, the KV cache, the model's forward."""

from __future__ import annotations

import torch

from posenc import SequenceInfo

from . import Case

CASES = [
    Case("positions", "SequenceInfo.from_offset with a negative int offset", r"offset must be >= 0",
         run=lambda: SequenceInfo.from_offset(2, 4, -1)),
]
