"""The core's hooks and the relative family under non-finite values and strided positions:
FIRE's threshold from a non-finite ``L_multiplier``, CoPE under NaN activations, FIRE with
positions that are a transposed or sliced tensor, non-finite config values."""

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


def _fire_multiplier(value: float) -> None:
    model = _model("fire")
    with torch.no_grad():
        model.encodings[0].L_multiplier.fill_(value)
        model(torch.zeros(2, 5, dtype=torch.long))


def _fire_positions(layout: str) -> str:
    base = torch.stack([torch.arange(6) + 3, torch.arange(6) * 2])
    pos = base.t().contiguous().t() if layout == "transposed" else torch.stack([base, base], -1)[..., 0]
    model = _model("fire", init_L=2.0)  # a small threshold: most rows take the per-pair path
    tokens = torch.zeros(2, 6, dtype=torch.long)
    with torch.no_grad():
        same = torch.equal(model(tokens, SequenceInfo(pos)), model(tokens, SequenceInfo(pos.contiguous())))
    return f"fire, {layout} positions (contiguous: {pos.is_contiguous()}): logits equal the contiguous ones: {same}"


def _cope_nan() -> str:
    model = _model("cope")
    with torch.no_grad():
        model.tok_emb.weight.fill_(float("nan"))  # NaN activations reach CoPE's gates
        out = model(torch.zeros(1, 4, dtype=torch.long))
    return f"cope with NaN activations: logits {tuple(out.shape)}, all NaN: {bool(out.isnan().all())}"


A = "core_vocab"
CASES = [
    Case(A, "fire L_multiplier parameter set to NaN",
         r"^FIRE's threshold L = \|L_multiplier \* init_L\| must be finite, got nan",
         run=lambda: _fire_multiplier(float("nan"))),
    Case(A, "fire L_multiplier parameter set to inf",
         r"^FIRE's threshold L = \|L_multiplier \* init_L\| must be finite, got inf",
         run=lambda: _fire_multiplier(float("inf"))),
    Case(A, "fire with transposed (non-contiguous) position tensor",
         r"logits equal the contiguous ones: True$", run=lambda: _fire_positions("transposed"), error=None),
    Case(A, "fire with sliced (strided) position tensor",
         r"logits equal the contiguous ones: True$", run=lambda: _fire_positions("strided"), error=None),
    Case(A, "cope with NaN activations (NaN contextual positions)",
         r"all NaN: True$", run=_cope_nan, error=None),
    Case(A, "fire init_L=nan", r"^init_L must be finite, got nan$",
         run=lambda: build("fire", d_model=8, num_heads=2, init_L=float("nan"))),
    Case(A, "kerple r1_init=inf", r"^r1_init must be finite, got inf$",
         run=lambda: build("kerple", d_model=8, num_heads=2, r1_init=float("inf"))),
]
