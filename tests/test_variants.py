"""Encoding variant specs (posenc.variants): typed values, canonical labels, loud errors."""

from __future__ import annotations

import dataclasses
import re

import pytest

from posenc import ModelConfig, build, get_info, list_encodings
from posenc.config import field_types
from posenc.variants import EncodingVariant, format_value, parse_typed, parse_variant


def test_values_are_typed_from_the_config_annotations():
    v = parse_variant("t5:num_buckets=64,max_distance=256,bidirectional=false,init_std=0.5")
    assert v == EncodingVariant("t5", (("num_buckets", 64), ("max_distance", 256), ("bidirectional", False),
                                       ("init_std", 0.5)))
    assert [type(x) for _, x in v.config] == [int, int, bool, float]
    # an int written for a float field is stored as the float (5e5 and 500000 are one variant)
    assert parse_variant("rope:base=500000") == parse_variant("rope:base=5e5") == EncodingVariant("rope", (("base", 500000.0),))
    assert parse_variant("kerple:variant=power,r1_init=none").config == (("variant", "power"),)  # r1_init=None is the default


def test_the_variant_builds_the_encoding_it_names():
    enc = build(**{"name": "rope", "d_model": 32, "num_heads": 2}, **parse_variant("rope:base=500000,layout=interleaved").config_dict())
    assert enc.config.base == 500000.0 and enc.config.layout == "interleaved"
    v = parse_variant("learned:init_std=0.5")
    table = v.build(d_model=8, num_heads=2, max_len=7)
    assert table.config.init_std == 0.5 and table.config.max_len == 7
    with pytest.raises(ValueError, match="encoding 'learned@init_std=0.5' already fixes init_std; not given again"):
        v.build(d_model=8, num_heads=2, init_std=0.1)
    t5 = build("t5", d_model=32, num_heads=2, **parse_variant("t5:num_buckets=8").config_dict())
    assert t5.config.num_buckets == 8


def test_label_is_canonical_and_reads_back():
    cases = {
        "rope": "rope",
        "rope:base=10000": "rope",  # the default value: the plain encoding
        "rope:layout=interleaved,base=5e5": "rope@base=500000.0,layout=interleaved",  # declaration order
        "t5:bidirectional=FALSE": "t5@bidirectional=false",
        "learned:init_std=1e-3": "learned@init_std=0.001",
    }
    for spec, label in cases.items():
        v = parse_variant(spec)
        assert v.label == label, spec
        assert parse_variant(v.label) == v  # the label is a spec of the same variant
        assert re.fullmatch(r"[A-Za-z0-9_.@=,;\-]+", v.label)  # safe as a folder name on every OS
        assert v.dirname == v.label


def test_every_registered_encoding_round_trips_its_defaults():
    """For each encoding, every field set to its own default value: the label is the bare name;
    and each field set through text gives back the typed default (so every annotation the
    registry uses can be written on the command line)."""
    names = list_encodings()
    assert names
    for name in names:
        fields = [f for f in dataclasses.fields(get_info(name).config_cls) if f.init and f.default is not dataclasses.MISSING]
        types = field_types(get_info(name).config_cls)
        for f in fields:
            assert parse_typed(f.name, format_value(f.default), types[f.name]) == f.default, (name, f.name)
        spec = name + (":" + ",".join(f"{f.name}={format_value(f.default)}" for f in fields) if fields else "")
        assert parse_variant(spec).label == name, spec


def test_rope_scaling_parameters_are_keys_too():
    v = parse_variant("rope:scaling=yarn,factor=4,original_max_position_embeddings=64")
    assert v.config_dict() == {"scaling": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


def test_tuples_are_separated_by_semicolons():
    assert parse_typed("xs", "1;2.5", tuple[float, ...]) == (1.0, 2.5)
    assert parse_typed("xs", "", tuple[float, ...]) == ()
    assert format_value((1.0, 2.5)) == "1.0;2.5"
    with pytest.raises(ValueError, match=r"xs\[1\] must be a float, got 'x'"):
        parse_typed("xs", "1;x", tuple[float, ...])


def test_long_label_gets_a_short_dirname():
    v = EncodingVariant("rope", (("short_factor", tuple(float(i) for i in range(40))),))
    assert len(v.label) > 100
    assert re.fullmatch(r"rope@[0-9a-f]{16}", v.dirname)
    assert v.dirname == EncodingVariant("rope", v.config).dirname  # stable


@pytest.mark.parametrize(
    "spec, error, message",
    [
        ("nope", ValueError, "unknown encoding 'nope'; valid encodings: none, "),
        ("rope:bse=3", ValueError, "unknown key 'bse' for encoding 'rope'; valid keys: base, rotary_dim, layout"),
        ("alibi:x=1", ValueError, "unknown key 'x' for encoding 'alibi'; valid keys: symmetric"),
        ("none:x=1", ValueError, "valid keys: none (it takes no parameters)"),
        ("rope:base", ValueError, "each item after ':' must be KEY=VALUE, got 'base'; valid keys for 'rope': base,"),
        ("rope:", ValueError, "each item after ':' must be KEY=VALUE, got ''"),
        ("rope:base=1,base=2", ValueError, "key 'base' is given twice"),
        ("rope:base=abc", ValueError, "base must be a float, got 'abc'"),
        ("rope:base=nan", ValueError, "base must be a finite float, got 'nan'"),
        ("rope:base=-2", ValueError, "base must be > 0, got -2.0"),  # the config's own range check
        ("rope:rotary_dim=7", ValueError, "rotary_dim must be even"),
        ("rope:rotary_dim=x", ValueError, "rotary_dim must be an int or none, got 'x'"),
        ("t5:num_buckets=2.5", ValueError, "num_buckets must be an int, got '2.5'"),
        ("alibi:symmetric=yes", ValueError, "symmetric must be true or false, got 'yes'"),
        ("rope:layout=a/b", ValueError, "layout must be text of letters, digits, '_', '.' or '-', got 'a/b'"),
        (3, TypeError, "encoding spec must be a str"),
    ],
)
def test_bad_specs_name_the_key_and_the_value(spec, error, message):
    with pytest.raises(error) as e:
        parse_variant(spec)
    assert message in str(e.value)
    if isinstance(spec, str) and ":" in spec:
        assert repr(spec) in str(e.value)  # the whole spec is quoted, so the user sees which one


def test_a_key_of_another_encoding_is_unknown_on_every_route():
    """T5's max_distance given to a clipped encoding is an unknown key listing the valid ones
    (clip among them) from build, an encoding dict in ModelConfig and a CLI variant spec."""
    with pytest.raises(TypeError, match="unknown config key 'max_distance' for encoding 'relative_key'; valid keys: clip"):
        build("relative_key", d_model=32, num_heads=4, max_distance=4)
    with pytest.raises(TypeError, match="unknown key 'max_distance' for encoding 'transformer_xl'.*base, clip"):
        ModelConfig(encoding={"name": "transformer_xl", "max_distance": 4})
    with pytest.raises(ValueError, match="unknown key 'max_distance' for encoding 'relative_key'; valid keys: clip"):
        parse_variant("relative_key:max_distance=4")
