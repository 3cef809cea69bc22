"""Typed configuration: encoding configs, EncodingSpec, ModelConfig, registry.build (issue 10)."""

from __future__ import annotations

from posenc import EncodingSpec, ModelConfig, build, preset

from . import Case

A = "config"


def _build(name: str, **config):
    return build(name, d_model=32, num_heads=4, **config)


def _list_for_tuple_field() -> str:
    spec = EncodingSpec.of("rope", scaling="longrope", short_factor=[1, 2], long_factor=[3, 4],
                           original_max_position_embeddings=64, factor=2)
    hash(spec)  # must stay hashable: equal specs share one module
    return f"stored as a tuple of floats: short_factor={dict(spec.config)['short_factor']!r}"


def _none_encoding_config() -> str:
    cfg = ModelConfig(encoding="rope", encoding_config=None)
    return f"no overrides: encoding_config stored as {cfg.encoding_config!r}"


def _int_for_float_field() -> str:
    return f"accepted, stored as float: base={_build('rope', base=10000).config.base!r}"


CASES = [
    # bool fields accept only real bools: bool("no") is True, a silent wrong result
    Case(A, "sinusoidal learnable_scale='no'", r"^learnable_scale must be a bool, got str 'no'$",
         run=lambda: _build("sinusoidal", learnable_scale="no"), error=TypeError),
    Case(A, "convolutional bias='no'", r"^bias must be a bool, got str 'no'$",
         run=lambda: _build("convolutional", bias="no"), error=TypeError),
    Case(A, "shaw use_key='no'", r"^use_key must be a bool, got str 'no'$",
         run=lambda: _build("shaw", use_key="no"), error=TypeError),
    Case(A, "deberta c2p='no'", r"^c2p must be a bool, got str 'no'$",
         run=lambda: _build("deberta", c2p="no"), error=TypeError),
    Case(A, "rope yarn truncate=1 (an int for a bool)", r"^truncate must be a bool, got int 1$",
         run=lambda: _build("rope", scaling="yarn", factor=2.0, original_max_position_embeddings=64, truncate=1),
         error=TypeError),
    # int and float fields
    Case(A, "learned max_len=True (a bool for an int)", r"^max_len must be an int, got bool True$",
         run=lambda: _build("learned", max_len=True), error=TypeError),
    Case(A, "t5 num_buckets=32.0 (a float for an int)", r"^num_buckets must be an int, got float 32.0$",
         run=lambda: _build("t5", num_buckets=32.0), error=TypeError),
    Case(A, "rope base='10000' (a str for a float)", r"^base must be a float, got str '10000'$",
         run=lambda: _build("rope", base="10000"), error=TypeError),
    Case(A, "rope base=10**400 (an int too large for a float)", r"^base must be finite",
         run=lambda: _build("rope", base=10**400)),
    Case(A, "rope base=10000 (an int for a float field)", r"stored as float: base=10000.0",
         run=_int_for_float_field, error=None),
    Case(A, "rope short_factor=['1', 2] (a str item in a tuple field)", r"^short_factor\[0\] must be a float, got str '1'$",
         run=lambda: _build("rope", scaling="longrope", short_factor=["1", 2], long_factor=[1, 1],
                            original_max_position_embeddings=64, factor=2.0), error=TypeError),
    # ModelConfig fields
    Case(A, "ModelConfig(causal='no')", r"^causal must be a bool, got str 'no'$",
         run=lambda: ModelConfig(causal="no"), error=TypeError),
    Case(A, "ModelConfig(tie_weights='no')", r"^tie_weights must be a bool, got str 'no'$",
         run=lambda: ModelConfig(tie_weights="no"), error=TypeError),
    Case(A, "ModelConfig(share_encoding='no')", r"^share_encoding must be a bool, got str 'no'$",
         run=lambda: ModelConfig(share_encoding="no"), error=TypeError),
    Case(A, "ModelConfig(dropout='0.1')", r"^dropout must be a float, got str '0.1'$",
         run=lambda: ModelConfig(dropout="0.1"), error=TypeError),
    Case(A, "ModelConfig(attn_impl=3)", r"^attn_impl must be a str, got int 3$",
         run=lambda: ModelConfig(attn_impl=3), error=TypeError),
    Case(A, "ModelConfig(n_kv_head=2.0)", r"^n_kv_head must be an int or None, got float 2.0$",
         run=lambda: ModelConfig(n_kv_head=2.0), error=TypeError),
    Case(A, "preset('tiny', foo=1) (an unknown field)", r"^unknown ModelConfig field 'foo'; valid fields: vocab_size, ",
         run=lambda: preset("tiny", foo=1), error=TypeError),
    # unknown keys
    Case(A, "build('rope', ..., foo=1) (an unknown config key)",
         r"^unknown config key 'foo' for encoding 'rope'; valid keys: base, rotary_dim, .*kernel, factor, .*long_factor, .*$",
         run=lambda: _build("rope", foo=1), error=TypeError),
    Case(A, "ModelConfig(encoding='rope', encoding_config={'foo': 1})",
         r"^encoding_config: unknown config key 'foo' for encoding 'rope'; valid keys: base, ",
         run=lambda: ModelConfig(encoding="rope", encoding_config={"foo": 1}), error=TypeError),
    Case(A, "ModelConfig(encoding={'name': 'rope', 'foo': 1}) (an unknown key in an encoding dict)",
         r"^encoding: unknown key 'foo' for encoding 'rope'; an encoding dict takes name, shared, config and ",
         run=lambda: ModelConfig(encoding={"name": "rope", "foo": 1}), error=TypeError),
    # encoding dicts and specs
    Case(A, "ModelConfig(encoding={'config': {...}}) without 'name'",
         r"^encoding: a dict needs the key 'name' \(the encoding's registry name\); got keys: 'config'$",
         run=lambda: ModelConfig(encoding={"config": {"base": 5.0}})),
    Case(A, "an encoding dict with a key both in 'config' and at the top level",
         r"^encoding: 'base' given both in config and at the top level$",
         run=lambda: ModelConfig(encoding={"name": "rope", "config": {"base": 5.0}, "base": 6.0})),
    Case(A, "an unhashable config value (a dict for a str field)", r"^encoding_config: kernel must be a str, got dict",
         run=lambda: ModelConfig(encoding="rope", encoding_config={"kernel": {"a": 1}}), error=TypeError),
    Case(A, "a JSON list for a tuple field (short_factor=[1, 2])", r"short_factor=\(1.0, 2.0\)",
         run=_list_for_tuple_field, error=None),
    Case(A, "ModelConfig(encoding_config=None)", r"no overrides: encoding_config stored as \{\}",
         run=_none_encoding_config, error=None),
    Case(A, "a bad value in a layer_encodings entry", r"^layer_encodings\[1\]: use_key must be a bool, got str 'no'$",
         run=lambda: ModelConfig(n_layer=2, layer_encodings=("rope", {"name": "shaw", "use_key": "no"})),
         error=TypeError),
    Case(A, "a layer_encodings entry of the wrong type",
         r"^layer_encodings\[0\] must be an EncodingSpec or a str or a dict or None, got int 3$",
         run=lambda: ModelConfig(n_layer=1, layer_encodings=(3,)), error=TypeError),
    Case(A, "encoding_config together with layer_encodings (it would be ignored)",
         r"^encoding_config applies to `encoding`, which layer_encodings replaces",
         run=lambda: ModelConfig(n_layer=1, layer_encodings=("rope",), encoding_config={"base": 5.0})),
    Case(A, "EncodingSpec.of('rope', shared='no')", r"^shared must be a bool, got str 'no'$",
         run=lambda: EncodingSpec.of("rope", shared="no"), error=TypeError),
    Case(A, "EncodingSpec.coerce(5)",
         r"^encoding must be an EncodingSpec, an encoding name, a dict with 'name', or None; got int 5$",
         run=lambda: EncodingSpec.coerce(5), error=TypeError),
    # registry.build dimensions
    Case(A, "build('rope', d_model=64.0, num_heads=4)", r"^d_model must be an int, got float 64.0$",
         run=lambda: build("rope", d_model=64.0, num_heads=4), error=TypeError),
    Case(A, "build('rope', d_model=64, num_heads='4')", r"^num_heads must be an int, got str '4'$",
         run=lambda: build("rope", d_model=64, num_heads="4"), error=TypeError),
    Case(A, "build('rope', d_model=64, num_heads=4, head_dim=True)", r"^head_dim must be an int, got bool True$",
         run=lambda: build("rope", d_model=64, num_heads=4, head_dim=True), error=TypeError),
    Case(A, "build(['rope'], ...) (a non-str name)", r"^encoding name must be a str \(one of: none, .*got list",
         run=lambda: build(["rope"], d_model=64, num_heads=4), error=TypeError),
]
