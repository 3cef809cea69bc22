"""``bench --model`` with the attention methods as rows (settings ``methods``): on the tiny byte
Llama, a row per method beyond L only, each cell equal to a direct evaluation of a freshly
loaded model patched with ``patch_model(model, method=name, **recommended(L, n))`` and scored by
``token_perplexity``; a model type whose attention the methods cannot replace gets no method
rows by default and a ``ValueError`` when they are asked for."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_byte_llama import L, byte_llama_config  # noqa: E402

from posenc.methods import METHODS  # noqa: E402

NAMES = ("self_extend", "rerope", "dual_chunk")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """The tiny byte Llama with q and k scaled by 10 and the head by 4: at random init the
    attention is nearly uniform and every row's perplexity is the vocabulary's to 1e-6, which a
    1e-5 comparison cannot tell apart; sharpened, the methods move it by 1e-3."""
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny_llama_methods")
    model = transformers.LlamaForCausalLM(byte_llama_config())
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(10)
            layer.self_attn.k_proj.weight.mul_(10)
        model.lm_head.weight.mul_(4)
    model.save_pretrained(d)
    words = [b"alpha ", b"beta ", b"gamma\n", b"delta, ", b"epsilon. "]
    (d / "corpus.txt").write_bytes(b"".join(words[(i * 7) % 5] for i in range(10_000))[:40_000])
    return d


@pytest.fixture(scope="module")
def gptj(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny_gptj_methods")
    cfg = transformers.GPTJConfig(vocab_size=260, n_embd=32, n_layer=1, n_head=2, rotary_dim=8, n_positions=64)
    transformers.GPTJForCausalLM(cfg).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def bench(ckpt, tmp_path_factory):
    from posenc.hf.bench_model import run_model_bench
    from posenc.hf.bench_settings import model_settings

    s, _ = model_settings("micro", ckpt, data=str(ckpt / "corpus.txt"), overrides=dict(methods=NAMES))
    out = tmp_path_factory.mktemp("bench_methods") / "out"
    return s, run_model_bench(s, out, progress=False), out


def _points(results, task):
    pts = [p for r in results["runs"] if r["task"] == task for p in r["points"]]
    assert pts, f"no {task} points"
    return pts


def test_settings_hold_the_methods_as_rows_after_the_scalings(bench):
    s, _, _ = bench
    assert s.methods == NAMES and s.variants()[-3:] == list(NAMES) and s.trained_length == L


@pytest.mark.parametrize("task", ["lm", "passkey"])
def test_a_row_per_method_beyond_L_only(bench, task):
    s, results, _ = bench
    pts = _points(results, task)
    lengths = sorted({p["length"] for p in pts if p["variant"] == "base"})
    beyond = [n for n in lengths if n > L]
    assert lengths[0] <= L and beyond
    for name in NAMES:
        got = sorted({p["length"] for p in pts if p["variant"] == name})
        assert got == beyond, (name, got)


@torch.no_grad()
def test_each_method_cell_is_a_direct_evaluation(bench, ckpt):
    """A freshly loaded model, patched with the method at recommended(L, n), read by
    token_perplexity with the run's windows and trained=L: the same value, interval, count and
    perplexity past L."""
    from posenc.hf import patch_model
    from posenc.hf.checkpoint import load_tokenizer, open_checkpoint
    from posenc.hf.evaluation import HFCausalLM, token_perplexity, token_stream

    s, results, _ = bench
    pts = [p for p in _points(results, "lm") if p["variant"] in NAMES]
    assert {p["variant"] for p in pts} == set(NAMES)
    n_max = max(p["length"] for p in _points(results, "lm"))
    stream = token_stream(load_tokenizer(open_checkpoint(ckpt)), s.data, n_max + 1)
    base = {p["length"]: p["value"] for p in _points(results, "lm") if p["variant"] == "base"}
    for p in pts:
        n = p["length"]
        model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
        patch_model(model, method=p["variant"], **METHODS[p["variant"]].recommended(L, n))
        r = token_perplexity(HFCausalLM(model), stream, n, windows=max(1, s.lm_eval_tokens // n), trained=L)
        assert p["value"] == pytest.approx(r["ppl"], rel=1e-5), p
        assert (p["low"], p["high"]) == pytest.approx((r["low"], r["high"]), rel=1e-5)
        assert (p["beyond"], p["beyond_low"], p["beyond_high"]) == pytest.approx(
            (r["beyond"], r["beyond_low"], r["beyond_high"]), rel=1e-5)
        assert p["count"] == r["tokens"]
        assert abs(p["value"] / base[n] - 1) > 1e-4  # the method changed the numbers, by 10x the tolerance
    for a in pts:  # and each method differently
        for b in pts:
            assert a is b or a["length"] != b["length"] or abs(a["value"] / b["value"] - 1) > 1e-4, (a, b)


def test_rows_are_named_by_the_methods_labels(bench):
    from posenc.hf.bench_table import format_model_table
    from posenc.hf.scalings import variant_label

    _, results, _ = bench
    text = format_model_table(results)
    labels = [METHODS[name].label for name in NAMES]
    assert labels == ["Self-Extend", "ReRoPE", "Dual Chunk"]
    for name, label in zip(NAMES, labels):
        assert variant_label(results["settings"], name) == label
        assert any(line.startswith(f"+ {label} ") for line in text.splitlines()), (label, text)


def test_a_llama_gets_every_method_by_default_outside_micro(ckpt):
    from posenc.hf.bench_settings import model_settings
    from posenc.hf.scalings import MODEL_METHODS

    s, _ = model_settings("quick", ckpt)
    assert s.methods == MODEL_METHODS == NAMES
    assert model_settings("micro", ckpt)[0].methods == ()  # the smoke preset: scalings only


def test_a_model_without_method_support_gets_no_method_rows(gptj):
    from posenc.hf.bench_settings import model_settings

    for preset in ("micro", "quick", "standard"):
        s, _ = model_settings(preset, gptj)
        assert s.methods == () and not set(NAMES) & set(s.variants()), preset


@pytest.mark.parametrize("preset", ["micro", "quick"])
def test_asking_methods_of_such_a_model_is_a_value_error(gptj, preset):
    from posenc.hf.bench_settings import model_settings

    with pytest.raises(ValueError, match=r"^methods with MODEL '.*tiny_gptj_methods\d*': model_type 'gptj' is not one "
                                         r"whose attention the methods can replace \(llama, mistral, qwen2, qwen3\)$"):
        model_settings(preset, gptj, overrides=dict(methods=("rerope",)))


def test_an_unknown_method_is_a_value_error_listing_them(ckpt):
    from posenc.hf.bench_settings import model_settings

    with pytest.raises(ValueError, match=r"^methods \(with --model: the training-free attention methods\) must be one "
                                         r"of 'self_extend', 'rerope', 'dual_chunk'; got 'chunk'$"):
        model_settings("micro", ckpt, overrides=dict(methods=("chunk",)))
