"""The encodings of issue 23 (dynamic_bias, cope, fox, pope, the hope and proportional RoPE
scalings, randomized positions): config values refused by name, and inputs they refuse."""

from __future__ import annotations

import torch

from posenc import SequenceInfo, build

from . import Case


def _randomized(seq: SequenceInfo, max_length) -> None:
    from posenc.absolute.randomized import randomized_positions

    randomized_positions(seq, max_length)


def _fox_score_without_layer_input() -> None:
    enc = build("fox", d_model=8, num_heads=2)
    q, pos = torch.zeros(1, 2, 3, 4), torch.arange(3)[None]
    enc.score(q, q, pos, pos)


def _fox_keys_without_their_gates() -> None:
    from posenc import Attention
    from posenc.encoding import QKProjection

    enc = build("fox", d_model=8, num_heads=2)
    q, k = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 5, 4)  # one query against 5 keys, no cache
    enc.terms(q, k, None, QKProjection.of(Attention(8, 2), torch.zeros(1, 1, 8)))


A = "new encodings"
CASES = [
    Case(A, "dynamic_bias width=10**6", r"width must be in \[1, 4096\], got 1000000",
         run=lambda: build("dynamic_bias", d_model=8, num_heads=2, width=10**6)),
    Case(A, "dynamic_bias depth=0", r"depth must be in \[1, 16\], got 0",
         run=lambda: build("dynamic_bias", d_model=8, num_heads=2, depth=0)),
    Case(A, "cope max_pos=10**9", r"max_pos must be in \[1, 65536\], got 1000000000",
         run=lambda: build("cope", d_model=8, num_heads=2, max_pos=10**9)),
    Case(A, "cope init_std=-1", r"init_std must be in \[0.0, 10000.0\], got -1.0",
         run=lambda: build("cope", d_model=8, num_heads=2, init_std=-1.0)),
    Case(A, "fox bias_init=100", r"bias_init must be in \[-50.0, 50.0\], got 100.0",
         run=lambda: build("fox", d_model=8, num_heads=2, bias_init=100.0)),
    Case(A, "fox's dense score without the layer input its gates read",
         r"fox computes its forget gates from the attention layer's input",
         run=_fox_score_without_layer_input),
    Case(A, "fox keys before the call's tokens without a KV cache's sums",
         r"fox needs the forget gates of all 5 keys",
         run=_fox_keys_without_their_gates),
    Case(A, "pope base=1 (frequencies would not decrease)", r"base must be > 1 .*got 1.0",
         run=lambda: build("pope", d_model=8, num_heads=2, base=1.0)),
    Case(A, "pope bias_init='normal'", r"bias_init must be one of 'zeros', 'uniform'; got 'normal'",
         run=lambda: build("pope", d_model=8, num_heads=2, bias_init="normal")),
    Case(A, "pope at position 2**53 (float64 angles no longer hold every integer)",
         r"^positions must be <= 9007199254740991 \(2\*\*53 - 1.*got 9007199254740992$",
         run=lambda: build("pope", d_model=8, num_heads=2).rotate(
             torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), torch.tensor([[2**53]]), torch.tensor([[0]]))),
    Case(A, "rope scaling='proportional' proportion=1.5", r"proportion must be in \[0.0, 1.0\], got 1.5",
         run=lambda: build("rope", d_model=8, num_heads=2, scaling="proportional", proportion=1.5)),
    Case(A, "rope scaling='proportional' on part of the head written to a transformers config",
         r"rotary_dim must be head_dim \(8\) to write rope type 'proportional': transformers reads its "
         r"partial_rotary_factor as the scaling's own parameter, not the rotated width; got 4",
         run=lambda: build("rope", d_model=16, num_heads=2, rotary_dim=4, scaling="proportional",
                           proportion=0.5).to_hf()),
    Case(A, "rope scaling='hope' without the trained length",
         r"original_max_position_embeddings is required for rope type 'hope'",
         run=lambda: build("rope", d_model=8, num_heads=2, scaling="hope")),
    Case(A, "randomized positions from a range shorter than a document",
         r"max_length must be > every position .*got 4",
         run=lambda: _randomized(SequenceInfo.from_offset(1, 6), 4)),
    Case(A, "randomized positions max_length=10**9", r"max_length must be in \[1, 16777216\], got 1000000000",
         run=lambda: _randomized(SequenceInfo.from_offset(1, 6), 10**9)),
    Case(A, "randomized positions of a tensor, not a SequenceInfo", r"seq must be a SequenceInfo, got Tensor",
         error=TypeError, run=lambda: _randomized(torch.arange(4)[None], 10)),
    Case(A, "randomized positions of a patch grid (multi-axis positions)",
         r"seq\.axes must be None: randomized_positions samples 1-D positions",
         run=lambda: _randomized(SequenceInfo.from_grid(3, 4), 100)),
]
