"""The bench's encoding entries (issue 30): a spec's training options and ``L`` values
(posenc.bench.entries), randomized positions in training and evaluation (posenc.bench.randomized,
Ruoss et al. 2023) and HoPE at each task's own training length."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from posenc.bench.build import build_batches, build_model, evaluation_model, train_config
from posenc.bench.data import IGNORE
from posenc.bench.entries import BenchEntry, parse_entry
from posenc.bench.randomized import RandomizedEval
from posenc.bench.runner import run_bench
from posenc.bench.settings import ROPE_VARIANTS, settings_for
from posenc.bench.tasks import get_task
from posenc.bench.train import train
from posenc.results import read_results

HOPE = "rope@scaling=hope,original_max_position_embeddings=L"


# --------------------------------------------------------------------------- specs and labels


@pytest.mark.parametrize("spec,label", [
    ("rope", "rope"),
    ("rope:randomized_positions=4", "rope@randomized_positions=4"),
    ("rope:randomized_positions=4,base=5e5", "rope@base=500000.0,randomized_positions=4"),
    ("rope:scaling=hope,original_max_position_embeddings=L", HOPE),
    ("learned:max_len=L,randomized_positions=2", "learned@max_len=L,randomized_positions=2"),
])
def test_a_spec_has_one_label_and_the_label_reads_back(spec, label):
    entry = parse_entry(spec)
    assert entry.label == label and parse_entry(label) == entry
    assert entry.dirname == label


def test_an_l_value_is_the_training_length_and_the_rest_the_variant():
    e = parse_entry(HOPE)
    assert e.train_length_keys == ("original_max_position_embeddings",) and e.randomized_positions is None
    assert e.config(23) == {"scaling": "hope", "original_max_position_embeddings": 23}
    assert parse_entry("rope:randomized_positions=4").position_range(21) == 84
    assert parse_entry("rope").position_range(21) is None


@pytest.mark.parametrize("spec,message", [
    ("rope:randomized_positions=0", "randomized_positions must be >= 1, got 0"),
    ("rope:randomized_positions=1.5", "randomized_positions must be an int, got '1.5'"),
    ("rope:randomized_positions", "randomized_positions needs a value"),
    ("rope:randomized_positions=2,randomized_positions=3", "key 'randomized_positions' is given twice"),
    ("rope:base=L", "base=L needs an int config key"),
    ("rope:scaling=hope", "original_max_position_embeddings is required for rope type 'hope'"),
    ("rope:foo=L", "encoding spec 'rope:foo=L': unknown key 'foo'"),
])
def test_bad_specs_are_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_entry(spec)


def test_a_training_option_that_is_also_a_config_key_is_refused(monkeypatch):
    from posenc.registry import get_info

    info = get_info("none")
    monkeypatch.setattr(type(info), "config_keys", property(lambda self: ("randomized_positions",)))
    with pytest.raises(ValueError, match="both a bench training option and a config key of encoding 'none'"):
        parse_entry("none:randomized_positions=2")


def test_bench_entry_checks_its_option():
    with pytest.raises(TypeError, match="randomized_positions must be an int"):
        BenchEntry(parse_entry("rope").variant, randomized_positions=True)


# --------------------------------------------------------------------------- HoPE at each task's L


def _rotary(model):
    return next(m for m in model.modules() if callable(getattr(m, "set_scaling", None)))


@pytest.mark.parametrize("preset", ["standard", "paper"])
def test_hope_cuts_at_each_tasks_own_training_length(preset):
    """theta_i kept where 2 pi / theta_i <= L (Chen et al. 2025), L = the task's training tokens:
    written out here from the base, not through posenc's scaling function."""
    s = settings_for(preset)
    assert HOPE in s.encodings
    kept = set()
    for task in s.tasks:
        L = get_task(task).train_tokens(s)
        d = s.d_model // s.n_head
        theta = torch.tensor([10000.0 ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
        want = torch.where(2 * math.pi / theta <= L, theta, torch.zeros_like(theta))
        got = _rotary(build_model(s, HOPE, task, 0)).inv_freq
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
        kept.add(int((want > 0).sum()))
    if preset == "paper":  # head size 32: the tasks' lengths cut at different pairs
        assert len(kept) > 1


def test_p_rope_keeps_three_quarters_of_the_pairs_and_differs_from_hope():
    s = settings_for("standard")
    p_rope = _rotary(build_model(s, ROPE_VARIANTS["p-RoPE"], "copy", 0)).inv_freq
    hope = _rotary(build_model(s, ROPE_VARIANTS["HoPE"], "copy", 0)).inv_freq
    assert int((p_rope > 0).sum()) == 3 * p_rope.numel() // 4 and not torch.equal(p_rope, hope)


# --------------------------------------------------------------------------- randomized positions


def _micro(**kw):
    return settings_for("micro", **kw)


@pytest.mark.parametrize("task", ["copy", "passkey", "lm"])
def test_randomized_batches_are_sorted_samples_of_each_rows_tokens(task):
    from posenc.bench.data import load_corpus

    s = _micro()
    corpus = load_corpus(None, max_bytes=s.lm_train_bytes) if task == "lm" else None
    spec = "rope:randomized_positions=4"
    R = 4 * s.max_positions(task)
    batches = build_batches(s, task, 0, corpus, parse_entry(spec).label)
    plain = build_batches(s, task, 0, corpus)
    for step in (0, 1):
        b, p = batches(step), plain(step)
        assert torch.equal(b.inputs, p.inputs) and torch.equal(b.labels, p.labels) and p.positions is None
        assert torch.equal(b.positions, batches(step).positions)  # a pure function of the step
        for row, labels in zip(b.positions, b.labels):
            has = (labels != IGNORE).nonzero()
            n = int(has.max()) + 1  # the row's tokens run to its last target
            real, pad = row[:n], row[n:]
            assert (real[1:] > real[:-1]).all() and 0 <= int(real.min()) and int(real.max()) < R
            assert not pad.any()
    assert not torch.equal(batches(0).positions, batches(1).positions)


def test_randomized_nope_trains_exactly_as_nope():
    """NoPE reads no position: the option changes nothing, bit for bit (why no preset runs it)."""
    s = _micro(steps=3)
    weights = []
    for spec in ("none", "none@randomized_positions=4"):
        model = build_model(s, spec, "copy", 0)
        train(model, build_batches(s, "copy", 0, None, spec), train_config(s, 0), progress=False)
        weights.append(model.state_dict())
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_randomized_rope_reads_its_positions():
    s = _micro(steps=3)
    losses = []
    for spec in ("rope", "rope@randomized_positions=4"):
        model = build_model(s, spec, "copy", 0)
        result = train(model, build_batches(s, "copy", 0, None, spec), train_config(s, 0), progress=False)
        losses.append(result.last_loss)
    assert losses[0] != losses[1]


def test_randomized_eval_of_nope_decodes_as_the_kv_cache_does():
    """For NoPE the positions are irrelevant, so RandomizedEval's full-forward decoding must give
    the model's own KV-cache generate, token for token."""
    s = _micro()
    model = build_model(s, "none", "copy", 0).eval()
    view, _ = evaluation_model(s, model, "copy", "none@randomized_positions=4")
    prompts = torch.randint(0, 10, (4, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(view.generate(prompts, 6), model.generate(prompts, 6))


def test_randomized_eval_draws_sorted_positions_in_its_range_and_repeats_per_task():
    s = _micro()
    model = build_model(s, "rope", "copy", 0).eval()
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(args[1].positions.clone()))
    for _ in range(2):
        view, s_eval = evaluation_model(s, model, "copy", "rope@randomized_positions=3")
        assert isinstance(view, RandomizedEval) and s_eval.scalings == ()
        with torch.no_grad():
            view(torch.zeros(3, 7, dtype=torch.long))
    a, b = seen
    R = 3 * s.max_positions("copy")
    assert torch.equal(a, b) and a.shape == (3, 7)  # seeded by (eval seed, task): the same draws
    assert (a[:, 1:] > a[:, :-1]).all() and int(a.max()) < R


def test_only_plain_models_get_the_training_free_scalings():
    s = _micro()
    model = build_model(s, "rope", "copy", 0)
    assert evaluation_model(s, model, "copy", "rope") == (model, s)
    for spec in (HOPE, ROPE_VARIANTS["p-RoPE"]):  # set_scaling would replace their own rope type
        m = build_model(s, spec, "copy", 0)
        assert evaluation_model(s, m, "copy", spec) == (m, dataclasses.replace(s, scalings=()))


def test_a_bench_run_with_the_variants_resumes_by_label(tmp_path, monkeypatch):
    specs = ["rope", "rope:randomized_positions=4", "rope:scaling=hope,original_max_position_embeddings=L"]
    s = _micro(encodings=specs, tasks=["copy", "count"])
    run_bench(s, tmp_path, progress=False)
    data = read_results(tmp_path / "results.json")
    variants = {(r["encoding"], r["variant"]) for r in data["summary"]}
    assert ("rope", "linear") in variants
    assert {v for e, v in variants if e != "rope"} == {"base"}  # no scaled rows for the variants
    assert {e for e, _ in variants} == {"rope", "rope@randomized_positions=4", HOPE}
    import posenc.bench.runner as runner

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(runner, "train", no_training)
    again = run_bench(s, tmp_path, resume=True, progress=False)  # every run found by its label: nothing trains
    assert [r["train_loss"] for r in again["runs"]] == [r["train_loss"] for r in data["runs"]]
    assert (tmp_path / "runs" / "copy" / "rope@randomized_positions=4" / "seed0" / "result.json").is_file()
