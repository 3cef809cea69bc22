"""One schema per RoPE scaling (issue 11): each scaling is one ``Scaling`` entry and everything
else (RotaryConfig's parameters, from_hf / to_hf, the bench's list, listings) is derived from it.

The proof is a toy scaling registered here, with a parameter no built-in type has: it must be
accepted by ``posenc.build("rope", ...)``, type- and range-checked, read from and written to a
Hugging Face dict, listed, and evaluated by the bench, with no other edit. Also: every entry is
consistent, every parameter of every type is type-checked by name, RotaryConfig behaves as a
value (equality, copy, repr, round trip), and ``posenc.<family>`` imports lazily.
"""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import posenc
from posenc.config import field_types
from posenc.rotary import SCALINGS, HFSpec, RotaryConfig, Scaling, ScalingConfig, from_hf, list_scalings, to_hf
from posenc.rotary.hf_readings import hf_rope_keys
from posenc.rotary.scaling import register_scaling, unregister_scaling


@dataclasses.dataclass
class ToyScaling(ScalingConfig):
    """theta_i * alpha^(-i): a made-up scaling with a parameter no built-in type has."""

    alpha: float | None = None
    boost: float = 1.0

    def validate(self) -> None:
        if self.alpha is None:
            raise ValueError("alpha is required for this rope type, got None")
        posenc.config.check_range("alpha", self.alpha, 1.0, None)
        posenc.config.check_positive("boost", self.boost)


def _toy(inv_freq, cfg: ToyScaling, *, base, seq_len=None):
    i = torch.arange(inv_freq.numel(), dtype=torch.float64)
    return inv_freq * cfg.alpha ** (-i), cfg.boost


@pytest.fixture
def toy():
    entry = register_scaling(Scaling(
        "toy", ToyScaling, _toy, "theta_i alpha^-i", "this test",
        label="Toy", hf=HFSpec("toy_hf", keys={"alpha": "toy_alpha"}, required=("alpha",)),
        extension=lambda s, L: {"alpha": 1.0 + s / 100},
    ))
    try:
        yield entry
    finally:
        unregister_scaling("toy")


def test_a_registered_scaling_is_accepted_everywhere(toy):
    # RotaryConfig / build: the new parameter is a keyword like the built-in ones.
    rope = posenc.build("rope", d_model=32, num_heads=2, scaling="toy", alpha=2.0, boost=1.5)
    assert rope.config.alpha == 2.0 and rope.config.scaling_config == ToyScaling(alpha=2.0, boost=1.5)
    assert "alpha" in posenc.get_info("rope").config_keys
    base = posenc.rotary.base_inv_freq(16, 10000.0)
    want = base * 2.0 ** -torch.arange(8, dtype=torch.float64)  # the formula, by hand
    assert torch.equal(rope.inv_freq, want) and rope.attention_factor == 1.5
    # Its own bounds and types, named.
    with pytest.raises(ValueError, match=r"alpha must be in \[1.0, inf\), got 0.5"):
        posenc.build("rope", d_model=32, num_heads=2, scaling="toy", alpha=0.5)
    with pytest.raises(TypeError, match=r"^alpha must be a float or None, got str 'big'"):
        posenc.build("rope", d_model=32, num_heads=2, scaling="toy", alpha="big")
    with pytest.raises(ValueError, match=r"alpha not a parameter of rope type 'linear' \(it takes: factor\)"):
        posenc.build("rope", d_model=32, num_heads=2, scaling="linear", factor=2.0, alpha=2.0)
    # ModelConfig specs and set_scaling.
    spec = posenc.EncodingSpec.of("rope", scaling="toy", alpha=2)
    assert spec.config == (("alpha", 2.0), ("scaling", "toy"))  # checked and stored typed
    plain = posenc.build("rope", d_model=32, num_heads=2)
    plain.set_scaling("toy", alpha=2.0, boost=1.5)
    assert torch.equal(plain.inv_freq, want) and plain.config == rope.config
    # rope_frequencies.
    inv, af = posenc.rotary.rope_frequencies("toy", 16, 10000.0, alpha=2.0, boost=1.5)
    assert torch.equal(inv, want) and af == 1.5


