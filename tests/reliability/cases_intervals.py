"""Confidence intervals (``posenc.intervals``), the recommended settings of the attention methods
(``recommended(trained, target)``) and the perplexity past L (``token_perplexity(trained=L)``) on
bad inputs."""

from __future__ import annotations

import torch

from . import Case

A = "confidence intervals"
R = "recommended method settings"


def _wilson(*args):
    from posenc.intervals import wilson

    return wilson(*args)


def _bootstrap(nll, **kw):
    from posenc.intervals import block_bootstrap_ppl

    return block_bootstrap_ppl(nll, **kw)


def _recommended(name, trained, target):
    from posenc.methods import METHODS

    return METHODS[name].recommended(trained, target)


def _perplexity(trained):
    import transformers

    from posenc.hf.evaluation import HFCausalLM, token_perplexity

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=16)).eval()
    return token_perplexity(HFCausalLM(model), torch.arange(40) % 32, 16, 2, trained=trained, reps=10)


def _huge_loss():
    ppl, low, high = _bootstrap(torch.full((10,), 1000.0), block=2, reps=10)
    return f"perplexity {ppl}, interval [{low}, {high}]"


CASES = [
    Case(A, "Wilson interval with more successes than trials", r"successes must be in \[0, 10\], got 11",
         run=lambda: _wilson(11, 10)),
    Case(A, "Wilson interval of 0 trials", r"trials must be >= 1, got 0", run=lambda: _wilson(0, 0)),
    Case(A, "Wilson interval with a fractional trial count", r"trials must be an int, got float 10.0",
         run=lambda: _wilson(3, 10.0), error=TypeError),
    Case(A, "Wilson interval with successes True", r"successes must be an int, got bool True",
         run=lambda: _wilson(True, 10), error=TypeError),
    Case(A, "block bootstrap of a 2-D loss tensor",
         r"nll must be a non-empty 1-D tensor of per-token losses, got shape \(3, 4\)",
         run=lambda: _bootstrap(torch.zeros(3, 4))),
    Case(A, "block bootstrap of no losses", r"got shape \(0,\)", run=lambda: _bootstrap(torch.zeros(0))),
    Case(A, "block bootstrap with block 0", r"block must be >= 1, got 0",
         run=lambda: _bootstrap(torch.zeros(5), block=0)),
    Case(A, "block bootstrap with confidence 1.5", r"confidence must be in \[0.0, 1.0\], got 1.5",
         run=lambda: _bootstrap(torch.zeros(5), confidence=1.5)),
    Case(A, "block bootstrap of a mean loss past exp's range (1000 nats)", r"perplexity nan, interval \[nan, nan\]",
         run=_huge_loss, error=None),
    Case(A, "perplexity past L with trained 0", r"trained must be >= 1, got 0", run=lambda: _perplexity(0)),
    Case(A, "perplexity past L with a fractional trained length", r"trained must be an int, got float 2.5",
         run=lambda: _perplexity(2.5), error=TypeError),
    Case(R, "Self-Extend's recommended settings for trained length 3",
         r"trained must be in \[4, 9007199254740991\], got 3", run=lambda: _recommended("self_extend", 3, 100)),
    Case(R, "ReRoPE's recommended settings for trained length 7",
         r"trained must be in \[8, 9007199254740991\], got 7", run=lambda: _recommended("rerope", 7, 100)),
    Case(R, "Dual Chunk's recommended settings for target 0",
         r"target must be in \[1, 9007199254740991\], got 0", run=lambda: _recommended("dual_chunk", 64, 0)),
    Case(R, "recommended settings for a fractional trained length", r"trained must be an int, got float 64.0",
         run=lambda: _recommended("self_extend", 64.0, 100), error=TypeError),
]
