"""Typed configuration: every config field is checked from its annotation.

Parametrized over the registry (every encoding, every field of its Config) and over every
ModelConfig field, so a new encoding or field is covered without a new test, and a field
with an annotation the checker does not understand fails here.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Literal, Optional

import pytest
import torch

import posenc
from posenc import EncodingSpec, ModelConfig, Transformer, get_info, preset
from posenc.config import EncodingConfig, check_fields, check_int, check_value, field_types

ENCODINGS = posenc.list_encodings()


def _field_cases() -> list[tuple[str, str, Any]]:
    assert ENCODINGS, "no encodings registered"
    out = []
    for name in ENCODINGS:
        out += [(name, f, tp) for f, tp in field_types(get_info(name).config_cls).items()]
    return out


FIELD_CASES = _field_cases()
MODEL_FIELDS = list(field_types(ModelConfig, plain=False).items())


def _arms(tp: Any) -> set:
    """The types a union annotation admits (``float | None`` -> {float, NoneType})."""
    if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType):
        return set(typing.get_args(tp))
    return {tp}


def _wrong_values(tp: Any) -> list[Any]:
    """Values of a wrong type for annotation ``tp`` (none of them admitted by any arm)."""
    arms = _arms(tp)
    bad = []
    if bool in arms:
        bad += ["no", 1]  # bool("no") is True: the silent wrong result this check prevents
    if int in arms:
        bad += [True, 2.5, "3"]
    if float in arms:
        bad += ["1.0", True]
    if str in arms:
        bad += [3, b"eager"]
    if tuple[float, ...] in arms:
        bad += ["1.0, 2.0", {"a": 1.0}]
    if tuple[int, ...] in arms:
        bad += ["16,24,24", {"t": 16}]
    if not bad:
        raise AssertionError(f"no wrong values known for annotation {tp!r}: extend _wrong_values")
    # A wrong value must not be admitted by another arm of a union (e.g. 1 for `bool | int`).
    return [v for v in bad if not any(_admits(a, v) for a in arms)]


def _admits(tp: Any, value: Any) -> bool:
    try:
        check_value("x", value, tp)
    except (TypeError, ValueError):
        return False
    return True


def test_every_encoding_has_fields_to_check():
    assert len(ENCODINGS) >= 10
    assert len(FIELD_CASES) >= 50
    assert len(MODEL_FIELDS) == len(dataclasses.fields(ModelConfig))


# ---- every encoding, every field -------------------------------------------------------------
@pytest.mark.parametrize("name", ENCODINGS)
def test_annotations_are_supported_and_defaults_pass(name):
    cls = get_info(name).config_cls
    types = field_types(cls)  # raises TypeError for an unsupported annotation
    assert set(types) == {f.name for f in dataclasses.fields(cls) if f.init}
    cfg = cls()
    for f in types:  # the stored defaults are in their stored form already
        assert check_value(f, getattr(cfg, f), types[f]) == getattr(cfg, f)


@pytest.mark.parametrize("name,field,tp", FIELD_CASES, ids=[f"{n}.{f}" for n, f, _ in FIELD_CASES])
def test_wrong_type_is_refused_naming_the_field(name, field, tp):
    bad_values = _wrong_values(tp)
    assert bad_values
    for bad in bad_values:
        with pytest.raises(TypeError, match=rf"^{field}(\[\d+\])? must be .*, got {type(bad).__name__} "):
            posenc.build(name, d_model=32, num_heads=4, **{field: bad})
        with pytest.raises(TypeError, match=rf"^encoding_config: {field}(\[\d+\])? must be"):
            ModelConfig(d_model=32, n_head=4, encoding=name, encoding_config={field: bad})


@pytest.mark.parametrize("name,field,tp", FIELD_CASES, ids=[f"{n}.{f}" for n, f, _ in FIELD_CASES])
def test_default_given_explicitly_is_accepted(name, field, tp):
    default = getattr(get_info(name).config_cls(), field)
    enc = posenc.build(name, d_model=32, num_heads=4, **{field: default})
    assert getattr(enc.config, field) == default
    if float in _arms(tp) and isinstance(default, float) and default.is_integer():
        # An int in a float field (JSON "base": 10000) is accepted and stored as a float.
        enc = posenc.build(name, d_model=32, num_heads=4, **{field: int(default)})
        got = getattr(enc.config, field)
        assert type(got) is float and got == default


@pytest.mark.parametrize("name,field,tp", [c for c in FIELD_CASES if c[2] is bool],
                         ids=[f"{n}.{f}" for n, f, tp in FIELD_CASES if tp is bool])
def test_bool_fields_accept_both_bools(name, field, tp):
    """A real bool is never a TypeError (the other value may be refused by a range rule,
    e.g. DeBERTa with both c2p and p2c off, but then as a ValueError naming it)."""
    default = getattr(get_info(name).config_cls(), field)
    try:
        cfg = get_info(name).config_cls(**{field: not default})
    except ValueError as e:
        assert field in str(e)
    else:
        assert getattr(cfg, field) is (not default)


# Type-correct, in-range values that differ from the defaults (checked by hand against each
# config's validate()) and the value stored: unchanged, or an int in a float field as a float.
VALID = {
    ("sinusoidal", "dim"): (32, 32),
    ("transformer_xl", "clip"): (4, 4),
    ("rope", "rotary_dim"): (4, 4),
    ("kerple", "r1_init"): (0.5, 0.5),
    ("learned", "max_len"): (7, 7),
    ("floater", "delta"): (1, 1.0),
    ("rope", "layout"): ("interleaved", "interleaved"),
}


@pytest.mark.parametrize("key,value,stored", [(k, *v) for k, v in VALID.items()], ids=[f"{n}.{f}" for n, f in VALID])
def test_valid_values_are_kept(key, value, stored):
    name, field = key
    got = getattr(posenc.build(name, d_model=32, num_heads=4, **{field: value}).config, field)
    assert got == stored and type(got) is type(stored)


def test_json_lists_become_tuples_and_int_floats_become_floats():
    """A raw JSON config: lists for the LongRoPE factor tuples, ints for float fields."""
    raw = json.loads('{"scaling": "longrope", "short_factor": [1, 1.5, 2, 2], "long_factor": [4, 4, 4, 4],'
                     ' "original_max_position_embeddings": 64, "factor": 2, "base": 10000}')
    enc = posenc.build("rope", d_model=32, num_heads=4, rotary_dim=8, **raw)
    assert enc.config.short_factor == (1.0, 1.5, 2.0, 2.0) and type(enc.config.short_factor) is tuple
    assert all(type(v) is float for v in enc.config.short_factor + enc.config.long_factor)
    assert type(enc.config.base) is float and type(enc.config.factor) is float
    # Same tables as the float spelling: the conversion changes no number.
    ref = posenc.build("rope", d_model=32, num_heads=4, rotary_dim=8, scaling="longrope",
                       short_factor=(1.0, 1.5, 2.0, 2.0), long_factor=(4.0,) * 4,
                       original_max_position_embeddings=64, factor=2.0, base=10000.0)
    pos = torch.arange(100)[None]
    q = torch.randn(1, 4, 100, 8, generator=torch.Generator().manual_seed(0))
    got, want = enc.rotate(q, q, pos, pos), ref.rotate(q, q, pos, pos)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    # The spec built from the raw JSON is hashable and equal to the float spelling's spec.
    spec = EncodingSpec("rope", raw)
    twin = EncodingSpec.of("rope", scaling="longrope", short_factor=(1.0, 1.5, 2.0, 2.0), long_factor=(4.0,) * 4,
                           original_max_position_embeddings=64, factor=2.0, base=10000.0)
    assert spec == twin and hash(spec) == hash(twin)


def test_unsupported_annotation_fails_loudly():
    @dataclasses.dataclass
    class Exotic(EncodingConfig):
        table: torch.Tensor | None = None

    with pytest.raises(TypeError, match=r"field 'table' of .*Exotic has an unsupported annotation"):
        Exotic()
    with pytest.raises(TypeError, match="unsupported annotation"):
        field_types(Exotic)

    @dataclasses.dataclass
    class Listy(EncodingConfig):
        sizes: list = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match=r"field 'sizes' .* unsupported annotation"):
        Listy()


def test_non_finite_floats_are_value_errors_naming_the_field():
    for bad in (float("nan"), float("inf"), -float("inf"), 10**400):
        with pytest.raises(ValueError, match=r"^base must be finite"):
            posenc.build("rope", d_model=32, num_heads=4, base=bad)
    with pytest.raises(ValueError, match=r"^short_factor\[1\] must be finite"):
        posenc.build("rope", d_model=32, num_heads=4, scaling="longrope", short_factor=[1.0, float("nan")],
                     long_factor=[1.0, 1.0], original_max_position_embeddings=64, factor=2.0)


# ---- the checker itself: golden messages written by hand -----------------------------------
@pytest.mark.parametrize(
    "value,tp,expected",
    [
        (True, bool, True),
        (3, int, 3),
        (3, float, 3.0),
        (None, Optional[int], None),
        (2, int | None, 2),
        ([1, 2], tuple[float, ...], (1.0, 2.0)),
        ([], tuple[float, ...], ()),
        (["a", 1], tuple[str, int], ("a", 1)),
        ("half", Literal["half", "interleaved"], "half"),
        ({"a": 1}, dict[str, Any], {"a": 1}),
    ],
)
def test_check_value_accepts(value, tp, expected):
    got = check_value("x", value, tp)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "value,tp,exc,message",
    [
        ("no", bool, TypeError, "x must be a bool, got str 'no'"),
        (1, bool, TypeError, "x must be a bool, got int 1"),
        (True, int, TypeError, "x must be an int, got bool True"),
        (2.0, int, TypeError, "x must be an int, got float 2.0"),
        (False, float, TypeError, "x must be a float, got bool False"),
        ("0.1", float, TypeError, "x must be a float, got str '0.1'"),
        (3, str, TypeError, "x must be a str, got int 3"),
        ("x", float | None, TypeError, "x must be a float or None, got str 'x'"),
        ("ab", tuple[float, ...], TypeError, "x must be a tuple (or list) of floats, got str 'ab'"),
        ([1.0, "a"], tuple[float, ...], TypeError, "x[1] must be a float, got str 'a'"),
        ([1], tuple[int, int], ValueError, "x must have 2 items, got 1: [1]"),
        ("full", Literal["half", "interleaved"], ValueError, "x must be one of 'half', 'interleaved'; got 'full'"),
        (1, Literal["half", "interleaved"], TypeError, "x must be one of 'half', 'interleaved', got int 1"),
        (float("nan"), float, ValueError, "x must be finite, got nan"),
        ({1: 2}, dict[str, Any], TypeError, "x key 1 must be a str, got int 1"),
    ],
)
def test_check_value_refuses(value, tp, exc, message):
    with pytest.raises(exc) as info:
        check_value("x", value, tp)
    assert str(info.value) == message


def test_check_int_maximum():
    check_int("n", 5, minimum=1, maximum=5)
    for value, kw, message in [
        (6, dict(minimum=1, maximum=5), "n must be in [1, 5], got 6"),
        (0, dict(minimum=1, maximum=5), "n must be in [1, 5], got 0"),
        (6, dict(maximum=5), "n must be <= 5, got 6"),
        (0, dict(minimum=1), "n must be >= 1, got 0"),
    ]:
        with pytest.raises(ValueError) as info:
            check_int("n", value, **kw)
        assert str(info.value) == message


def test_check_fields_on_a_frozen_dataclass():
    """The helper benchmark settings can call: converts in place even when frozen."""

    @dataclasses.dataclass(frozen=True)
    class Settings:
        factors: tuple[float, ...] = (1.0,)
        lr: float = 1e-3
        data: str | None = None

        def __post_init__(self) -> None:
            check_fields(self)

    s = Settings(factors=[1, 2], lr=1)
    assert s.factors == (1.0, 2.0) and type(s.factors) is tuple and type(s.lr) is float
    assert hash(s) == hash(Settings(factors=(1.0, 2.0), lr=1.0))
    with pytest.raises(TypeError, match=r"^data must be a str or None, got int 3$"):
        Settings(data=3)


# ---- ModelConfig ------------------------------------------------------------------------------
MODEL_WRONG = {
    "vocab_size": ["256", 2.0, True],
    "d_model": ["128", 128.0],
    "n_layer": [True],
    "n_head": [4.0],
    "n_kv_head": ["2", 2.0],
    "d_ff": [1.5],
    "causal": ["no", 0],
    "dropout": ["0.1", False],
    "encoding": [3, None, ["rope"]],
    "encoding_config": ["base=5", [("base", 5.0)]],
    "share_encoding": ["no"],
    "layer_encodings": ["rope", 3],
    "layer_pattern": ["rope", 3, {"encoding": "rope"}],
    "absolute_before_last": [1.0],
    "embed_scale": ["0.02", True],
    "attn_impl": [3],
    "tie_weights": ["no", 1],
    "mla": ["kv_lora_rank=16", 3, True, [("kv_lora_rank", 16)]],
}


def test_model_wrong_values_cover_every_field():
    assert set(MODEL_WRONG) == {f for f, _ in MODEL_FIELDS}


@pytest.mark.parametrize("field", list(MODEL_WRONG))
def test_model_config_wrong_type_is_refused_naming_the_field(field):
    assert MODEL_WRONG[field]
    for bad in MODEL_WRONG[field]:
        with pytest.raises(TypeError, match=rf"^{field} must be .*, got {type(bad).__name__} "):
            ModelConfig(**{field: bad})


@pytest.mark.parametrize("field", [f for f, _ in MODEL_FIELDS])
def test_model_config_default_given_explicitly_is_accepted(field):
    default = getattr(ModelConfig(), field)
    cfg = ModelConfig(**{field: default})
    assert getattr(cfg, field) == default


def test_model_config_int_dropout_and_list_layer_encodings():
    cfg = ModelConfig(dropout=0, n_layer=3, layer_encodings=["rope", None, {"name": "alibi"}])
    assert cfg.dropout == 0.0 and type(cfg.dropout) is float
    assert cfg.layer_encodings == ("rope", None, {"name": "alibi"})
    assert [s and s.name for s in cfg.layer_specs()] == ["rope", None, "alibi"]


# ---- unknown keys, encoding dicts, eager validation ----------------------------------------
def test_unknown_key_names_key_encoding_and_valid_keys():
    keys = get_info("rope").config_keys
    assert "base" in keys and "scaling" in keys
    with pytest.raises(TypeError) as info:
        posenc.build("rope", d_model=64, num_heads=4, foo=1)
    assert str(info.value) == f"unknown config key 'foo' for encoding 'rope'; valid keys: {', '.join(keys)}"
    with pytest.raises(TypeError) as info:
        ModelConfig(encoding="rope", encoding_config={"foo": 1})
    assert str(info.value) == f"encoding_config: unknown config key 'foo' for encoding 'rope'; valid keys: {', '.join(keys)}"
    with pytest.raises(TypeError, match=r"^unknown config key 'base' for encoding 'none'; valid keys: none"):
        posenc.build("none", d_model=64, num_heads=4, base=1.0)


def test_encoding_dict_errors():
    with pytest.raises(ValueError, match=r"^encoding: a dict needs the key 'name' .*got keys: 'config'$"):
        ModelConfig(encoding={"config": {"base": 5.0}})
    with pytest.raises(TypeError, match=r"^encoding: unknown key 'foo' for encoding 'rope'; an encoding dict takes "
                                        r"name, shared, config and the encoding's parameters: base, rotary_dim"):
        ModelConfig(encoding={"name": "rope", "foo": 1})
    with pytest.raises(TypeError, match=r"^encoding: unknown config key 'foo' for encoding 'rope'"):
        ModelConfig(encoding={"name": "rope", "config": {"foo": 1}})
    with pytest.raises(ValueError, match=r"^encoding: 'base' given both in config and at the top level$"):
        ModelConfig(encoding={"name": "rope", "config": {"base": 5.0}, "base": 6.0})
    with pytest.raises(TypeError, match=r"^encoding: shared must be a bool, got str 'no'$"):
        ModelConfig(encoding={"name": "rope", "shared": "no"})
    with pytest.raises(ValueError, match=r"^encoding: unknown encoding 'ropee'; valid encodings: none"):
        ModelConfig(encoding={"name": "ropee"})
    with pytest.raises(TypeError, match=r"^layer_encodings\[1\]: use_key must be a bool, got str 'no'$"):
        ModelConfig(n_layer=2, layer_encodings=("rope", {"name": "shaw", "use_key": "no"}))
    with pytest.raises(TypeError, match=r"^layer_encodings\[0\] must be an EncodingSpec or a str or a dict or None, got int 3$"):
        ModelConfig(n_layer=1, layer_encodings=(3,))
    with pytest.raises(ValueError, match=r"^encoding_config applies to `encoding`, which layer_encodings replaces"):
        ModelConfig(n_layer=1, layer_encodings=("rope",), encoding_config={"base": 5.0})


def test_encoding_dict_forms_agree():
    specs = [
        ModelConfig(encoding={"name": "rope", "base": 5e5}).layer_specs()[0],
        ModelConfig(encoding={"name": "rope", "config": {"base": 5e5}}).layer_specs()[0],
        ModelConfig(encoding={"name": "rope", "config": [["base", 500000]]}).layer_specs()[0],
        ModelConfig(encoding="rope", encoding_config={"base": 500000}).layer_specs()[0],
        ModelConfig(encoding=EncodingSpec.of("rope", base=5e5)).layer_specs()[0],
    ]
    assert specs[0] == EncodingSpec("rope", (("base", 500000.0),), True)
    assert all(s == specs[0] and hash(s) == hash(specs[0]) for s in specs)


def test_encoding_config_none_means_no_overrides():
    cfg = ModelConfig(encoding="rope", encoding_config=None)
    assert cfg.encoding_config == {}
    assert cfg.layer_specs() == ModelConfig(encoding="rope").layer_specs()
    assert ModelConfig(encoding={"name": "rope", "config": None}).layer_specs()[0] == EncodingSpec("rope")


def test_unhashable_values_are_converted_or_refused():
    spec = EncodingSpec.of("rope", scaling="longrope", short_factor=[1, 2], long_factor=[3, 4],
                           original_max_position_embeddings=64, factor=2.0)
    assert dict(spec.config)["short_factor"] == (1.0, 2.0)
    hash(spec)  # usable as the key that shares one module between layers
    with pytest.raises(TypeError, match=r"^encoding_config: kernel must be a str, got dict \{'a': 1\}$"):
        ModelConfig(encoding="rope", encoding_config={"kernel": {"a": 1}})
    with pytest.raises(TypeError, match=r"^base must be a float, got list \[1.0\]$"):
        EncodingSpec.of("rope", base=[1.0])


def test_spec_constructor_errors_name_the_parameter():
    with pytest.raises(TypeError, match=r"^encoding name must be a str .*got int 3$"):
        EncodingSpec.of(3)
    with pytest.raises(TypeError, match=r"^shared must be a bool, got str 'no'$"):
        EncodingSpec.of("rope", shared="no")
    with pytest.raises(TypeError, match=r"^encoding must be an EncodingSpec, an encoding name, a dict with 'name', or None; got int 5$"):
        EncodingSpec.coerce(5)
    with pytest.raises(ValueError, match=r"^config gives 'base' more than once"):
        EncodingSpec("rope", (("base", 1.5), ("base", 2.0)))
    with pytest.raises(TypeError, match=r"^layer_encodings\[2\]: config must be a dict of encoding parameters"):
        EncodingSpec.coerce({"name": "rope", "config": 7}, "layer_encodings[2]")


def test_model_config_fails_eagerly_not_at_transformer():
    """A bad encoding value fails at ModelConfig(...); before, 'no' was a truthy str that turned
    the learnable scale on without a word."""
    with pytest.raises(TypeError, match=r"^encoding_config: learnable_scale must be a bool, got str 'no'$"):
        ModelConfig(encoding="sinusoidal", encoding_config={"learnable_scale": "no"})
    with pytest.raises(ValueError, match=r"^encoding_config: base must be > 0, got -1.0$"):
        ModelConfig(encoding="rope", encoding_config={"base": -1.0})
    # A valid one still builds the same model as before.
    model = Transformer(ModelConfig(d_model=32, n_head=4, n_layer=2, encoding="sinusoidal",
                                    encoding_config={"learnable_scale": False}))
    assert model.encodings[0].scale is None


def test_model_config_round_trips_through_json():
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, encoding=EncodingSpec.of("rope", base=5e5),
                      share_encoding=False)
    back = ModelConfig(**json.loads(json.dumps(cfg.to_dict())))
    assert back.layer_specs() == cfg.layer_specs()
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=2, layer_encodings=("alibi", {"name": "t5", "num_buckets": 8}))
    back = ModelConfig(**json.loads(json.dumps(cfg.to_dict())))
    assert back.layer_specs() == cfg.layer_specs()


def test_preset_errors():
    with pytest.raises(TypeError, match=r"^unknown ModelConfig field 'foo'; valid fields: vocab_size, d_model"):
        preset("tiny", foo=1)
    with pytest.raises(ValueError, match=r"^unknown preset \['tiny'\]; valid presets: tiny, small, base$"):
        preset(["tiny"])
    with pytest.raises(TypeError, match=r"^causal must be a bool, got str 'no'$"):
        preset("tiny", causal="no")


# ---- registry.build dimensions ---------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,exc,message",
    [
        (dict(d_model=64.0, num_heads=4), TypeError, "d_model must be an int, got float 64.0"),
        (dict(d_model="64", num_heads=4), TypeError, "d_model must be an int, got str '64'"),
        (dict(d_model=True, num_heads=1), TypeError, "d_model must be an int, got bool True"),
        (dict(d_model=64, num_heads=4.0), TypeError, "num_heads must be an int, got float 4.0"),
        (dict(d_model=64, num_heads=0), ValueError, "num_heads must be >= 1, got 0"),
        (dict(d_model=64, num_heads=4, head_dim="16"), TypeError, "head_dim must be an int, got str '16'"),
        (dict(d_model=64, num_heads=4, head_dim=0), ValueError, "head_dim must be >= 1, got 0"),
        (dict(d_model=30, num_heads=4), ValueError, "d_model (30) must be divisible by num_heads (4)"),
    ],
)
def test_build_dimensions_are_checked(kwargs, exc, message):
    with pytest.raises(exc) as info:
        posenc.build("rope", **kwargs)
    assert str(info.value) == message


def test_build_name_must_be_a_str():
    with pytest.raises(TypeError, match=r"^encoding name must be a str \(one of: none, .*\), got list \['rope'\]$"):
        posenc.build(["rope"], d_model=64, num_heads=4)