def test_a_registered_scaling_reads_and_writes_hugging_face_dicts(toy):
    rope = posenc.build("rope", d_model=32, num_heads=2, scaling="toy", alpha=2.0)
    hf = to_hf(rope)
    assert hf == {"rope_parameters": {"rope_type": "toy_hf", "rope_theta": 10000.0, "toy_alpha": 2.0, "boost": 1.0},
                  "head_dim": 16}
    back = from_hf(hf)
    assert back.config.scaling == "toy" and torch.equal(back.inv_freq, rope.inv_freq)
    assert hf_rope_keys("toy_hf") >= {"toy_alpha", "boost"}
    # Its HF errors name the HF key, from the same checks.
    with pytest.raises(ValueError, match=r"rope_parameters\['toy_alpha'\] must be in \[1.0, inf\), got 0.5"):
        from_hf({"head_dim": 16, "rope_parameters": {"rope_type": "toy_hf", "toy_alpha": 0.5}})
    with pytest.raises(ValueError, match=r"rope type 'toy_hf' needs rope_parameters\['toy_alpha'\]"):
        from_hf({"head_dim": 16, "rope_parameters": {"rope_type": "toy_hf"}})
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'alpha' in rope_parameters for rope type 'toy_hf'"):
        from_hf({"head_dim": 16, "rope_parameters": {"rope_type": "toy_hf", "toy_alpha": 2.0, "alpha": 2.0}})
    # A family restricted to some types does not read it.
    with pytest.raises(ValueError, match=r"must be one of 'default', 'longrope' for model_type 'phi3'; got 'toy_hf'"):
        from_hf({"model_type": "phi3", "head_dim": 16, "rope_parameters": {"rope_type": "toy_hf", "toy_alpha": 2.0}})


def test_a_registered_scaling_is_listed_and_benchmarked(toy):
    from posenc.bench.evaluate import SCALINGS as BENCH, scaled_copies

    assert "toy" in list_scalings() and "toy" in list_scalings(extends=True) and "toy" in list_scalings(training_free=True)
    assert "toy" in BENCH and "toy" in tuple(BENCH)
    model = posenc.Transformer(posenc.ModelConfig(vocab_size=16, d_model=32, n_head=2, n_layer=1, encoding="rope"))
    copies = dict(scaled_copies(model, 4.0, 64, ("toy",)))
    ropes = [m for m in copies["toy"].modules() if isinstance(m, posenc.rotary.RotaryEmbedding)]
    assert ropes and all(m.config.scaling == "toy" and m.config.alpha == 1.04 for m in ropes)


def test_unregistered_toy_is_gone():
    # The fixture removes it: nothing else kept a copy of the list.
    assert "toy" not in list_scalings() and "toy" not in posenc.rotary.ROPE_SCALINGS
    with pytest.raises(ValueError, match=r"scaling must be one of 'default', .*; got 'toy'"):
        posenc.build("rope", d_model=32, num_heads=2, scaling="toy")


# ---- every entry ------------------------------------------------------------------------
ENTRIES = list(SCALINGS.values())


def test_the_listings_follow_the_entries():
    assert list_scalings() == [e.name for e in ENTRIES]
    assert list_scalings(extends=True) == [e.name for e in ENTRIES if e.extension is not None]
    assert list_scalings(training_free=True) == [e.name for e in ENTRIES if e.extension is not None and e.bench]
    # The paper scalings are there; the bench's default set is the one its committed tables used.
    assert {"default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"} <= set(list_scalings())
    assert {"linear", "ntk", "dynamic", "yarn"} <= set(list_scalings(training_free=True))
    assert "llama3" in list_scalings(extends=True) and "llama3" not in list_scalings(training_free=True)
    assert dict(posenc.rotary.ROPE_SCALINGS) == {e.name: e.fn for e in ENTRIES}
    assert dict(posenc.rotary.SCALING_CONFIGS) == {e.name: e.config for e in ENTRIES}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_entries_are_consistent(entry):
    assert entry.params == tuple(f.name for f in dataclasses.fields(entry.config))
    assert entry.label and isinstance(entry.label, str)
    ruled = not entry.params or entry.extension is not None or entry.illustration is not None
    if not ruled:
        with pytest.raises(ValueError, match=rf"scaling '{entry.name}' has no training-free rule"):
            entry.at_factor(4.0, 64, 8, illustrate=True)
    else:  # its rule gives parameters its own config accepts, for factor 4 x L = 64
        params = entry.at_factor(4.0, 64, 8, illustrate=True)
        posenc.rotary.rope_frequencies(entry.name, 8, 10000.0, seq_len=256, **params)
    if entry.hf is not None:
        keys = hf_rope_keys(entry.hf.rope_type)
        assert {entry.hf.key(p) for p in entry.params if p not in entry.hf.top_level} <= keys
    elif entry.hf_default_base is None and ruled:  # transformers has no spelling for it: to_hf says so
        rope = posenc.build("rope", d_model=32, num_heads=2, scaling=entry.name,
                            **entry.at_factor(4.0, 64, 16, illustrate=True))
        with pytest.raises(ValueError, match=rf"rope type '{entry.name}' has no transformers spelling"):
            to_hf(rope)


@pytest.mark.parametrize(
    "param,tp", sorted({(p, str(t)) for e in ENTRIES for p, t in field_types(e.config).items()}),
)
def test_every_scaling_parameter_is_type_checked_by_name(param, tp):
    # RotaryConfig holds no flat copy of these: the type's own config checks them.
    entry = next(e for e in ENTRIES if param in e.params)
    for bad in ("x", [1, "x"], {"a": 1}):
        if "tuple" in tp and bad == [1, "x"]:
            match = rf"^{param}\[1\] must be a float, got str 'x'"
        else:
            match = rf"^{param}(\[\d+\])? must be .*, got {type(bad).__name__} "
        with pytest.raises(TypeError, match=match):
            posenc.build("rope", d_model=32, num_heads=2, scaling=entry.name, **{param: bad})


