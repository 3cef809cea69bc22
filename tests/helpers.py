"""Shared test helpers: tiny models for every registered encoding."""

from __future__ import annotations

import dataclasses

import torch

import posenc
from posenc import ModelConfig, Transformer

# Per-encoding config overrides that the generic invariance tests use. Empty means the
# defaults; a family adds an entry only where its defaults cannot run a tiny model.
TEST_CONFIGS: dict[str, dict] = {
    # Small clip / bucket sizes so that clipping and log buckets happen within tiny sequences.
    "shaw": {"clip": 3},
    "relative_key": {"clip": 4},
    "relative_key_query": {"clip": 4},
    "deberta": {"position_buckets": 4, "max_relative_positions": 8},
    # Gates well below 1 (sigmoid(0) = 0.5 at init), so the forgetting is visible in 13 tokens.
    "fox": {"bias_init": 0.0},
}


def hybrid_pattern(name: str, size: int = 3, every: int = 2) -> tuple:
    """posenc.hybrids' pattern ``name`` for tiny models: a cycle of ``every`` layers (the last
    global), every sliding window / chunk ``size`` tokens, so both matter within 9 tokens."""
    from posenc.hybrids import HYBRIDS

    return tuple(dataclasses.replace(k, size=size) if k.size is not None else k for k in HYBRIDS[name](every=every))


def all_hybrids() -> list[str]:
    """The named hybrids (posenc.hybrids.HYBRIDS); tiny_model builds them by name."""
    from posenc.hybrids import HYBRIDS

    return list(HYBRIDS)


def tiny_model(name: str, *, causal: bool = True, impl: str = "sdpa", dtype=torch.float32, **over) -> Transformer:
    """A tiny model of encoding ``name`` on every layer, or of the named hybrid ``name``."""
    hybrid = name in all_hybrids()
    cfg = ModelConfig(
        vocab_size=64,
        d_model=over.pop("d_model", 32),
        n_layer=over.pop("n_layer", 2),
        n_head=over.pop("n_head", 4),
        n_kv_head=over.pop("n_kv_head", None),
        causal=causal,
        encoding="rope" if hybrid else name,
        encoding_config={} if hybrid else TEST_CONFIGS.get(name, {}) | over.pop("encoding_config", {}),
        layer_pattern=hybrid_pattern(name) if hybrid else None,
        attn_impl=impl,
        **over,
    )
    torch.manual_seed(0)
    model = Transformer(cfg).to(dtype).eval()
    _perturb(model)
    return model


@torch.no_grad()
def _perturb(model: Transformer) -> None:
    """Give encoding parameters non-trivial values (zero-initialised tables would hide bugs)."""
    g = torch.Generator().manual_seed(1)
    for p in model.encodings.parameters():
        if p.is_floating_point():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))


def all_encodings() -> list[str]:
    return posenc.list_encodings()


def assert_embed_decodes_incrementally(enc, x: torch.Tensor, prefix: int) -> None:
    """A stateful embed hook fed a prefix, then one token at a time through ``state``, gives
    the output of one call over the whole sequence. x (B, T, C)."""
    from posenc import SequenceInfo

    B, T = x.shape[:2]
    full = enc.embed(x, SequenceInfo.from_offset(B, T))
    state: dict = {}
    parts = [enc.embed(x[:, :prefix], SequenceInfo.from_offset(B, prefix), state)]
    for t in range(prefix, T):
        parts.append(enc.embed(x[:, t : t + 1], SequenceInfo.from_offset(B, 1, offset=t), state))
    torch.testing.assert_close(torch.cat(parts, 1), full)


def write_module(folder, name: str, source: str):
    """``folder/name.py`` holding ``source`` (a plugin module for a pytest subprocess's ``-p``)."""
    path = folder / f"{name}.py"
    path.write_text(source)
    return path


def import_module_file(folder, name: str, source: str):
    """Write ``source`` to ``folder/name.py`` and import it as module ``name`` (as a user's plugin
    module would be imported: registered in ``sys.modules``, which flex's tracing looks up)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, write_module(folder, name, source))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_suites_with_plugin(folder, plugin: str, select: str, suites: dict[str, str]) -> list[str]:
    """Run pytest on ``suites`` (path -> pattern) in a subprocess with ``folder/plugin.py``
    imported as a plugin (``-p``, so what it registers is there before collection), keeping the
    tests ``select`` (``-k``) picks. Asserts the run passed and that each suite passed a test
    matching its pattern; returns the ids of the passed tests."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(root / "tests"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", plugin, "-k", select, *suites]
    r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    passed = re.findall(r"^PASSED (\S+)", r.stdout, flags=re.M)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    for path, pattern in suites.items():
        hits = [t for t in passed if t.startswith(path) and re.search(pattern, t)]
        assert hits, f"{path}: no passed test for the plugin matches {pattern!r}"
    return passed


def assert_same_grads(got: torch.Tensor, want: torch.Tensor, inputs, **tol) -> None:
    """The gradients of ``got`` and ``want`` w.r.t. ``inputs`` agree, through one fixed random
    weighting of the outputs (float64); an input one side does not use counts as a zero gradient."""
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    dg = torch.autograd.grad((got * w).sum(), inputs, allow_unused=True, retain_graph=True)  # a graph both may share
    dw = torch.autograd.grad((want * w).sum(), inputs, allow_unused=True)
    for a, b in zip(dg, dw):
        if a is None and b is None:
            continue
        torch.testing.assert_close(torch.zeros_like(b) if a is None else a, torch.zeros_like(a) if b is None else b, **tol)


def kernel_then_none(monkeypatch):
    """``for built in kernel_then_none(monkeypatch)``: True with the fused CPU kernel library as
    this process has it, then False with it not built (for the rest of the test), so one body
    runs both ways and the two results can be compared."""
    from posenc.rotary import cpu_rope

    yield True
    monkeypatch.setattr(cpu_rope, "_module", None)
    monkeypatch.setattr(cpu_rope, "_looked", True)
    yield False


def assert_impls_train_alike(model, tokens: torch.Tensor, impls=("sdpa", "eager"), *, atol: float = 1e-10) -> None:
    """One training step's loss and every parameter's gradient are the same through each
    backend ``impl`` (set on every block's attention), the first against each other one."""
    import torch.nn.functional as F

    results = {}
    for impl in impls:
        for block in model.blocks:
            block.attn.impl = impl
        model.zero_grad()
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        results[impl] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (first, (loss0, grads0)), *others = results.items()
    for impl, (loss, grads) in others:
        torch.testing.assert_close(loss0, loss, atol=1e-12, rtol=1e-12, msg=f"loss: {first} against {impl}")
        assert grads0.keys() == grads.keys()
        for name, g in grads0.items():
            torch.testing.assert_close(g, grads[name], atol=atol, rtol=atol, msg=f"{name}: {first} against {impl}")
