"""The relative family. Importing this package registers its encodings.

Content-dependent (``score``/``output`` hooks): shaw, relative_key, relative_key_query,
transformer_xl, deberta. Their shared skew/gather machinery is :mod:`.distance`.
"""

from . import shaw, relative_key, transformer_xl, deberta  # noqa: F401

from .deberta import DebertaRelative, log_bucket_position
from .distance import RelativeLayout, skew, unskew
from .relative_key import RelativeKey, RelativeKeyQuery
from .shaw import ShawRelative
from .transformer_xl import TransformerXLRelative

__all__ = [
    "DebertaRelative",
    "RelativeKey",
    "RelativeKeyQuery",
    "RelativeLayout",
    "ShawRelative",
    "TransformerXLRelative",
    "log_bucket_position",
    "skew",
    "unskew",
]
