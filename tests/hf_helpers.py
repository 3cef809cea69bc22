"""What the tests of patch_model on tiny transformers models share: one relative error for a whole
tensor, random token ids, logits without autograd, and generate patched against unpatched."""

from __future__ import annotations

import torch

from posenc.hf import patch_model

VOCAB = 64  # the tiny models' vocabulary


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b|: one number for the whole tensor."""
    assert a.shape == b.shape and b.abs().max() > 0
    return ((a - b).abs().max() / b.abs().max()).item()


def tokens(B: int, T: int, seed: int = 1, vocab: int = VOCAB) -> torch.Tensor:
    """(B, T) ids in [3, vocab): 0-2 stay free for padding and special tokens."""
    return torch.randint(3, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def logits(model, ids, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, **kw).logits


def generate_unpatched_then_patched(model, ids: torch.Tensor, pad: int, new: int = 6):
    """Greedy ``generate`` with a KV cache, row 0 left-padded by ``pad`` tokens: unpatched, then
    after ``patch_model(model)`` (left patched). Returns (want, got), each with its per-step logits."""
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0
    kw = dict(attention_mask=mask, max_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0,
              return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        patch_model(model)
        got = model.generate(ids, **kw)
    return want, got
