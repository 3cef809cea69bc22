"""A GGUF of the checkpoint with the winner's RoPE in its metadata: every key/value and every
tensor byte copied from the user's GGUF, only the rope keys and the context length changed (and,
for Llama 3's scaling, a ``rope_freqs.weight`` tensor added), then checked: the sha256 of each
tensor's data in the new file equals the old one's (``<name>.sha256.json`` beside it).

Keys (``gguf.Keys.Rope`` and ``Keys.LLM.CONTEXT_LENGTH``, gguf 0.19.0), as llama.cpp (vendored by
llama-cpp-python 0.3.36, ``src/llama-model.cpp``, ``llama_model::load_hparams``) reads them:
``{arch}.context_length`` (n_ctx_train: the default ``-c``), ``{arch}.rope.freq_base``,
``{arch}.rope.scaling.type`` (none / linear / yarn; absent means linear),
``{arch}.rope.scaling.factor`` (freq_scale = 1 / factor), ``{arch}.rope.scaling.original_context_length``
(YaRN's L; absent means context_length), ``{arch}.rope.scaling.attn_factor`` (multiplies YaRN's
1 + 0.1 ln s, ``src/llama-context.cpp``). The legacy ``rope.scale_linear`` is dropped (``factor``
is read first). The llama architecture reads no key for YaRN's betas: the flags carry them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .winner import Winner

__all__ = ["check_gguf", "open_gguf", "rope_metadata", "tensor_hashes", "write_gguf"]

_ROPE_FREQS = "rope_freqs.weight"


def open_gguf(path: Path) -> Any:
    """A GGUFReader of ``path``; one ValueError naming ``--gguf`` when it is missing or not a GGUF
    (:func:`posenc.engines.gguf_meta.open_gguf`)."""
    from ...engines.gguf_meta import open_gguf as open_reader

    return open_reader(path, f"--gguf {str(path)!r}")


def _value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def check_gguf(path: str | os.PathLike, winner: Winner) -> Any:
    """The reader of ``path`` once it is a GGUF of ``winner``'s checkpoint: a GGUF (ValueError
    otherwise), its ``{arch}.context_length`` the trained L and its rope base the config's (to
    float32), no ``rope_freqs.weight`` already (per-pair factors this export would stack on)."""
    path = Path(path)
    reader = open_gguf(path)
    arch = _value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"--gguf {str(path)!r} has no general.architecture key")
    ctx = _value(reader, f"{arch}.context_length")
    if ctx != winner.L:
        raise ValueError(f"--gguf {str(path)!r}: {arch}.context_length is {ctx}, not the checkpoint's L = {winner.L} "
                         "(give a GGUF of the same checkpoint)")
    base = float(winner.rope(dict(winner.row, scaling=None, method=None, hf=None)).config.base)
    got = _value(reader, f"{arch}.rope.freq_base")
    got = 10000.0 if got is None else float(got)  # llama.cpp's default when the key is absent
    if abs(got - base) > 1e-6 * base:
        raise ValueError(f"--gguf {str(path)!r}: {arch}.rope.freq_base is {got:g}, not the checkpoint's rope base "
                         f"{base:g} (give a GGUF of the same checkpoint)")
    if any(t.name == _ROPE_FREQS for t in reader.tensors):
        raise ValueError(f"--gguf {str(path)!r} already has {_ROPE_FREQS} (per-pair RoPE factors): the export "
                         "writes the winner's RoPE over a GGUF whose RoPE is plain")
    return reader


def rope_metadata(arch: str, plan: dict[str, Any], N: int) -> tuple[dict[str, tuple[Any, Any]], set[str]]:
    """({key: (value, GGUFValueType)} to set, {keys} to drop) for the plan of
    :func:`posenc.hf.export.llamacpp.rope_plan` at context N."""
    from gguf import GGUFValueType as T
    from gguf import Keys

    def k(name: str) -> str:
        return name.format(arch=arch)

    R = Keys.Rope
    put: dict[str, tuple[Any, Any]] = {
        k(Keys.LLM.CONTEXT_LENGTH): (int(N), T.UINT32),
        k(R.FREQ_BASE): (float(plan["freq_base"]), T.FLOAT32),
        k(R.SCALING_TYPE): (plan["type"], T.STRING),
    }
    drop = {k("{arch}.rope.scale_linear"), k(R.SCALING_FACTOR), k(R.SCALING_ORIG_CTX_LEN), k(R.SCALING_ATTN_FACTOR)}
    if plan["type"] in ("linear", "yarn"):
        put[k(R.SCALING_FACTOR)] = (float(plan["factor"]), T.FLOAT32)
    if plan["type"] == "yarn":
        put[k(R.SCALING_ORIG_CTX_LEN)] = (int(plan["orig_ctx"]), T.UINT32)
        put[k(R.SCALING_ATTN_FACTOR)] = (float(plan["attn_factor"]), T.FLOAT32)
    return put, drop - set(put)


def tensor_hashes(reader: Any) -> dict[str, str]:
    """sha256 of each tensor's data bytes, by name."""
    return {t.name: hashlib.sha256(t.data.tobytes()).hexdigest() for t in reader.tensors}


def write_gguf(src: Path, out: Path, plan: dict[str, Any], winner: Winner) -> list[str]:
    """``out/<src stem>.posenc-<N>.gguf`` (the copy with :func:`rope_metadata`; with
    ``freq_factors``, a float32 ``rope_freqs.weight`` added) and ``<that>.sha256.json``; written
    to a temporary name and renamed once every tensor's hash is checked. Returns both paths."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

    reader = check_gguf(src, winner)
    arch = _value(reader, "general.architecture")
    put, drop = rope_metadata(arch, plan, winner.N)
    dst = out / f"{src.stem}.posenc-{winner.N}.gguf"
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    writer = GGUFWriter(str(tmp), arch, endianess=reader.endianess)
    writer.data_alignment = reader.alignment
    try:
        for field in reader.fields.values():
            if field.name == "general.architecture" or field.name.startswith("GGUF.") or field.name in drop:
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
            if field.name in put:  # a changed key keeps the source's type (a UINT64 context length stays one)
                writer.add_key_value(field.name, put.pop(field.name)[0], vtype, sub_type=sub)
            else:
                writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
        for key, (value, vtype) in put.items():
            writer.add_key_value(key, value, vtype)
        added = {}
        if "freq_factors" in plan:  # conversion/llama.py's rope_freqs: theta_i / theta'_i, float32, (d/2,)
            added[_ROPE_FREQS] = np.asarray(plan["freq_factors"], dtype=np.float32)
        for t in reader.tensors:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        for name, data in added.items():
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, GGMLQuantizationType.F32)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in reader.tensors:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        for data in added.values():
            writer.write_tensor_data(data)
        writer.close()
        before, after = tensor_hashes(reader), tensor_hashes(GGUFReader(str(tmp)))
        changed = sorted(n for n in before if after.get(n) != before[n])
        if changed or set(after) != set(before) | set(added):
            raise ValueError(f"the GGUF written from {src} differs in tensors {changed or sorted(set(after) ^ set(before))}")
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    record = dict(source=str(src), written=str(dst), tensors=before,
                  added={n: after[n] for n in added}, rope=plan | {"context_length": winner.N})
    sums = dst.with_name(dst.name + ".sha256.json")
    sums.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return [str(dst), str(sums)]

