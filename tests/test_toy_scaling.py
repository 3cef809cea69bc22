"""A new RoPE scaling is one registry entry in one module (issue 21).

The toy scaling below lives in a module written into the test's temporary folder and imported
with importlib: importing it registers it (one ``register_scaling`` call), the fixture
unregisters it. Nothing else is edited, and everything that lists, sets, labels or draws
scalings picks it up:

* the probe offers and sets it (``probe_scalings``, ``ProbeSettings``, ``variant_ropes``) and
  names it by its label in figures and tables;
* the ``rope-scaling`` plot draws it at its rule's parameters, under its label;
* the bench evaluates it by default and its tables and captions say its label;
* every registry-parametrized scaling test runs on it: a pytest subprocess with the module
  imported as a plugin (before collection) collects and passes a ``[toy_ramp]`` case in each
  parametrized table.

The toy: theta_i / (1 + (s - 1) i / (d/2 - 1)), divisors ramping linearly from 1 (highest
frequency) to s (lowest); transformers would call it ``toy_ramp`` (an HF spelling, so from_hf
and to_hf carry it too).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from posenc.rotary import SCALINGS, RotaryEmbedding, base_inv_freq, list_scalings, rope_frequencies
from posenc.rotary.scaling import unregister_scaling
from helpers import import_module_file, run_suites_with_plugin, write_module

NAME, LABEL = "toy_ramp", "Toy ramp"

TOY_MODULE = '''
"""A toy RoPE scaling: one entry, registered on import."""
from dataclasses import dataclass

import torch

from posenc.config import check_range
from posenc.rotary.scaling import register_scaling
from posenc.rotary.scaling.schema import HFSpec, Scaling, ScalingConfig


@dataclass
class ToyRampScaling(ScalingConfig):
    factor: float | None = None

    def validate(self) -> None:
        if self.factor is None:
            raise ValueError("factor is required for this rope type, got None")
        check_range("factor", self.factor, 1.0, None)


def toy_ramp(inv_freq, cfg, *, base, seq_len=None):
    n = inv_freq.numel()
    i = torch.arange(n, dtype=torch.float64, device=inv_freq.device)
    return inv_freq / (1.0 + (cfg.factor - 1.0) * i / max(n - 1, 1)), 1.0


ENTRY = register_scaling(Scaling(
    "toy_ramp", ToyRampScaling, toy_ramp, "theta_i / (1 + (s - 1) i / (d/2 - 1))", "tests/test_toy_scaling.py",
    label="Toy ramp", hf=HFSpec("toy_ramp", required=("factor",)), extension=lambda s, L: {"factor": s},
))
'''


def _by_hand(rotary_dim: int, base: float, s: float) -> torch.Tensor:
    n = rotary_dim // 2
    return base_inv_freq(rotary_dim, base) / torch.tensor([1.0 + (s - 1.0) * i / (n - 1) for i in range(n)],
                                                          dtype=torch.float64)


def _write_module(folder: Path) -> Path:
    return write_module(folder, "posenc_toy_scaling", TOY_MODULE)


@pytest.fixture
def toy(tmp_path):
    module = import_module_file(tmp_path, "posenc_toy_scaling", TOY_MODULE)  # registers the entry
    try:
        yield module.ENTRY
    finally:
        unregister_scaling(NAME)
        sys.modules.pop(module.__name__, None)


def test_the_toy_is_registered_by_its_module_alone(toy):
    assert SCALINGS[NAME] is toy and toy.label == LABEL
    assert NAME in list_scalings(extends=True) and NAME in list_scalings(training_free=True)
    inv, af = rope_frequencies(NAME, 16, 10000.0, **toy.at_factor(4.0, 64))
    torch.testing.assert_close(inv, _by_hand(16, 10000.0, 4.0), rtol=0, atol=0)
    assert af == 1.0


def test_unregistered_after_the_fixture():
    assert NAME not in SCALINGS and NAME not in list_scalings()


def test_the_probe_offers_sets_and_labels_it(toy):
    pytest.importorskip("transformers")
    from posenc.hf.probe import ProbeSettings, curve_label, probe_scalings, variant_ropes
    from posenc.rotary import from_hf

    assert NAME in probe_scalings() and NAME in ProbeSettings().scalings
    rope = from_hf({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "rope_theta": 10000.0})
    ropes = variant_ropes(rope, 64, 4.0, 16.0, (NAME,))
    assert isinstance(ropes[NAME], RotaryEmbedding) and ropes[NAME].config.scaling == NAME
    torch.testing.assert_close(ropes[NAME].inv_freq, _by_hand(16, 10000.0, 4.0), rtol=0, atol=0)
    assert curve_label(NAME) == LABEL and curve_label("model") == "model"


def test_the_probe_figure_and_table_say_its_label(toy, tmp_path):
    """`posenc probe` on a tiny saved Llama draws the toy (its curve is in probe.json) and its
    report section names it by its label."""
    pytest.importorskip("matplotlib")
    transformers = pytest.importorskip("transformers")
    from posenc.cli import main
    from posenc.hf.probe import html_section

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ckpt = tmp_path / "tiny"
    transformers.LlamaForCausalLM(cfg).save_pretrained(ckpt)
    (ckpt / "text.txt").write_text("def f(x):\n    return x * 2\n" * 8)
    out = tmp_path / "probe"
    assert main(["probe", str(ckpt), "--out", str(out), "--text", str(ckpt / "text.txt"), "--tokens", "40",
                 "--dtype", "float32", "--points", "40", "--scalings", NAME, "--extend", "4", "--no-progress"]) == 0
    import json

    data = json.loads((out / "probe.json").read_text())
    assert NAME in data["layers"]["0"]["curves"]
    html = html_section(data, sorted(out.glob("probe_layer*.png")), out / "probe.json")
    assert f"<td>{LABEL}</td>" in html and f"<td>{NAME}</td>" not in html


def test_the_rope_scaling_plot_draws_it(toy, tmp_path):
    pytest.importorskip("matplotlib")
    from posenc.analysis.figures import make_plot

    d = make_plot("rope-scaling", tmp_path, dim=32, factor=4.0).data
    assert NAME not in d["skipped"] and d["label"][NAME] == LABEL
    torch.testing.assert_close(d["inv_freq"][NAME], _by_hand(32, 10000.0, 4.0), rtol=0, atol=0)


def test_the_bench_evaluates_and_labels_it(toy):
    import posenc
    from posenc.bench.evaluate import SCALINGS as BENCH, scaled_copies
    from posenc.bench.report import figure_captions, variant_label

    assert NAME in tuple(BENCH)
    model = posenc.Transformer(posenc.ModelConfig(vocab_size=16, d_model=32, n_head=2, n_layer=1, encoding="rope"))
    copies = dict(scaled_copies(model, 4.0, 64, (NAME,)))
    ropes = [m for m in copies[NAME].modules() if isinstance(m, RotaryEmbedding)]
    assert ropes and all(m.config.scaling == NAME and m.config.factor == 4.0 for m in ropes)
    assert variant_label("rope", NAME) == f"rope + {LABEL}"
    runs = [dict(task="lm", encoding="rope", seed=0, train_length=8, metric="ppl",
                 points=[dict(variant=v, length=16, depth=None, value=2.0) for v in ("base", NAME)])]
    assert f"({LABEL})" in figure_captions({"runs": runs})["scaling_lm"]


# Files whose tests are parametrized over the registry, and the cases each must collect for
# the toy (parametrized ids contain its name; the named tests check whole-registry listings).
SUITES = {
    "tests/test_rotary_scaling.py": r"\[toy_ramp\]",
    "tests/test_rotary_schema.py": r"\[toy_ramp\]|test_the_listings_follow_the_entries",
    "tests/test_rotary_hf_to_hf.py": r"\[toy_ramp-\d+\]|test_every_scaling_is_covered",
    "tests/test_rotary_hf.py": r"test_every_registered_type_is_covered",
    "tests/test_analysis_figures.py": r"test_rope_scaling",
}


def test_every_registry_parametrized_test_runs_on_it(tmp_path):
    pytest.importorskip("transformers")
    _write_module(tmp_path)  # imported by pytest as a plugin (-p), so registered before collection
    select = "toy_ramp or listings or covered or test_rope_scaling"
    passed = run_suites_with_plugin(tmp_path, "posenc_toy_scaling", select, SUITES)
    toy_cases = [t for t in passed if "toy_ramp" in t]
    # every registry-parametrized table (invariances, purity, tiny params, entries, round trip,
    # transformers parity-or-skip) ran a toy case
    assert len(toy_cases) >= 6, toy_cases
