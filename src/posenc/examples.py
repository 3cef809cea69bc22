"""A short worked example, one small model per encoding: what ``posenc example`` prints.

Each encoding, named by spec (:mod:`posenc.variants`), goes into the same tiny decoder, which
runs a forward pass and greedy decoding with the KV cache; the summary counts the parameters
the encoding adds::

    >>> [r["encoding_params"] for r in run_example(["none", "learned"], length=8)]
    [0, 65536]
"""

from __future__ import annotations

import torch

from .model import Transformer
from .model_config import ModelConfig
from .registry import get_info, list_encodings
from .variants import parse_variant


def run_example(names: list[str] | None = None, length: int = 16) -> list[dict]:
    """Build a tiny decoder per encoding spec; return one summary dict per encoding.

    ``length`` (>= 1) is the forward pass's sequence length; decoding starts from its first
    ``min(4, length)`` tokens. Specs are checked before any model is built.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an int >= 1, got {length!r}")
    variants = [parse_variant(n) for n in (names or list_encodings())]
    rows = []
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (2, length))
    for v in variants:
        info = get_info(v.name)
        model = Transformer(ModelConfig(encoding=v.name, encoding_config=v.config_dict(), d_model=64, n_layer=2,
                                        n_head=4)).eval()
        with torch.no_grad():
            logits = model(tokens)
            gen = model.generate(tokens[:, :4], 4)
        rows.append(
            dict(
                name=v.label,
                family=info.family,
                encoding_params=model.num_parameters(encodings_only=True),
                logits_shape=tuple(logits.shape),
                generated=gen.shape[1],
            )
        )
    return rows

