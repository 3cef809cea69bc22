"""posenc.hf.tasks' RULER tasks (multikey, vartrack) and what they share with passkey (needle.py).

Every prompt is read back by a slow reference parser: the decoded text parsed by regular
expressions, each needle sentence found again among the prompt's tokens, the answer worked
out from the text alone (the asked key's needle; the chain of assignments followed hop by
hop) and compared with the example's target.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_byte_llama import L, byte_llama_config  # noqa: E402

from posenc.bench.data import example_rng  # noqa: E402
from posenc.bench.evaluate import exact_match  # noqa: E402
from posenc.hf.bench_settings import ModelBenchSettings  # noqa: E402
from posenc.hf.checkpoint import ByteTokenizer, load_tokenizer, open_checkpoint  # noqa: E402
from posenc.hf.tasks import (  # noqa: E402
    MultiKeyNeedle, TextPasskey, VariableTracking, default_model_task_names, model_task_names)

MK_NEEDLE = re.compile(r" One of the special magic numbers for (\w+) is: (\d{5})\.")
MK_QUESTION = re.compile(r" What is the special magic number for (\w+) mentioned in the provided text\?"
                         r" The special magic number for \1 mentioned in the provided text is$")
VT_FIRST = re.compile(r" VAR ([A-Z]{5}) = (\d{5})\.")
VT_HOP = re.compile(r" VAR ([A-Z]{5}) = VAR ([A-Z]{5})\.")
VT_QUESTION = re.compile(r" Question: What is the value of VAR ([A-Z]{5})\? Answer: The value of VAR \1 is$")
DEPTHS = (0.0, 0.37, 0.5, 1.0)


def _bpe_folder(folder):
    """A small byte-level BPE trained here on the tasks' own words (no download), saved with a
    tiny Llama: a tokenizer whose merges make sentences fewer tokens than bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["Some special magic numbers are hidden within the following text. Make sure to memorize it.",
            "One of the special magic numbers for apple is: 7. What is the special magic number for river",
            "mentioned in the provided text? Memorize and track the chain(s) of variable assignment hidden",
            "VAR ABCDE = VAR FGH. Question: What is the value of VAR XY? Answer: The value of VAR Z is",
            "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>").save_pretrained(folder)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(byte_llama_config(vocab_size=400)).save_pretrained(folder)
    return folder


def _smollm2_folder():
    """The real SmolLM2-135M's folder (its tokenizer: GPT-2-style byte-level BPE, 49152 tokens),
    skipped as tests/test_real_models.py skips it: only when its package cannot be installed."""
    pytest.importorskip("gguf")
    from posenc.hf.models import resolve_model

    try:
        return resolve_model("smollm2-135m")
    except ValueError as e:
        if "install" in str(e) and "failed" in str(e):
            pytest.skip(f"smollm2-135m cannot be installed here (offline?): {e}")
        raise


@pytest.fixture(scope="module", params=["bytes", "bpe", "smollm2"])
def tok(request, tmp_path_factory):
    """The byte-level fallback, a small BPE trained here, and the real SmolLM2 tokenizer."""
    if request.param == "bytes":
        return ByteTokenizer(260)
    folder = _bpe_folder(tmp_path_factory.mktemp("bpe")) if request.param == "bpe" else _smollm2_folder()
    return load_tokenizer(open_checkpoint(folder))


def _find(ids, sub, start=0):
    """Index of the token run ``sub`` in ``ids`` at or after ``start`` (a slow scan), or -1."""
    for i in range(start, len(ids) - len(sub) + 1):
        if ids[i:i + len(sub)] == sub:
            return i
    return -1


def _needles(task, ex, pattern_list):
    """Every needle sentence of the prompt, in text order: (text, match, token start, token count),
    each sentence found again as its own tokens in the prompt; plus the question's token count."""
    ids = list(ex.prompt)
    bos = [] if task.tok.bos_token_id is None else [task.tok.bos_token_id]
    assert ids[:len(bos)] == bos
    text = task.tok.decode(ids[len(bos):])
    found = sorted((m.start(), m) for p in pattern_list for m in p.finditer(text))
    out, at = [], 0
    for _, m in found:
        sub = task.tok.encode(m.group(0))
        at = _find(ids, sub, at)
        assert at >= 0, m.group(0)
        out.append((m.group(0), m, at, len(sub)))
        at += len(sub)
    return text, out


def _filler_before(task, needles, which):
    """Filler tokens before needle ``which``: its start less the head and the needles before it."""
    start = needles[which][2]
    return start - len(task.head) - sum(n for _, _, s, n in needles if s < start)


