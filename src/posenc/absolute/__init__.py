"""The absolute family: encodings that act on token embeddings (the ``embed`` hook).

One module per encoding; importing this package registers them all.
"""

from . import none, learned, sinusoidal  # noqa: F401

from .learned import LearnedPositionalEmbedding
from .sinusoidal import SinusoidalEncoding, sinusoidal_table

__all__ = ["LearnedPositionalEmbedding", "SinusoidalEncoding", "sinusoidal_table"]
