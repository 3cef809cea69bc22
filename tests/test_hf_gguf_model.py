"""posenc.hf.gguf_model: the model transformers builds from a GGUF file is sized from the file's
metadata before it is built, and a conversion that leaves a weight at random init is refused.

The files are written here with the ``gguf`` package (``reliability/gguf_files.py``): a complete
two-layer Llama, the same with one tensor renamed, one without its size metadata, and one tensor
under a llama header. The reference for every size is the model transformers itself builds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from reliability.gguf_files import write_llama, write_tensor_only  # noqa: E402

from posenc.hf.gguf_model import MAX_LAYERS, check_loaded, plan_gguf  # noqa: E402
from posenc.hf.models import resolve_model  # noqa: E402

RENAMED = ("blk.0.attn_v.weight", "blk.0.attn_vv.weight")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("POSENC_CACHE", str(root))
    return root


def test_the_plan_is_the_model_transformers_builds(tmp_path):
    """plan_gguf's count and float32 size equal those of the model from_pretrained loads."""
    path = write_llama(tmp_path / "m.gguf", hidden=48, layers=3, heads=6, kv_heads=2, ffn=96)
    plan = plan_gguf(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32)
    assert plan.params == sum(p.numel() for p in model.parameters()) == plan.file_values
    assert plan.float32_bytes == 4 * (plan.params + sum(b.numel() for b in model.buffers()))
    assert (plan.config.hidden_size, plan.config.num_hidden_layers) == (48, 3)


def test_a_complete_file_converts_to_transformers_own_load(tmp_path, cache):
    path = write_llama(tmp_path / "m.gguf")
    folder = resolve_model(path)
    assert folder.parent == cache
    ids = torch.tensor([[1, 5, 9, 200, 3, 77]])
    direct = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf",
                                                               dtype=torch.float32).eval()
    cached = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(direct(input_ids=ids).logits, cached(input_ids=ids).logits)


def test_a_renamed_tensor_is_refused_and_nothing_is_cached(tmp_path, cache):
    """Before: exit 0, v_proj filled at random, the cache recorded as valid. The file's total size
    is unchanged, so only transformers' loading report sees it."""
    path = write_llama(tmp_path / "m.gguf", rename=RENAMED)
    plan = plan_gguf(path)  # the sizes agree: the plan cannot see a misnamed tensor
    assert plan.params == plan.file_values
    with pytest.raises(ValueError, match=r"m\.gguf: the llama model transformers builds from it has 1 weight\(s\) "
                                         r"the file does not provide .*: model\.layers\.0\.self_attn\.v_proj\.weight; "
                                         r"the file is incomplete or its tensors are misnamed"):
        resolve_model(path)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.parametrize("make, defaulted", [
    (lambda d: write_tensor_only(d / "m.gguf"), "vocab_size, hidden_size"),
    (lambda d: write_llama(d / "m.gguf", metadata=False), "hidden_size, intermediate_size"),
])
def test_a_model_the_tensors_cannot_fill_is_refused_before_it_is_built(tmp_path, make, defaulted):
    """A llama header without size keys: transformers' defaults (the 6.7B Llama), counted on the
    meta device; the count in the message is that model's."""
    path = make(tmp_path)
    cfg = transformers.AutoConfig.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    with torch.device("meta"):
        want = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    assert want > 6e9
    with pytest.raises(ValueError, match=rf"m\.gguf: transformers would build a llama model of {want / 1e9:.2f}B "
                                         rf"parameters from the GGUF metadata \(.*the file's metadata lacks "
                                         rf"{defaulted}.*\), but the file's \d+ tensor\(s\) hold"):
        resolve_model(path)


def test_an_absurd_layer_count_is_refused_before_the_meta_model(tmp_path):
    from gguf import GGUFWriter

    path = write_llama(tmp_path / "m.gguf")
    w = GGUFWriter(str(tmp_path / "deep.gguf"), "llama")
    w.add_block_count(10**7)
    w.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert plan_gguf(path).config.num_hidden_layers == 2
    with pytest.raises(ValueError, match=rf"deep\.gguf: the GGUF metadata gives num_hidden_layers 10000000; a model "
                                         rf"has 1 to {MAX_LAYERS} layers"):
        plan_gguf(tmp_path / "deep.gguf")


def test_check_loaded_names_missing_and_mismatched_weights():
    check_loaded(Path("m.gguf"), "llama", {"missing_keys": set(), "mismatched_keys": [], "unexpected_keys": {"x"}})
    with pytest.raises(ValueError, match=r"has 4 weight\(s\) the file does not provide .*: a, b, c and 1 more"):
        check_loaded(Path("m.gguf"), "llama", {"missing_keys": {"d", "c", "b", "a"}})
    with pytest.raises(ValueError, match=r"1 weight\(s\) whose shape in the file differs from the model's: w"):
        check_loaded(Path("m.gguf"), "llama", {"mismatched_keys": [("w", (2,), (3,))]})


_BOUNDED = textwrap.dedent("""
    import json, resource, sys
    import torch, transformers, gguf, accelerate  # noqa: F401  (imported before the bound)
    import transformers.models.llama.modeling_llama  # noqa: F401
    from posenc.hf.models import resolve_model

    def vm_bytes():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

    limit = vm_bytes() + 2 * 2**30  # what the process holds now, plus 2 GiB
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = {}
    try:
        torch.empty(2**30, dtype=torch.float32)  # 4 GiB: the bound holds
        out["bound"] = "not enforced"
    except (RuntimeError, MemoryError):
        out["bound"] = "enforced"
    try:
        resolve_model(sys.argv[1])
        out["result"] = "converted"
    except ValueError as e:
        out["result"] = "ValueError: " + str(e)
    except BaseException as e:
        out["result"] = type(e).__name__ + ": " + str(e)[:200]
    print(json.dumps(out))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
def test_a_crafted_file_claiming_a_large_model_is_refused_within_bounded_memory(tmp_path):
    """A 4 KB llama header with one 32x32 tensor (a name transformers maps to no weight, so it
    goes on to initialise them all), resolved in a process whose address space is bounded to what
    it holds after the imports plus 2 GiB (the 6.6B-parameter model transformers would build needs
    26 GB in float32): a one-line refusal, not an allocation failure. Before, the size check
    summed the file's tensors (4 KB), transformers built its default Llama, and this process
    ended in RuntimeError (DefaultCPUAllocator: can't allocate memory)."""
    path = write_tensor_only(tmp_path / "crafted.gguf", name="blk.0.extra.weight")
    assert path.stat().st_size < 8192
    env = dict(os.environ, POSENC_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", _BOUNDED, str(path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["bound"] == "enforced"
    assert out["result"].startswith("ValueError: ") and "\n" not in out["result"]
    assert "crafted.gguf: transformers would build a llama model of 6.61B parameters" in out["result"]
