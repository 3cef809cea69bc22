"""posenc.hf.evaluation: HFCausalLM's chunked loss against the model's own full logits."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_byte_llama import byte_llama  # noqa: E402

from posenc.hf.evaluation import HFCausalLM  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return byte_llama()


@torch.no_grad()
def test_nll_keeps_no_full_logits_and_equals_the_full_forward(model, monkeypatch):
    """HFCausalLM.nll runs the head on chunks (never more than head_chunk positions at once) and
    gives the summed loss of the model's own full logits."""

    torch.manual_seed(1)
    ids = torch.randint(0, 260, (2, 100))
    lm = HFCausalLM(model, head_chunk=16)
    widths = []
    head = lm.head
    monkeypatch.setattr(lm, "head", lambda h: widths.append(h.shape[1]) or head(h))
    total, count = lm.nll(ids)
    logits = model(input_ids=ids[:, :-1]).logits
    ref = float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"))
    assert count == 2 * 99 and total == pytest.approx(ref, rel=1e-5)
    assert max(widths) == 16 and sum(widths) == 99


@torch.no_grad()
def test_greedy_decode_uses_the_current_cache_api_and_equals_generate(model):
    """No FutureWarning/DeprecationWarning (transformers 5.24 warns that ``past_key_values`` goes
    in 5.40), and the tokens transformers' own greedy ``generate`` gives."""
    import warnings

    torch.manual_seed(2)
    prompts = torch.randint(3, 260, (2, 40))
    lm = HFCausalLM(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        got = lm.generate(prompts, 6)
    want = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=6, min_new_tokens=6,
                          do_sample=False, pad_token_id=0)
    assert got.shape == (2, 46) and torch.equal(got, want)


def test_a_short_text_blames_the_length_that_asks_for_it(tmp_path):
    from posenc.hf.checkpoint import ByteTokenizer
    from posenc.hf.evaluation import token_stream

    data = tmp_path / "small.txt"
    data.write_text("alpha beta\n" * 300)
    with pytest.raises(ValueError, match=r"^--to 9999 needs 10000 tokens of text; the validation part of --data '.*"
                                         r"small\.txt' is \d+: ask for fewer tokens, or give a larger corpus with --data$"):
        token_stream(ByteTokenizer(260), str(data), 10_000, asks="--to 9999")
