"""The absolute and relative families: size bounds, ranges that keep logits finite, FLOATER's
position bound, empty sequences, models built inside ``inference_mode``."""

from __future__ import annotations

import torch

from posenc import SequenceInfo, build
from posenc.model import Transformer
from posenc.model_config import ModelConfig

from . import Case


def _model(name: str, **config) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=16, d_model=16, n_layer=2, n_head=2, encoding=name,
                                   encoding_config=config)).eval()


def _empty(name: str) -> str:
    out = _model(name)(torch.zeros(2, 0, dtype=torch.long))
    return f"{name}: logits of shape {tuple(out.shape)}"


def _built_in_inference_mode(name: str, **config) -> str:
    with torch.inference_mode():
        model = _model(name, **config)
        out = model.generate(torch.zeros(1, 3, dtype=torch.long), 4)
    return f"{name} built in inference_mode generates {tuple(out.shape)} tokens"


def _floater_far() -> None:
    enc = build("floater", d_model=8, num_heads=2)
    enc.embed(torch.zeros(1, 2, 8), SequenceInfo.from_offset(1, 2, 100_000))


def _bf16_complex_order() -> str:
    model = _model("complex_order").to(torch.bfloat16)
    return f"complex_order omega stays {model.encodings[0].omega.dtype} in a bfloat16 model"


A = "families"
CASES = [
    # sizes: refused in the config, before anything is allocated
    Case(A, "learned max_len=10**12", r"max_len must be in \[1, 16777216\], got 1000000000000",
         run=lambda: build("learned", d_model=8, num_heads=2, max_len=10**12)),
    Case(A, "learned max_len of 2^24 rows at d_model=512 (a 32 GiB table)",
         r"max_len must be <= 2097152 with d_model=512",
         run=lambda: build("learned", d_model=512, num_heads=4, max_len=2**24)),
    Case(A, "multiplicative max_len=10**12", r"max_len must be in \[1, 16777216\]",
         run=lambda: build("multiplicative", d_model=8, num_heads=2, max_len=10**12)),
    Case(A, "shaw clip=10**12", r"clip must be in \[1, 8388607\], got 1000000000000",
         run=lambda: build("shaw", d_model=8, num_heads=2, clip=10**12)),
    Case(A, "relative_key clip=10**12", r"clip must be in \[1, 8388607\]",
         run=lambda: build("relative_key", d_model=8, num_heads=2, clip=10**12)),
    Case(A, "deberta max_relative_positions=10**12", r"max_relative_positions must be in \[1, 8388608\]",
         run=lambda: build("deberta", d_model=8, num_heads=2, max_relative_positions=10**12, position_buckets=0)),
    Case(A, "t5 num_buckets=10**12", r"num_buckets must be in \[2, 16777216\]",
         run=lambda: build("t5", d_model=8, num_heads=2, num_buckets=10**12)),
    Case(A, "transformer_xl clip=10**15", r"clip must be in \[1, 1099511627776\]",
         run=lambda: build("transformer_xl", d_model=8, num_heads=2, clip=10**15)),
    Case(A, "fire mlp_width=10**6", r"mlp_width must be in \[1, 4096\]",
         run=lambda: build("fire", d_model=8, num_heads=2, mlp_width=10**6)),
    Case(A, "convolutional kernel_size=10**6", r"kernel_size must be in \[1, 1024\]",
         run=lambda: build("convolutional", d_model=8, num_heads=2, kernel_size=10**6)),
    Case(A, "recurrent hidden=10**9", r"hidden must be in \[1, 65536\]",
         run=lambda: build("recurrent", d_model=8, num_heads=2, hidden=10**9)),
    # floats that made non-finite logits
    Case(A, "floater delta=1e30 (NaN codes)", r"delta must be in \(0.0, 10.0\], got 1e\+30",
         run=lambda: build("floater", d_model=8, num_heads=2, delta=1e30)),
    Case(A, "fire init_c=1e308 (inf in float32)", r"init_c must be in \[1e-06, 1000000.0\], got 1e\+308",
         run=lambda: build("fire", d_model=8, num_heads=2, init_c=1e308)),
    Case(A, "learned init_std=1e30 (LayerNorm variance overflows)", r"init_std must be in \(0.0, 10000.0\]",
         run=lambda: build("learned", d_model=8, num_heads=2, init_std=1e30)),
    Case(A, "complex_order base=1e-300 (omega overflows)", r"base must be in \[1.0, inf\), got 1e-300",
         run=lambda: build("complex_order", d_model=8, num_heads=2, base=1e-300)),
    Case(A, "kerple r1_init=1e300", r"r1_init must be in \[0.01, 10000.0\]",
         run=lambda: build("kerple", d_model=8, num_heads=2, r1_init=1e300)),
    Case(A, "deberta layer_norm_eps=0", r"layer_norm_eps must be in \(0.0, 1.0\], got 0.0",
         run=lambda: build("deberta", d_model=8, num_heads=2, layer_norm_eps=0.0)),
    # floater: the solve runs from t = 0 to the largest position
    Case(A, "floater at position 1e5 (an RK4 solve of 1e5 steps, ~1 min)",
         r"positions must be in \[0, 8191\] for floater \(max_position=8192",
         run=_floater_far),
    Case(A, "floater max_position=2**21", r"max_position must be in \[1, 1048576\]",
         run=lambda: build("floater", d_model=8, num_heads=2, max_position=2**21)),
    # handled, with a defined result
    Case(A, "transformer_xl on an empty sequence (T = 0)", r"transformer_xl: logits of shape \(2, 0, 16\)",
         run=lambda: _empty("transformer_xl"), error=None),
    Case(A, "fire on an empty sequence (T = 0)", r"fire: logits of shape \(2, 0, 16\)",
         run=lambda: _empty("fire"), error=None),
    Case(A, "deberta model built inside torch.inference_mode()", r"deberta built in inference_mode generates \(1, 7\)",
         run=lambda: _built_in_inference_mode("deberta"), error=None),
    Case(A, "floater model built inside torch.inference_mode()", r"floater built in inference_mode generates \(1, 7\)",
         run=lambda: _built_in_inference_mode("floater"), error=None),
    Case(A, "complex_order model cast to bfloat16", r"omega stays torch.float32",
         run=_bf16_complex_order, error=None),
]