def test_registering_a_bad_entry_is_an_error():
    with pytest.raises(ValueError, match="rope type 'yarn' is already registered"):
        register_scaling(SCALINGS["yarn"])
    with pytest.raises(ValueError, match="HF rope_type 'linear' already reads as 'linear'"):
        register_scaling(dataclasses.replace(SCALINGS["linear"], name="linear2"))
    with pytest.raises(ValueError, match=r"hf of scaling 'bad' names nope, not fields of LinearScaling"):
        Scaling("bad", SCALINGS["linear"].config, SCALINGS["linear"].fn, "", "", hf=HFSpec("bad", keys={"nope": "x"}))
    with pytest.raises(TypeError, match="config of scaling 'bad' must be a ScalingConfig subclass"):
        Scaling("bad", dict, SCALINGS["linear"].fn, "", "")
    with pytest.raises(TypeError, match="extension of scaling 'bad' must be callable or None, got 2"):
        Scaling("bad", SCALINGS["linear"].config, SCALINGS["linear"].fn, "", "", extension=2)
    with pytest.raises(TypeError, match="label of scaling 'bad' must be a str, got int"):
        Scaling("bad", SCALINGS["linear"].config, SCALINGS["linear"].fn, "", "", label=3)
    with pytest.raises(ValueError, match="scaling must be one of 'default', .*; got 'bad'"):
        unregister_scaling("bad")
    assert "bad" not in SCALINGS and "linear2" not in SCALINGS


# ---- RotaryConfig as a value ------------------------------------------------------------
def test_rotary_config_is_a_value():
    cfg = RotaryConfig(scaling="yarn", factor=4, original_max_position_embeddings=64, base=5e5)
    assert cfg.factor == 4.0 and type(cfg.factor) is float and cfg.low_freq_factor is None  # another type's
    assert cfg.to_dict() == {"base": 5e5, "rotary_dim": None, "layout": "half", "scaling": "yarn", "kernel": "auto",
                             "factor": 4.0, "original_max_position_embeddings": 64}
    assert RotaryConfig(**cfg.to_dict()) == cfg and copy.deepcopy(cfg) == cfg
    assert cfg != RotaryConfig(scaling="yarn", factor=2, original_max_position_embeddings=64, base=5e5)
    assert repr(cfg) == ("RotaryConfig(base=500000.0, rotary_dim=None, layout='half', scaling='yarn', kernel='auto', "
                         "factor=4.0, original_max_position_embeddings=64)")
    assert cfg.replace(base=1e4).to_dict() == cfg.to_dict() | {"base": 1e4}
    lin = cfg.with_scaling("linear", factor=2.0)  # the old parameters are dropped
    assert lin.scaling_params() == {"factor": 2.0} and lin.base == 5e5
    with pytest.raises(AttributeError, match="has no attribute 'fctor'"):
        cfg.fctor  # noqa: B018
    with pytest.raises(TypeError, match=r"RotaryConfig got unknown parameter\(s\) 'fctor'; valid: base, "):
        RotaryConfig(fctor=2.0)


def test_set_scaling_that_fails_keeps_the_old_scaling():
    rope = posenc.build("rope", d_model=8, num_heads=1, rotary_dim=2, scaling="linear", factor=2.0)
    before = rope.inv_freq.clone()
    with pytest.raises(ValueError, match="NTK scaling needs rotary_dim >= 4"):
        rope.set_scaling("ntk", factor=2.0)  # only the rotary dim can refuse it
    assert rope.config.scaling == "linear" and torch.equal(rope.inv_freq, before)


# ---- lazy family imports -------------------------------------------------------------------
def test_families_import_lazily_in_a_fresh_interpreter():
    # No registry call first (issue 11: `import posenc; posenc.rotary` was an AttributeError).
    src = str(Path(__file__).resolve().parents[1] / "src")
    code = (f"import sys; sys.path.insert(0, {src!r}); import posenc; "
            "print(posenc.rotary.RotaryEmbedding.__name__, posenc.relative.__name__, posenc.absolute.__name__); "
            "posenc.nonexistent")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["RotaryEmbedding", "posenc.relative", "posenc.absolute"], out.stderr
    assert out.stderr.strip().endswith("AttributeError: module 'posenc' has no attribute 'nonexistent'")


@pytest.mark.parametrize("param", sorted({p for e in ENTRIES for p, t in field_types(e.config).items()
                                          if "float" in str(t) and "tuple" not in str(t)}))
def test_every_float_scaling_parameter_refuses_nan_and_inf(param):
    entry = next(e for e in ENTRIES if param in e.params)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"^{param} must be finite, got {bad}"):
            posenc.build("rope", d_model=32, num_heads=2, scaling=entry.name, **{param: bad})
