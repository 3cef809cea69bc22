"""A new encoding is one module (issue 21).

The toy below is a content-independent bias, -scale · m_h · log(1 + |i - j|) with learned
per-head slopes m_h, in a module written into the test's temporary folder: importing it
registers it (one ``@register``), the fixture unregisters it (``posenc.registry.unregister``).
Nothing else is edited, and the registry-parametrized machinery picks it up:

* in process: it is listed, built, run by a model through every backend's bias path, probed by
  ``posenc check`` (logits through the attention path), whose verdicts read the one claim its
  ``@register`` declares and "no claim" elsewhere;
* every registry-parametrized test table runs on it: a pytest subprocess with the module
  imported as a plugin (``-p``, before collection) collects and passes a ``[toy_bias]`` case in
  the invariance, backend, check, family-bound and bias tables.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import posenc
from posenc import SequenceInfo
from posenc.registry import unregister
from helpers import import_module_file, run_suites_with_plugin, write_module

NAME = "toy_bias"

TOY_MODULE = '''
"""A toy content-independent bias: -scale * m_h * log(1 + |i - j|), m_h learned per head."""
from dataclasses import dataclass

import torch
from torch import nn

from posenc.config import EncodingConfig, check_range
from posenc.encoding import PositionalEncoding
from posenc.registry import register
from posenc.terms import BiasTerm


@dataclass
class ToyBiasConfig(EncodingConfig):
    scale: float = 1.0

    def validate(self) -> None:
        check_range("scale", self.scale, 1e-3, 1e3)


@register("toy_bias", family="relative", summary="a toy log-distance bias", paper="tests/test_toy_encoding.py",
          claims={"relative": (True, "a function of |i - j| by construction")})
class ToyBias(PositionalEncoding):
    Config = ToyBiasConfig

    def __init__(self, config, dims):
        super().__init__(config, dims)
        self.slopes = nn.Parameter(torch.linspace(0.5, 1.0, dims.num_heads))

    def logit_bias(self):
        dtype = torch.promote_types(self.slopes.dtype, torch.float32)  # float32, or float64 in a float64 model
        slopes, scale = self.slopes.to(dtype), self.config.scale

        def fn(h, q_pos, k_pos):
            return -scale * slopes[h] * torch.log1p((q_pos - k_pos).abs().to(dtype))

        return BiasTerm(fn, self.dims.num_heads, toeplitz=True)
'''


def _write_module(folder: Path) -> Path:
    return write_module(folder, "posenc_toy_encoding", TOY_MODULE)


@pytest.fixture
def toy(tmp_path):
    module = import_module_file(tmp_path, "posenc_toy_encoding", TOY_MODULE)  # registers it
    try:
        yield module.ToyBias
    finally:
        unregister(NAME)
        del sys.modules[module.__name__]


def _by_hand(slopes: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(H, Tq, Tk) from the formula, one pair at a time."""
    out = torch.empty(len(slopes), len(q_pos), len(k_pos))
    for h in range(len(slopes)):
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                out[h, i, j] = -float(slopes[h]) * torch.log1p(torch.tensor(float(abs(qi - kj))))
    return out


def test_the_toy_is_registered_by_its_module_alone(toy):
    assert NAME in posenc.list_encodings("relative") and posenc.get_info(NAME).cls is toy
    enc = posenc.build(NAME, d_model=16, num_heads=4)
    assert enc.has_bias and not (enc.has_terms or enc.has_rotate or enc.has_embed)
    q_pos, k_pos = torch.tensor([3, 4, 9]), torch.arange(6)
    got = enc.score_bias(q_pos[None], k_pos[None])[0]
    torch.testing.assert_close(got, _by_hand(enc.slopes.detach(), q_pos, k_pos))
    with pytest.raises(ValueError, match=r"^scale must be in \[0.001, 1000.0\], got 0.0$"):
        posenc.build(NAME, d_model=16, num_heads=4, scale=0.0)


def test_unregistered_after_the_fixture():
    assert NAME not in posenc.list_encodings()
    with pytest.raises(ValueError, match="unknown encoding 'toy_bias'"):
        posenc.get_info(NAME)
    with pytest.raises(ValueError, match="unknown encoding 'toy_bias'"):
        unregister(NAME)


def test_unregister_frees_the_name(toy, tmp_path):
    assert unregister(NAME).cls is toy
    assert NAME not in posenc.list_encodings()
    spec = importlib.util.spec_from_file_location("posenc_toy_encoding_again", _write_module(tmp_path))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # the same name registers again
    assert NAME in posenc.list_encodings()


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
def test_a_model_runs_it_through_every_backend(toy, impl, monkeypatch):
    from posenc.backends import flex

    monkeypatch.setattr(flex, "COMPILE", False)  # flex's reference implementation on CPU
    tokens = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = []
    for backend in ("eager", impl):
        torch.manual_seed(0)
        model = posenc.Transformer(posenc.ModelConfig(vocab_size=32, d_model=16, n_layer=2, n_head=4, encoding=NAME,
                                                      attn_impl=backend)).eval()
        with torch.no_grad():
            logits.append(model(tokens, SequenceInfo.from_offset(2, 9, 5)))
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)


def test_check_probes_it_against_its_declared_claims(toy):
    from posenc.analysis.probes import Probe
    from posenc.analysis.runner import check_encoding, run_checks

    probe = Probe(d_model=16, num_heads=2, train_len=16, far_len=64, max_probe_position=256)
    results = run_checks([NAME], probe)[NAME]
    assert results["relative"].status == "yes" and results["absolute"].status == "no"
    assert results["linear_attention"].status == "no"  # a (Tq, Tk) bias
    assert (results["relative"].verdict, results["relative"].source) == ("agrees", "a function of |i - j| by construction")
    assert {r.verdict for k, r in results.items() if r.status in ("yes", "no") and k != "relative"} == {"no claim"}
    assert check_encoding(posenc.build(NAME, d_model=16, num_heads=2), probe, only=["relative"])["relative"].status == "yes"


# Each suite, and a test name pattern that its toy cases must match (at least one passes).
SUITES = {
    "tests/test_invariance.py": r"toy_bias",
    "tests/test_backends.py": r"toy_bias",
    "tests/test_analysis_checks.py": r"test_probe_logits_are_the_attention_layers\[toy_bias",
    "tests/test_family_bounds.py": r"test_every_float_range.*toy_bias|test_empty_sequence.*toy_bias",
    "tests/test_relative_bias.py": r"toy_bias",
}


def test_every_registry_parametrized_test_runs_on_it(tmp_path):
    _write_module(tmp_path)  # imported by pytest as a plugin (-p), so registered before collection
    passed = run_suites_with_plugin(tmp_path, "posenc_toy_encoding", NAME, SUITES)
    assert len([t for t in passed if NAME in t]) >= 20, passed
