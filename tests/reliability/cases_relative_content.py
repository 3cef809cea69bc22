"""The content-dependent relative encodings (shaw, relative_key, relative_key_query,
transformer_xl, deberta) the way users call them: bad configs, and forwards under
``inference_mode`` / ``no_grad``, a KV-cache decode, float64, bf16 autocast and packed documents.

Every forward case runs each scheme through the default backend (``sdpa``: the fused function for
table and value terms, the dense composition for short decoding steps) and compares it with the
eager backend of a model with the same weights (:mod:`posenc.backends.eager`, itself checked
against the papers' formulas in ``tests/test_relative_content.py``), or with the full forward
for the decode and with separate forwards for packed documents. Tolerances are per dtype:
float32 1e-5, float64 1e-10 (a silent cast to float32 misses it), bf16 autocast 3e-2 on the
(layer-normed, order-one) hidden states against the same autocast run on eager; dropping a
scheme's terms moves each compared tensor by more than its tolerance.
"""

from __future__ import annotations

import torch

from posenc import ModelConfig, SequenceInfo, Transformer, build

from . import Case

A = "relative (content-dependent)"

# Small clips and buckets, so that clipping and log buckets happen within a 24-token sequence;
# init_std 2 so the position terms move the outputs by far more than the tolerances
# (DeBERTa's layer-normed table ignores it: its terms move the hidden states by more than 3e-2).
SCHEMES: dict[str, dict] = {
    "shaw": {"clip": 3, "init_std": 2.0},
    "relative_key": {"clip": 3, "init_std": 2.0},
    "relative_key_query": {"clip": 3, "init_std": 2.0},
    # Unclipped: the table form for full forwards, the angle form (a DenseTerm) for 1-token steps.
    "transformer_xl": {"init_std": 2.0},
    "deberta": {"position_buckets": 4, "max_relative_positions": 8, "init_std": 2.0},
}
T = 24  # tokens per row: above the sdpa backend's 16-row decode shortcut, so full forwards are fused
ATOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def _model(name: str, impl: str, dtype: torch.dtype = torch.float32) -> Transformer:
    torch.manual_seed(0)  # the same weights for every impl
    cfg = ModelConfig(vocab_size=32, d_model=32, n_head=4, n_layer=2, encoding=name,
                      encoding_config=SCHEMES[name], attn_impl=impl)
    return Transformer(cfg).to(dtype).eval()


def _tokens(batch: int = 2, length: int = T) -> torch.Tensor:
    return torch.randint(0, 32, (batch, length), generator=torch.Generator().manual_seed(7))


def _close(name: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, got.dtype, want.shape, want.dtype)
    assert torch.isfinite(got).all(), f"{name}: non-finite logits"
    err = (got.float() - want.float()).abs().max().item()
    assert err <= atol, f"{name}: max |difference| {err:.3g} > {atol:g}"


def _every_scheme(check) -> str:
    assert len(SCHEMES) == 5
    for name in SCHEMES:
        check(name)
    return ", ".join(SCHEMES)


def _grad_mode(mode: str) -> str:
    """sdpa under ``inference_mode`` or ``no_grad`` equals eager (parameters require grad)."""
    ctx = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}[mode]

    def check(name: str) -> None:
        model = _model(name, "sdpa")
        assert all(p.requires_grad for p in model.parameters())
        with ctx():
            got = model(_tokens())
        with torch.no_grad():
            want = _model(name, "eager")(_tokens())
        _close(name, got, want, ATOL[torch.float32])

    return f"{_every_scheme(check)}: sdpa logits under {mode} equal eager's to 1e-5"


def _decode() -> str:
    """A prompt, a chunk of 18 tokens (fused, with a key offset) and 1-token steps (the dense
    composition; Transformer-XL's angle form) through the KV cache equal the full forward."""

    def check(name: str) -> None:
        model, tokens = _model(name, "sdpa", torch.float64), _tokens()
        with torch.no_grad():
            want = _model(name, "eager", torch.float64)(tokens)
            cache = model.new_cache()
            parts = [model(tokens[:, :3], cache=cache), model(tokens[:, 3:21], cache=cache)]
            parts += [model(tokens[:, t : t + 1], cache=cache) for t in range(21, T)]
        _close(name, torch.cat(parts, dim=1), want, ATOL[torch.float64])

    return f"{_every_scheme(check)}: prompt 3 + chunk 18 + three 1-token steps equal the full eager forward to 1e-10"


def _float64() -> str:
    """A float64 model stays float64 through the fused path (float32 rounding would be ~1e-7)."""

    def check(name: str) -> None:
        with torch.no_grad():
            got = _model(name, "sdpa", torch.float64)(_tokens())
            want = _model(name, "eager", torch.float64)(_tokens())
        _close(name, got, want, ATOL[torch.float64])

    return f"{_every_scheme(check)}: float64 sdpa equals float64 eager to 1e-10"


def _bf16_autocast() -> str:
    """Under CPU bf16 autocast sdpa gives finite bf16 logits, and hidden states (float32 after the
    final LayerNorm) close to eager's under the same autocast."""

    def check(name: str) -> None:
        model, ref = _model(name, "sdpa"), _model(name, "eager")
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(_tokens())
            got, want = model(_tokens(), return_hidden=True), ref(_tokens(), return_hidden=True)
        assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all(), (name, logits.dtype)
        _close(name, got, want, 3e-2)

    return f"{_every_scheme(check)}: bf16 logits, finite; hidden states equal eager's under the same autocast to 3e-2"


