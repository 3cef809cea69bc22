"""model_config.py: ModelConfig's checks, EncodingSpec and the named presets."""

from __future__ import annotations

import pytest

from posenc import ModelConfig


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(d_model=30, n_head=4), ValueError, "divisible"),
        (dict(n_head=4, n_kv_head=3), ValueError, "multiple of n_kv_head"),
        (dict(encoding="nope-not-real"), ValueError, "valid encodings"),
        (dict(attn_impl="flash"), ValueError, "attn_impl"),
        (dict(dropout=1.5), ValueError, "dropout"),
        (dict(dropout=float("nan")), ValueError, "dropout"),
        (dict(n_layer=0), ValueError, "n_layer"),
        (dict(n_layer=2, absolute_before_last=3), ValueError, "absolute_before_last"),
        (dict(n_layer=2, layer_encodings=("none",)), ValueError, "layer_encodings"),
        (dict(vocab_size=2.5), TypeError, "vocab_size"),
    ],
)


def test_model_config_bad_inputs(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ModelConfig(**kwargs)


def test_presets_are_exact_names_with_overrides():
    from posenc import preset
    from posenc.model_config import PRESETS

    assert PRESETS  # a loop over no presets would assert nothing
    for name, sizes in PRESETS.items():
        cfg = preset(name, encoding="alibi")
        assert {k: getattr(cfg, k) for k in sizes} == sizes and cfg.encoding == "alibi"
    with pytest.raises(ValueError, match=r"^unknown preset 'Tiny'; valid presets: tiny, small, base$"):
        preset("Tiny")


@pytest.mark.parametrize("bad, exc, match", [
    (0.0, ValueError, r"^embed_scale must be > 0, got 0.0$"),
    (-0.02, ValueError, r"^embed_scale must be > 0, got -0.02$"),
    (float("inf"), ValueError, r"^embed_scale must be finite"),
    ("0.02", TypeError, r"^embed_scale must be a float or None, got str '0.02'$"),
])
def test_embed_scale_refuses_what_cannot_scale(bad, exc, match):
    with pytest.raises(exc, match=match):
        ModelConfig(encoding="sinusoidal", embed_scale=bad)
