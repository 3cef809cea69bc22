"""The bench's presets and its fair token-embedding convention (issue 14).

* ``standard`` and ``paper`` run every registered encoding and every built-in task with >= 3
  seeds; an encoding registered later joins them without any edit (checked by registering one).
* ``embedding="unit"``: token embeddings N(0, 1), untied from the output layer, so the absolute
  codes designed for unit-scale embeddings (sinusoidal, FLOATER, recurrent) no longer drown
  them; ``embedding="gpt2"`` is the former model, bitwise.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posenc import ModelConfig, Transformer
from posenc.bench import runner
from posenc.bench.runner import EMBEDDINGS, PRESETS, BenchSettings, build_model, settings_for
from posenc.bench.tasks import TASK_NAMES, VOCAB_SIZE
from posenc.registry import list_encodings


def test_standard_runs_every_registered_encoding_and_task():
    s = settings_for("standard")
    registered = list_encodings()
    assert len(registered) >= 19
    assert s.encodings == tuple(registered)
    assert s.tasks == TASK_NAMES and s.seeds >= 3


def test_paper_runs_every_registered_encoding_and_task():
    s = settings_for("paper")
    assert s.encodings == tuple(list_encodings()) and s.tasks == TASK_NAMES and s.seeds >= 3
    assert s.d_model > settings_for("standard").d_model  # the GPU size, not the CPU one


def test_an_encoding_registered_later_joins_standard():
    from posenc.absolute.none import NoPE
    from posenc.registry import _REGISTRY, register

    assert "h7_probe" not in list_encodings()
    try:
        register("h7_probe", family="absolute", summary="a test double", paper="none")(
            type("Probe", (NoPE,), {})
        )
        assert "h7_probe" in settings_for("standard").encodings
        assert "h7_probe" in settings_for("paper").encodings
        assert "h7_probe" not in settings_for("quick").encodings  # an explicit list stays as written
    finally:
        _REGISTRY.pop("h7_probe", None)
    assert "h7_probe" not in settings_for("standard").encodings


def test_full_is_the_former_name_of_paper(capsys):
    assert settings_for("full") == settings_for("paper")
    assert "preset 'full' is now called 'paper'" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["huge", "Standard", None, 3])
def test_unknown_preset_lists_the_valid_ones(bad):
    with pytest.raises(ValueError, match=r"unknown preset .*; valid presets: micro, quick, standard, paper$"):
        settings_for(bad)


def test_embedding_setting_is_checked():
    with pytest.raises(ValueError, match=r"embedding must be one of 'unit', 'gpt2'; got 'sqrt'"):
        settings_for("micro", embedding="sqrt")
    assert set(EMBEDDINGS) == {"unit", "gpt2"}


def _micro(**kw) -> BenchSettings:
    return settings_for("micro", d_model=64, n_head=4, **kw)


def test_gpt2_convention_is_the_plain_model_bitwise():
    s = _micro(embedding="gpt2")
    model = build_model(s, "learned", "copy", seed=3)
    torch.manual_seed(3)
    plain = Transformer(ModelConfig(vocab_size=VOCAB_SIZE, d_model=64, n_layer=1, n_head=4, encoding="learned",
                                    encoding_config={"max_len": runner._max_positions(s, "copy")}))
    a, b = model.state_dict(), plain.state_dict()
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert model.head.weight is model.tok_emb.weight


def test_unit_convention_puts_tokens_and_absolute_codes_on_one_scale():
    s = _micro()
    assert s.embedding == "unit"  # the default
    model = build_model(s, "learned", "copy", seed=0)
    tok = model.tok_emb.weight
    assert model.head.weight is not tok  # untied: the output layer keeps its small init
    assert abs(model.head.weight.std().item() - 0.02) < 0.005
    assert abs(tok.std().item() - 1.0) < 0.1  # 20 x 64 draws: std within 10 %
    learned = [m for m in model.modules() if type(m).__name__ == "LearnedPositionalEmbedding"]
    assert len(learned) == 1
    rows = [p for n, p in learned[0].named_parameters()]
    assert len(rows) == 1 and abs(rows[0].std().item() - 1.0) < 0.1  # the table at the tokens' scale


@pytest.mark.parametrize("convention, low, high", [("unit", 0.5, 1.0), ("gpt2", 25.0, 45.0)])
def test_sinusoidal_amplitude_against_the_tokens(convention, low, high):
    """RMS of the sin/cos code over the RMS of a token embedding: 1/sqrt(2) / 1 under "unit",
    1/sqrt(2) / 0.02 = 35 under "gpt2" (the waves drown the tokens)."""
    model = build_model(_micro(embedding=convention), "sinusoidal", "copy", seed=0)
    pe = [m for m in model.modules() if type(m).__name__ == "SinusoidalEncoding"]
    assert len(pe) == 1
    code = pe[0].table(torch.arange(12)[None]).float()  # (1, 12, 64)
    ratio = code.pow(2).mean().sqrt() / model.tok_emb.weight.pow(2).mean().sqrt()
    assert low < ratio.item() < high


def test_settings_record_the_convention():
    s = _micro()
    assert s.comparable()["embedding"] == "unit"  # a resume under the other convention is refused
    assert dataclasses.replace(s, embedding="gpt2").comparable() != s.comparable()


def test_every_preset_builds_a_model_for_every_encoding():
    """A preset cannot name a size some encoding refuses (checked before hours of other runs)."""
    names = [p for p in PRESETS if p not in runner.RENAMED_PRESETS]
    assert names == ["micro", "quick", "standard", "paper"]
    for preset in ("standard",):  # paper: the same code path at d_model 256 (slow to build x19)
        s = settings_for(preset)
        task = max(s.tasks, key=lambda t: runner._max_positions(s, t))
        for enc in s.encodings:
            assert isinstance(build_model(s, enc, task, 0), Transformer)