def _packed() -> str:
    """Three documents packed in one row (cu_seqlens) give each document's own forward: positions
    restart per document, and no document sees another."""
    cu = [0, 5, 12, T]

    def check(name: str) -> None:
        model, tokens = _model(name, "sdpa", torch.float64), _tokens(1)
        ref = _model(name, "eager", torch.float64)
        with torch.no_grad():
            got = model(tokens, SequenceInfo.from_cu_seqlens(cu))
            want = torch.cat([ref(tokens[:, a:z]) for a, z in zip(cu, cu[1:])], dim=1)
        _close(name, got, want, ATOL[torch.float64])

    return f"{_every_scheme(check)}: documents of 5, 7, 12 tokens packed equal separate eager forwards to 1e-10"


def _b(name: str, **config) -> None:
    build(name, d_model=8, num_heads=2, **config)


CASES = [
    # clips and spans: positive ints, by name
    Case(A, "shaw clip=0", r"^clip must be in \[1, 8388607\], got 0$", run=lambda: _b("shaw", clip=0)),
    Case(A, "relative_key clip=-3", r"^clip must be in \[1, 8388607\], got -3$", run=lambda: _b("relative_key", clip=-3)),
    Case(A, "relative_key_query clip=0", r"^clip must be in \[1, 8388607\], got 0$",
         run=lambda: _b("relative_key_query", clip=0)),
    Case(A, "transformer_xl clip=0 (None is unclipped)", r"^clip must be in \[1, 1099511627776\], got 0$",
         run=lambda: _b("transformer_xl", clip=0)),
    Case(A, "deberta max_relative_positions=0", r"^max_relative_positions must be in \[1, 8388608\], got 0$",
         run=lambda: _b("deberta", max_relative_positions=0)),
    Case(A, "deberta position_buckets=1", r"^position_buckets must be >= 2, got 1$",
         run=lambda: _b("deberta", position_buckets=1)),
    Case(A, "deberta position_buckets=8 > max_relative_positions=4",
         r"^position_buckets must be <= max_relative_positions \(4\), got 8$",
         run=lambda: _b("deberta", position_buckets=8, max_relative_positions=4)),
    # wrong types: no silent int() of a string, float or bool
    Case(A, "shaw clip='4' (a string)", r"^clip must be an int, got str '4'$",
         run=lambda: _b("shaw", clip="4"), error=TypeError),
    Case(A, "relative_key clip=4.0 (a float)", r"^clip must be an int, got float 4.0$",
         run=lambda: _b("relative_key", clip=4.0), error=TypeError),
    Case(A, "relative_key_query clip=True (a bool)", r"^clip must be an int, got bool True$",
         run=lambda: _b("relative_key_query", clip=True), error=TypeError),
    Case(A, "transformer_xl clip=4.0 (a float)", r"^clip must be an int or None, got float 4.0$",
         run=lambda: _b("transformer_xl", clip=4.0), error=TypeError),
    Case(A, "deberta max_relative_positions='8' (a string)", r"^max_relative_positions must be an int, got str '8'$",
         run=lambda: _b("deberta", max_relative_positions="8"), error=TypeError),
    Case(A, "shaw use_key=False, use_value=False", r"^at least one of use_key, use_value must be True, got both False$",
         run=lambda: _b("shaw", use_key=False, use_value=False)),
    Case(A, "deberta c2p=False, p2c=False", r"^at least one of c2p, p2c must be True, got both False$",
         run=lambda: _b("deberta", c2p=False, p2c=False)),
    # T5's bucketing bound is not a key of the clipped encodings: an unknown key, the valid ones listed
    Case(A, "relative_key max_distance=4 (T5's key; the clip is clip)",
         r"^unknown config key 'max_distance' for encoding 'relative_key'; valid keys: clip, init_std$",
         run=lambda: _b("relative_key", max_distance=4), error=TypeError),
    Case(A, "relative_key_query max_distance=4 in ModelConfig(encoding_config=)",
         r"^encoding_config: unknown config key 'max_distance' for encoding 'relative_key_query'; valid keys: clip, init_std$",
         run=lambda: ModelConfig(encoding="relative_key_query", encoding_config={"max_distance": 4}), error=TypeError),
    Case(A, "transformer_xl max_distance=64 (T5's key; the clamp is clip)",
         r"^unknown config key 'max_distance' for encoding 'transformer_xl'; valid keys: base, clip, init_std$",
         run=lambda: _b("transformer_xl", max_distance=64), error=TypeError),
    # forwards the way users run them: defined results, each equal to its reference
    Case(A, "forward under torch.inference_mode()", r"under inference_mode equal eager's",
         run=lambda: _grad_mode("inference_mode"), error=None),
    Case(A, "forward under torch.no_grad()", r"under no_grad equal eager's", run=lambda: _grad_mode("no_grad"), error=None),
    Case(A, "KV-cache decode (prompt, a long chunk, 1-token steps)", r"equal the full eager forward",
         run=_decode, error=None),
    Case(A, "float64 model", r"float64 sdpa equals float64 eager", run=_float64, error=None),
    Case(A, "bf16 autocast on CPU", r"bf16 logits, finite; hidden states equal eager's", run=_bf16_autocast, error=None),
    Case(A, "packed documents (cu_seqlens)", r"packed equal separate eager forwards", run=_packed, error=None),
]
