"""The relative family. Importing this package registers its encodings."""

from . import alibi, fire, kerple, t5  # noqa: F401  (content-independent biases)