def _check_depth(task, ex, needles, which, question_tokens, depth, n):
    n_fill = n - len(task.head) - sum(k for *_, k in needles) - question_tokens
    u = len(task.unit_ids)
    before = _filler_before(task, needles, which)
    assert 0 <= before <= n_fill
    assert before % u == 0 or before == n_fill, (before, u)  # between whole filler units
    assert abs(before - depth * n_fill) <= u / 2 + 1e-9, (before, depth, n_fill)


def _examples(task):
    """(n, depth, example): 3 examples at each of 3 lengths (the shortest first) and each depth,
    drawn as the bench draws them, each exactly n tokens with a target of the usual length."""
    out = []
    for n in (task.min_length, task.min_length + 37, 2 * task.min_length + 5):
        for depth in DEPTHS:
            rng = example_rng("eval", task.name, 1234, n, depth)
            for _ in range(3):
                ex = task.sample(n, rng, depth=depth)
                assert len(ex.prompt) == n and len(ex.target) == task.target_len
                out.append((n, depth, ex))
    assert len(out) == 3 * len(DEPTHS) * 3
    return out


def test_multikey_prompts_parse_back_to_the_target(tok):
    task = MultiKeyNeedle(tok)
    for n, depth, ex in _examples(task):
        text, needles = _needles(task, ex, [MK_NEEDLE])
        assert text.startswith("Some special magic numbers are hidden within the following text.")
        q = MK_QUESTION.search(text)
        assert q, text[-200:]
        keys = [m.group(1) for _, m, _, _ in needles]
        values = [m.group(2) for _, m, _, _ in needles]
        assert len(needles) == MultiKeyNeedle.NEEDLES
        assert len(set(keys)) == len(keys) and len(set(values)) == len(values)
        (asked,) = [i for i, k in enumerate(keys) if k == q.group(1)]
        assert task.tok.decode(list(ex.target)) == " " + values[asked]
        assert ex.target == tuple(task.tok.encode(" " + values[asked]))
        _check_depth(task, ex, needles, asked, len(task.tok.encode(q.group(0))), depth, n)


def _resolve(assign, name):
    """The value ``name`` holds, following assignments one hop at a time; (value, hops)."""
    hops = 0
    while not assign[name].isdigit():
        name, hops = assign[name], hops + 1
    return assign[name], hops


def test_vartrack_prompts_parse_back_to_the_target(tok):
    task = VariableTracking(tok)
    for n, depth, ex in _examples(task):
        text, needles = _needles(task, ex, [VT_FIRST, VT_HOP])
        q = VT_QUESTION.search(text)
        assert q and text.startswith("Memorize and track the chain(s) of variable assignment")
        names = [m.group(1) for _, m, _, _ in needles]
        assert len(needles) == 2 * (VariableTracking.HOPS + 1) and len(set(names)) == len(names)
        assign, order = {}, {}
        for i, (_, m, _, _) in enumerate(needles):
            if m.re is VT_HOP:
                assert m.group(2) in assign, "a variable used before its assignment"
            assign[m.group(1)], order[m.group(1)] = m.group(2), i
        value, hops = _resolve(assign, q.group(1))
        assert hops == VariableTracking.HOPS
        assert ex.target == tuple(task.tok.encode(" " + value))
        roots = [m.group(1) for _, m, _, _ in needles if m.re is VT_FIRST]
        other = [r for r in roots if assign[r] != value]
        assert len(roots) == 2 and len(other) == 1  # a distractor chain with another value
        (root,) = [r for r in roots if assign[r] == value]
        _check_depth(task, ex, needles, order[root], len(task.tok.encode(q.group(0))), depth, n)


@pytest.mark.parametrize("cls", [MultiKeyNeedle, VariableTracking, TextPasskey])
def test_examples_are_deterministic_per_seed_and_fit_min_length(cls):
    task = cls(ByteTokenizer(260))
    n = task.min_length

    def draw(seed, depth):
        rng = example_rng("eval", task.name, seed, n, depth)
        return [task.sample(n, rng, depth=depth) for _ in range(4)]

    assert draw(1234, 0.5) == draw(1234, 0.5)
    assert draw(1234, 0.5) != draw(1235, 0.5)
    # the shortest length fits every example (no layout error), at every depth
    for seed in range(50):
        for depth in (0.0, 1.0, seed / 50):
            assert len(task.sample(n, example_rng("fit", seed), depth=depth).prompt) == n
    with pytest.raises(ValueError, match=rf"^length must be >= {n}, got {n - 1}$"):
        task.sample(n - 1, example_rng("x"), depth=0.5)


