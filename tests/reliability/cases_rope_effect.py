"""``posenc rope --model`` (posenc.hf.rope_effect) and DINOv3's RoPE (``rope_dinov3``): inputs
refused in one line before any weight is read or any table is built."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile

from . import Case

A = "rope --model and rope_dinov3"


def _rope_model_on_a_config() -> str:
    from posenc.cli import main

    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "max_position_embeddings": 64, "rope_theta": 10000.0}
    err = io.StringIO()
    with tempfile.TemporaryDirectory() as d, contextlib.chdir(d), contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        with open("config.json", "w") as f:
            json.dump(cfg, f)
        code = main(["rope", "config.json", "--model"])
    return f"exit {code}: {err.getvalue().strip()}"


def _effects(**kw) -> object:
    import torch

    from posenc.engines import EngineRope
    from posenc.hf.rope_effect import logit_effects

    inv = torch.ones(4, dtype=torch.float64)
    readings = kw.pop("readings", {"transformers": [EngineRope("transformers", inv)]})
    qk = kw.pop("qk", {0: (torch.zeros(2, 4, 8), torch.zeros(1, 4, 8))})
    return logit_effects(qk, {0: 1.0}, readings, 16, **kw)


def _grid(length: int) -> object:
    from posenc.hf.rope_effect import distance_grid

    return distance_grid(length)


def _dinov3(**kw) -> object:
    import posenc

    return posenc.build("rope_dinov3", d_model=64, num_heads=2, **kw)


CASES = [
    Case(A, "`posenc rope config.json --model` (a config without weights)",
         r"^exit 2: posenc rope: error: --model: config\.json holds no weights; give the checkpoint folder or the "
         r"\.gguf$", run=_rope_model_on_a_config, error=None),
    Case(A, "logit_effects with pairs=0", r"pairs must be >= 1, got 0", lambda: _effects(pairs=0)),
    Case(A, "logit_effects with no captured layer", r"qk must hold at least one layer's captured q and k",
         lambda: _effects(qk={})),
    Case(A, "logit_effects without transformers' reading (the reference)",
         r"readings must include transformers' \(the reference\); got vllm",
         lambda: _effects(readings={"vllm": []})),
    Case(A, "distance_grid(1): no distance past 0", r"length must be >= 2, got 1", lambda: _grid(1)),
    Case(A, "rope_dinov3 with shift=0", r"shift must be a number > 0 \(or None: no shift\), got 0",
         lambda: _dinov3(shift=0.0)),
    Case(A, "rope_dinov3 with jitter=1 (no stretch)", r"jitter must be a number > 1 \(or None: off\), got 1",
         lambda: _dinov3(jitter=1.0)),
    Case(A, "rope_dinov3 with grid_height=0", r"grid_height must be", lambda: _dinov3(grid_height=0)),
]
