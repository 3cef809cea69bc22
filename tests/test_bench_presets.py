"""The bench's presets and its fair token-embedding convention (issue 14).

* ``standard`` and ``paper`` run every registered encoding and every built-in task with >= 3
  seeds; an encoding registered later joins them without any edit (checked by registering one).
* ``embedding="unit"``: token embeddings N(0, 1), untied from the output layer, so the absolute
  codes designed for unit-scale embeddings (sinusoidal, FLOATER, recurrent) no longer drown
  them; ``embedding="gpt2"`` is the former model, bitwise.
"""

from __future__ import annotations

import dataclasses
import sys

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


# --------------------------------------------------------------------------- published orderings


def _tables(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "tables.py"
    spec = importlib.util.spec_from_file_location("tables_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    mod.RESULTS_DIR = tmp_path
    return mod


def _record(task, enc, seed, metric, L, points):
    return dict(task=task, encoding=enc, seed=seed, train_length=L, metric=metric, train_loss=1.0,
                train_seconds=1.0, parameters=1, points=[dict(variant=v, length=n, depth=None, value=x)
                                                         for v, n, x in points])


def test_orderings_verdicts_from_hand_made_results(tmp_path):
    """Numbers chosen by hand so that every verdict is known: lm ppl ratios (4L / L) sinusoidal
    3x and learned 2x in every seed (collapse), ALiBi 1.0x (flat), RoPE 2x (degrades), PI 0.5x
    of plain RoPE (repairs), YaRN 1.2x in one seed and 0.8x in the others (mixed); copy beyond L:
    NoPE 0.5, T5 0.4, the rest 0 in every seed, so NoPE's and T5's MRR lead by a constant."""
    from posenc.bench.report import collect
    from posenc.bench.files import write_json

    tables = _tables(tmp_path)
    ratio = {"sinusoidal": 3.0, "learned": 2.0, "alibi": 1.0, "rope": 2.0}
    records = []
    for seed in range(3):
        for enc, r in ratio.items():
            pts = [("base", 32, 10.0), ("base", 128, 10.0 * r)]
            if enc == "rope":
                pts += [("linear", 128, 10.0), ("yarn", 128, 20.0 * (1.2 if seed == 0 else 0.8))]
            records.append(_record("lm", enc, seed, "ppl", 32, pts))
        for enc, acc in dict(none=0.5, t5=0.4, alibi=0.0, rope=0.0, learned=0.0, sinusoidal=0.0).items():
            records.append(_record("copy", enc, seed, "accuracy", 2, [("base", 1, 1.0), ("base", 2, 1.0),
                                                                       ("base", 3, acc), ("base", 4, acc)]))
    data = collect(settings_for("standard", seeds=3, lm_eval_factors=(1, 4)), records)
    data["machine"] = "hand-made"
    write_json(tmp_path / "bench_standard.json", data)
    text = tables.render_bench_standard_orderings("docs/bench.md")
    rows = {line.split(" | ")[1]: line.split(" | ")[-1].rstrip(" |") for line in text.splitlines()
            if line.startswith("| Press") or line.startswith("| Kazemnejad")}
    assert rows == {
        "sinusoidal collapses beyond L (ratio ≥ 1.5)": "holds",
        "learned collapses beyond L (ratio ≥ 1.5)": "holds",
        "ALiBi stays flat (ratio ≤ 1.1)": "holds",
        "RoPE degrades (ratio > 1.1)": "holds",
        "linear (PI) repairs RoPE (ppl at 4L below plain RoPE's)": "holds",
        "YaRN repairs RoPE (ppl at 4L below plain RoPE's)": "mixed across seeds",
        **{f"{who} ahead of {o} on the synthetic tasks": "holds"
           for who in ("NoPE", "T5") for o in ("alibi", "rope", "learned", "sinusoidal")},
    }
    assert "lm ppl 4L / L: 3.00x [3.00, 3.00]" in text and "PI) / plain: 0.50x [0.50, 0.50]" in text