def test_a_batch_has_equal_target_lengths_with_a_bpe_tokenizer(tmp_path):
    tok = load_tokenizer(open_checkpoint(_bpe_folder(tmp_path)))
    for cls in (MultiKeyNeedle, VariableTracking):
        task = cls(tok)
        assert task.min_length < len(task.head) + 400  # merges: far fewer tokens than bytes
        rng = example_rng("eval", task.name, 1, 300, 0.5)
        lengths = Counter(len(task.sample(300, rng, depth=0.5).target) for _ in range(40))
        assert set(lengths) == {task.target_len}


def test_exact_match_scores_the_targets():
    """exact_match draws the examples as the bench does; a model that always answers one
    example's target scores exactly the examples sharing it."""
    task = MultiKeyNeedle(ByteTokenizer(260))
    n = task.min_length
    examples = [task.sample(n, example_rng("eval", task.name, 7, n, 0.5), depth=0.5) for _ in range(1)]

    class Parrot(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def generate(self, prompts, k):
            answer = torch.tensor(examples[0].target)
            return torch.cat([prompts, answer.expand(len(prompts), k)], dim=1)

    assert exact_match(Parrot(), task, n, 1, eval_seed=7, depth=0.5) == 1.0
    assert exact_match(Parrot(), task, n, 3, eval_seed=8, depth=0.5) == 0.0


def test_the_ruler_tasks_run_only_when_named():
    assert model_task_names() == ("passkey", "lm", "multikey", "vartrack")
    assert default_model_task_names() == ("passkey", "lm")
    assert ModelBenchSettings(model="m", fingerprint="f", trained_length=256).tasks == ("passkey", "lm")


def test_too_short_lengths_are_skipped_then_refused(capsys):
    task = MultiKeyNeedle(ByteTokenizer(260))
    s = ModelBenchSettings(model="m", fingerprint="f", trained_length=L, passkey_eval_factors=(1.0, 3.0))
    assert task.eval_lengths(s) == [3 * L]
    assert f"multikey lengths [{L}] are shorter than a multikey prompt ({task.min_length} tokens): skipped" \
        in capsys.readouterr().err
    s = ModelBenchSettings(model="m", fingerprint="f", trained_length=L, passkey_eval_factors=(1.0, 2.0))
    with pytest.raises(ValueError, match=rf"^every multikey length \(256, 512\) is shorter than a multikey prompt "
                                         rf"\({task.min_length} tokens\); use --tasks lm$"):
        task.eval_lengths(s)


def test_bench_model_runs_the_ruler_tasks(tmp_path):
    """`posenc bench --model` with --tasks multikey vartrack: every point has its interval and
    count, and one cell is recomputed with transformers' own greedy generate."""
    from posenc.cli import main
    from posenc.results import read_results

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(byte_llama_config()).save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "out"
    assert main(["bench", "--model", str(tmp_path / "ckpt"), "--preset", "micro", "--tasks", "multikey", "vartrack",
                 "--passkey-eval-factors", "1", "3", "--out", str(out), "--no-progress"]) == 0
    results = read_results(out)
    assert [r["task"] for r in results["runs"]] == ["multikey", "vartrack"]
    for r in results["runs"]:
        pts = {(p["variant"], p["length"], p["depth"]): p for p in r["points"]}
        # 256 tokens is shorter than either prompt: skipped; 768 (3 L) is beyond L: the scaled rows too
        assert set(pts) == {(v, 3 * L, d) for v in ("base", "linear", "raised_base") for d in (0.0, 1.0)}
        for p in pts.values():
            assert p["count"] == 4 and 0 <= p["low"] <= p["value"] <= p["high"] <= 1
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"), dtype=torch.float32).eval()
    task, n = VariableTracking(ByteTokenizer(260)), 3 * L
    rng = example_rng("eval", task.name, 1234, n, 1.0)
    examples = [task.sample(n, rng, depth=1.0) for _ in range(4)]
    prompts = torch.tensor([e.prompt for e in examples])
    gen = model.generate(prompts, max_new_tokens=task.target_len, do_sample=False, pad_token_id=0)[:, n:]
    acc = sum(gen[i].tolist() == list(e.target) for i, e in enumerate(examples)) / 4
    (cell,) = [p["value"] for r in results["runs"] if r["task"] == "vartrack" for p in r["points"]
               if p["variant"] == "base" and p["depth"] == 1.0]
    assert cell == acc
