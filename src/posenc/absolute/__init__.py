"""The absolute family: encodings that act on token embeddings (the ``embed`` hook).

One module per encoding; importing this package registers them all.
"""

from . import none, learned, sinusoidal  # noqa: F401
from . import nope_temperature  # noqa: F401  (NoPE + Llama 4's query temperature: the rotate hook)
from . import multiplicative, complex_order, convolutional, recurrent, floater  # noqa: F401

from .complex_order import ComplexOrderEmbedding
from .convolutional import ConvolutionalEncoding
from .floater import FloaterEncoding, rk4
from .learned import LearnedPositionalEmbedding
from .multiplicative import MultiplicativeEmbedding
from .nope_temperature import NoPETemperature, temperature_scale
from .recurrent import RecurrentEncoding
from .sinusoidal import SinusoidalEncoding, sinusoidal_table

__all__ = [
    "ComplexOrderEmbedding",
    "ConvolutionalEncoding",
    "FloaterEncoding",
    "LearnedPositionalEmbedding",
    "MultiplicativeEmbedding",
    "NoPETemperature",
    "RecurrentEncoding",
    "SinusoidalEncoding",
    "rk4",
    "sinusoidal_table",
    "temperature_scale",
]
