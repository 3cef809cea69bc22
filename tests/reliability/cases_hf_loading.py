"""Loading a model: a GGUF file transformers would fill at random or build far larger than the
file, a converted cache changed after it was written, a bad POSENC_CACHE, and a checkpoint
folder whose checked weights are not the ones transformers reads.

Each case runs in a fresh temporary folder that is the working directory, with POSENC_CACHE
the relative path ``cache`` (so the messages, and docs/reliability.md, name the same paths on
every machine). The GGUF files are written by ``gguf_files.py``; a conversion of its tiny Llama
takes a few seconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from . import Case
from .cases_real_models import in_tmp_cache
from .gguf_files import write_llama, write_tensor_only

A = "model loading"


def _resolve(spec, **kw) -> object:
    from posenc.hf.models import resolve_model

    return resolve_model(spec, **kw)


def _renamed() -> object:
    return _resolve(write_llama("m.gguf", rename=("blk.0.attn_v.weight", "blk.0.attn_vv.weight")))


def _header_only() -> object:
    return _resolve(write_tensor_only("m.gguf", name="blk.0.extra.weight"))


def _deep() -> object:
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter("deep.gguf", "llama")
    w.add_block_count(10**7)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return _resolve("deep.gguf")


def _changed_cache(change: Callable[[Path], None]) -> Callable[[], object]:
    def run() -> object:
        folder = _resolve(write_llama("m.gguf"))
        change(folder)
        return _resolve("m.gguf")

    return in_tmp_cache(run)


def _edit_config(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, rope_theta=5e5)))


def _flip_weight(folder: Path) -> None:
    p = folder / "model.safetensors"
    raw = bytearray(p.read_bytes())
    raw[-5] ^= 0x40
    p.write_bytes(bytes(raw))


def _truncate(folder: Path) -> None:
    p = folder / "model.safetensors"
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size // 2)


def _cache_is(make: Callable[[], None]) -> Callable[[], object]:
    def run() -> object:
        make()
        return _resolve(write_llama("m.gguf"))

    return in_tmp_cache(run)


def _full_disk() -> object:
    from posenc.hf import model_cache

    real = shutil.disk_usage
    model_cache.shutil.disk_usage = lambda p: real(p)._replace(free=4096)
    try:
        return _resolve(write_llama("m.gguf"))
    finally:
        model_cache.shutil.disk_usage = real


def _named_from_cache() -> object:
    """A named model converted earlier, its package not installed, with install=False."""
    from posenc.hf import models

    folder = _resolve(write_llama("m.gguf"))
    sha = json.loads((folder / "posenc_model.json").read_text())["sha256"]
    m = models.NamedModel("tiny-named", "test", (("posenc-no-such-package", "1.0", "x/m.gguf"),), sha, "none")
    shutil.copytree(folder, folder.parent / f"tiny-named-{sha[:12]}-v{models.FORMAT_VERSION}")
    models.MODELS[m.name] = m
    try:
        return f"the cached folder {models.resolve_model('tiny-named', install=False)}"
    finally:
        del models.MODELS[m.name]


def _checkpoint(layout: str) -> object:
    """A config.json folder whose weights are laid out as ``layout`` says."""
    from posenc.hf.checkpoint import open_checkpoint

    p = Path("ckpt")
    p.mkdir()
    config = {"model_type": "llama", "hidden_size": 32}
    if layout == "other+bin":
        (p / "other.safetensors").write_bytes(b"")
        (p / "pytorch_model.bin").write_bytes(b"")
    else:
        config["transformers_weights"] = "pytorch_model.bin"
    (p / "config.json").write_text(json.dumps(config))
    return open_checkpoint(p)


CASES = [
    Case(A, "a GGUF file with one tensor renamed (transformers would leave v_proj at random init)",
         r"^m\.gguf: the llama model transformers builds from it has 1 weight\(s\) the file does not provide "
         r"\(transformers initialised them at random\): model\.layers\.0\.self_attn\.v_proj\.weight; the file is "
         r"incomplete or its tensors are misnamed$", in_tmp_cache(_renamed)),
    Case(A, "a 4 KB GGUF with a llama header and one 32x32 tensor (transformers would build its 6.7B default)",
         r"^m\.gguf: transformers would build a llama model of 6\.61B parameters from the GGUF metadata \(vocab_size "
         r"32000, hidden_size 4096, .*; the file's metadata lacks vocab_size, .* so these are transformers' "
         r"defaults\), but the file's 1 tensor\(s\) hold 1\.02K values: the rest would be initialised at random",
         in_tmp_cache(_header_only)),
    Case(A, "a GGUF whose metadata claims 10**7 layers", r"^deep\.gguf: the GGUF metadata gives num_hidden_layers "
         r"10000000; a model has 1 to 1024 layers", in_tmp_cache(_deep)),
    Case(A, "a converted model's config.json edited in the cache",
         r"^cache/m-[0-9a-f]{12}-v1/config\.json has \d+ bytes but the conversion wrote \d+ \(truncated or edited "
         r"since\); remove the folder to convert it again: rm -r 'cache/m-[0-9a-f]{12}-v1'$",
         _changed_cache(_edit_config)),
    Case(A, "a converted model's weights edited in the cache (same size)",
         r"^cache/m-[0-9a-f]{12}-v1/model\.safetensors differs from the file the conversion wrote \(its sha256 "
         r"changed: edited since\); remove the folder to convert it again: rm -r", _changed_cache(_flip_weight)),
    Case(A, "a converted model's weights truncated in the cache",
         r"^cache/m-[0-9a-f]{12}-v1/model\.safetensors has \d+ bytes but the conversion wrote \d+ \(truncated or "
         r"edited since\); remove the folder to convert it again: rm -r", _changed_cache(_truncate)),
    Case(A, "POSENC_CACHE that is a file", r"^POSENC_CACHE 'cache' is a file, not a folder; point POSENC_CACHE to "
         r"a folder$", _cache_is(lambda: Path("cache").write_text("x"))),
    Case(A, "POSENC_CACHE that is a dangling symbolic link",
         r"^POSENC_CACHE 'cache' is a symbolic link to 'gone', which does not exist; point POSENC_CACHE to a folder$",
         _cache_is(lambda: Path("cache").symlink_to("gone"))),
    Case(A, "a disk too full for the conversion, at the start",
         r"^POSENC_CACHE 'cache' has 0\.00 GiB free but converting m\.gguf \(float32 safetensors\) writes about "
         r"0\.06 GiB; free space there or point POSENC_CACHE to another disk$", in_tmp_cache(_full_disk)),
    Case(A, "resolve_model('') (was: the current folder)", r"^MODEL is empty; give a save_pretrained folder, a "
         r"\.gguf file or a named model", in_tmp_cache(lambda: _resolve(""))),
    Case(A, "a named model already converted, its package not installed, install=False",
         r"^the cached folder cache/tiny-named-[0-9a-f]{12}-v1$", in_tmp_cache(_named_from_cache), error=None),
    Case(A, "a checkpoint folder with other.safetensors and pytorch_model.bin (transformers would load the .bin)",
         r"^MODEL_DIR 'ckpt' has no model\.safetensors or model\.safetensors\.index\.json, the weights transformers "
         r"reads \(found other\.safetensors, pytorch_model\.bin\): rename the safetensors file to model\.safetensors",
         in_tmp_cache(lambda: _checkpoint("other+bin"))),
    Case(A, "config.json's transformers_weights naming a .bin",
         r"^ckpt/config\.json: transformers_weights must name a \.safetensors file or a \.safetensors\.index\.json in "
         r"the folder, got 'pytorch_model\.bin'$", in_tmp_cache(lambda: _checkpoint("explicit bin"))),
]
