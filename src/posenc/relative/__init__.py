"""The relative family. Importing this package registers its encodings.

Content-dependent (the ``terms`` hook, called per layer: :class:`~posenc.terms.TableTerm`,
:class:`~posenc.terms.DenseTerm`, :class:`~posenc.terms.ValueTerm`): shaw, relative_key,
relative_key_query, transformer_xl, deberta. Their distance buckets and skew/gather layout
are :mod:`.distance`.

Content-independent (the ``logit_bias`` hook, a :class:`~posenc.terms.BiasTerm` taken once
per forward and shared by the layers): t5, alibi, kerple, fire, sandwich.
"""

from . import shaw, relative_key, transformer_xl, deberta  # noqa: F401
from . import t5, alibi, kerple, fire  # noqa: F401
from . import dynamic_bias  # noqa: F401
from . import cope  # noqa: F401
from . import fox, per_row_alibi  # noqa: F401
from . import sandwich  # noqa: F401
from . import stick_breaking  # noqa: F401
from . import path_attention  # noqa: F401

from .alibi import ALiBi, alibi_bias, alibi_slopes
from .deberta import DebertaRelative, log_bucket_position
from .distance import RelativeLayout, skew, unskew
from .fire import Fire, fire_normalized_distance
from .kerple import Kerple, kerple_bias
from .relative_key import RelativeKey, RelativeKeyQuery
from .shaw import ShawRelative
from .t5 import T5RelativeBias, t5_relative_position_bucket
from .transformer_xl import TransformerXLRelative

__all__ = [
    "ALiBi",
    "DebertaRelative",
    "Fire",
    "Kerple",
    "RelativeKey",
    "RelativeKeyQuery",
    "RelativeLayout",
    "ShawRelative",
    "T5RelativeBias",
    "TransformerXLRelative",
    "alibi_bias",
    "alibi_slopes",
    "fire_normalized_distance",
    "kerple_bias",
    "log_bucket_position",
    "skew",
    "t5_relative_position_bucket",
    "unskew",
]
