"""posenc.hf.tasks: the text passkey's prompts (byte fallback and a saved tokenizer), greedy
decoding against transformers', and the registry a new real-model task joins."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_byte_llama import L, byte_llama, byte_llama_config  # noqa: E402

from posenc.bench.data import example_rng  # noqa: E402
from posenc.hf.checkpoint import ByteTokenizer  # noqa: E402
from posenc.hf.evaluation import HFCausalLM  # noqa: E402
from posenc.hf.tasks import TextPasskey  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return byte_llama()


def test_passkey_prompts_and_greedy_decoding(model):
    """Prompts are exactly n tokens with the key sentence at the depth; HFCausalLM.generate
    gives transformers' greedy tokens; the accuracy cell is recomputed with model.generate."""
    task = TextPasskey(ByteTokenizer(260))
    for depth in (0.0, 0.5, 1.0):
        ex = task.sample(2 * L, example_rng("eval", "passkey", 1234, 2 * L, depth), depth=depth)
        text = bytes(ex.prompt).decode()
        key = bytes(ex.target).decode().strip()
        assert len(ex.prompt) == 2 * L and len(key) == 5 and key.isdigit()
        assert text.startswith("There is a pass key hidden") and text.endswith("What is the pass key? The pass key is")
        at = text.index(f"The pass key is {key}.") / len(text)
        assert abs(at - depth) < 0.25, (depth, at)
    lm = HFCausalLM(model)
    prompts = torch.tensor([task.sample(L, example_rng("x", i), depth=0.5).prompt for i in range(3)])
    ours = lm.generate(prompts, 5)
    ref = model.generate(prompts, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, ref)


def _saved_tokenizer(folder):
    """A small byte-level BPE trained here (no download), saved as the checkpoint's tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["There is a pass key hidden in this text. The grass is green. The sky is blue. The sun is yellow.",
            "Here we go. There and back again. What is the pass key? Remember it. 12 345 6789 10000 99999"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")
    fast.save_pretrained(folder)
    return fast


def test_a_saved_tokenizer_is_used(tmp_path):
    """With a tokenizer in MODEL_DIR: prompts of exactly n of its tokens, BOS first, the key
    sentence decoded back from the prompt, every target the same length."""
    from posenc.hf.checkpoint import load_tokenizer, open_checkpoint

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(byte_llama_config(vocab_size=300)).save_pretrained(tmp_path)
    fast = _saved_tokenizer(tmp_path)
    tok = load_tokenizer(open_checkpoint(tmp_path))
    assert tok.kind == "model" and tok.bos_token_id == fast.bos_token_id
    task = TextPasskey(tok)
    assert task.min_length < 200  # BPE merges: fewer tokens than the 254 bytes
    examples = [task.sample(200, example_rng("t", i), depth=i / 4) for i in range(5)]
    for ex in examples:
        assert len(ex.prompt) == 200 and ex.prompt[0] == fast.bos_token_id
        key = fast.decode(list(ex.target)).strip()
        assert len(key) == 5 and key.isdigit()
        assert f"The pass key is {key}. Remember it." in fast.decode(list(ex.prompt))
    assert len({len(ex.target) for ex in examples}) == 1
    # a tokenizer with more tokens than the model's embedding is refused, not an IndexError later
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"vocab_size": 260}))
    with pytest.raises(ValueError, match=r"the tokenizer has 300 tokens but the model's vocab_size is 260"):
        load_tokenizer(open_checkpoint(tmp_path))


def test_a_new_task_is_one_registered_class(tmp_path, monkeypatch):
    """A ModelTask subclass registered by name runs through bench --model, its table and the
    report's cells, with no other change: nothing branches on a task's name."""
    import posenc.hf.tasks.base as base
    from posenc.analysis.real_model import model_bench_cells, model_bench_summary
    from posenc.hf import model_settings, run_model_bench
    from posenc.hf.bench_table import format_model_table
    from posenc.hf.tasks import ModelTask, model_task_names, register_model_task

    monkeypatch.setattr(base, "_MODEL_TASKS", dict(base._MODEL_TASKS))

    @register_model_task
    class FirstToken(ModelTask):
        """Whether greedy decoding after one BOS-like token repeats it (a smoke task)."""

        name = "first_token"
        value_label = "repeats, %"
        scale = 100.0

        def eval_lengths(self, s):
            return [self.train_length(s), 2 * self.train_length(s)]

        def cells(self, s, n):
            return [(n, 1, 1)]

        def evaluate_at(self, lm, s, n):
            ids = torch.full((1, n), 7)
            yield None, float(lm.generate(ids, 1)[0, -1] == 7)

    assert model_task_names()[-1] == "first_token"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(byte_llama_config()).save_pretrained(tmp_path / "ckpt")
    s, _ = model_settings("micro", tmp_path / "ckpt", tasks=["first_token"])
    results = run_model_bench(s, tmp_path / "out", progress=False)
    assert [r["task"] for r in results["runs"]] == ["first_token"]
    assert {(p["variant"], p["length"]) for p in results["runs"][0]["points"]} == {
        ("base", L), ("base", 2 * L), ("linear", 2 * L), ("raised_base", 2 * L)}
    assert "repeats, %; L = 256 tokens" in format_model_table(results)
    assert set(model_bench_cells(results)) == {"first_token"}
    assert model_bench_summary(results)[0].startswith("repeats, % at 512 tokens")
