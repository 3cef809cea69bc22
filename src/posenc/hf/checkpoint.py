"""A local Hugging Face checkpoint folder, read for ``posenc probe`` and ``posenc bench --model``.

A checkpoint folder holds ``config.json`` and ``*.safetensors`` weights (what
``save_pretrained`` writes). Nothing is ever downloaded: the folder must be on disk.

* :func:`estimate_bytes` sums the tensors' sizes from the safetensors *headers* (the first
  bytes of each file), so a model too large for this machine is refused with one line
  before any weight is read (:func:`check_fits`), instead of the process being killed.
* :func:`weight_files`: the safetensors files transformers will read (``model.safetensors``, an
  index's shards, or config.json's ``transformers_weights``), so that the files posenc sizes,
  checks and fingerprints are the files evaluated; :func:`load_model` passes
  ``use_safetensors=True`` so a ``pytorch_model.bin`` beside them is never read instead.
* :func:`load_model` loads it with transformers (an optional dependency, ``posenc[hf]``),
  in eval mode, in the requested dtype; a weight the files lack (which transformers would
  initialise at random) is refused.
* :func:`load_tokenizer` returns the folder's own tokenizer when one was saved, else
  :class:`ByteTokenizer`, a byte-level fallback (token id = byte value), so a tiny
  random-init test model without a tokenizer still reads text.
* :func:`trained_length`: ``original_max_position_embeddings`` (the length before any
  scaling, e.g. Llama 3.1's 8192), else ``max_position_embeddings``, else GPT-J's
  ``n_positions``: the one reading of a config's trained length (probe, bench --model,
  :func:`~posenc.hf.patch_model`).

The checked reads every Hugging Face entry point uses (probe, bench --model, the relative
loaders): each refuses a bad file with one line naming it, never a bare JSONDecodeError or
SafetensorError.

* :func:`read_config`: a folder's config.json as a dict (missing, unreadable, not JSON, not
  a JSON object: refused);
* :func:`check_safetensors`: a weights file's header and size (a file cut short after an
  intact header is refused before any tensor is read; :func:`load_model` checks every file);
* :func:`read_checkpoint`: config.json and the tensors of a folder (``*.safetensors``, else
  ``pytorch_model.bin``), for loaders that take the weights themselves.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .attention import attention_for
from .attention import register as register_attention

__all__ = [
    "DTYPES",
    "ByteTokenizer",
    "Checkpoint",
    "available_memory",
    "check_fits",
    "check_safetensors",
    "estimate_bytes",
    "fingerprint",
    "load_model",
    "load_tokenizer",
    "open_checkpoint",
    "read_checkpoint",
    "read_config",
    "trained_length",
    "weight_files",
]

#: --dtype choices. bfloat16 halves the memory of float32 and keeps its exponent range (a
#: real model's logits do not overflow as they can in float16); q and k are analysed in float32.
DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}

# safetensors dtype names -> bytes per element (the format's own table)
_ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
             "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
_FLOAT_ST = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
# activations, the tokenizer and the interpreter on top of the weights: a floor, not a bound
_OVERHEAD_BYTES = 512 * 2**20
_MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint folder: its path, parsed ``config.json`` and weight files."""

    path: Path
    config: dict[str, Any]
    weights: tuple[Path, ...]

    @property
    def name(self) -> str:
        """The folder's name (the label in tables and plots)."""
        return self.path.resolve().name or str(self.path)


def read_config(folder: str | os.PathLike, what: str = "checkpoint folder") -> dict[str, Any]:
    """``folder/config.json`` as a dict. A missing, unreadable or invalid file, or JSON that is
    not an object, is a ValueError naming the file (``what``: how the folder is named)."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{what} {str(folder)!r} has no config.json (give a save_pretrained folder)")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{cfg_path} cannot be read: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{cfg_path} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{cfg_path} must hold a JSON object, got {type(config).__name__}")
    return config


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Check that ``path`` is a checkpoint folder (config.json + safetensors) and read its config;
    ``weights`` are the files transformers will load (:func:`weight_files`)."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"MODEL_DIR {str(p)!r} is not a directory (give a save_pretrained folder)")
    config = read_config(p, "MODEL_DIR")
    return Checkpoint(p, config, weight_files(p, config))


def weight_files(folder: Path, config: dict[str, Any]) -> tuple[Path, ...]:
    """The safetensors files ``from_pretrained(folder, use_safetensors=True)`` reads, the order
    transformers 5 looks for them in: config.json's ``transformers_weights`` (a file or an index),
    else ``model.safetensors``, else the shards of ``model.safetensors.index.json``. What posenc
    checks (size, headers, fingerprint) is then what is evaluated; a folder whose weights
    transformers would not read (``other.safetensors``, or a ``pytorch_model.bin`` that
    transformers would load instead) is refused with one line."""
    explicit = config.get("transformers_weights")
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.endswith((".safetensors", ".safetensors.index.json")):
            raise ValueError(f"{folder / 'config.json'}: transformers_weights must name a .safetensors file or a "
                             f".safetensors.index.json in the folder, got {explicit!r}")
        chosen = (folder / explicit).resolve()
        if chosen.parent != folder.resolve() or not chosen.is_file():
            raise ValueError(f"{folder / 'config.json'}: transformers_weights {explicit!r} is not a file in MODEL_DIR")
        if explicit.endswith(".safetensors"):
            return (folder / explicit,)
        return _shards(folder / explicit)
    if (folder / "model.safetensors").is_file():
        return (folder / "model.safetensors",)
    if (folder / "model.safetensors.index.json").is_file():
        return _shards(folder / "model.safetensors.index.json")
    found = sorted(x.name for x in folder.iterdir()
                   if x.suffix in (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf"))
    if not any(name.endswith(".safetensors") for name in found):
        hint = f" (found {', '.join(found)}: convert them to safetensors)" if found else ""
        raise ValueError(f"MODEL_DIR {str(folder)!r} has no *.safetensors weights{hint}")
    raise ValueError(f"MODEL_DIR {str(folder)!r} has no model.safetensors or model.safetensors.index.json, the "
                     f"weights transformers reads (found {', '.join(found)}): rename the safetensors file to "
                     "model.safetensors (a .bin is not read)")


def _shards(index: Path) -> tuple[Path, ...]:
    """The files a safetensors index's weight_map names, each a file beside the index."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{index} is not a safetensors index (a JSON object with a weight_map)") from None
    files = []
    for name in names:
        f = index.parent / str(name)
        if not str(name).endswith(".safetensors") or f.resolve().parent != index.parent.resolve() or not f.is_file():
            raise ValueError(f"{index} names the shard {name!r}, which is not a .safetensors file beside it")
        files.append(f)
    if not files:
        raise ValueError(f"{index} names no shard")
    return tuple(files)


def _header_and_size(path: Path) -> tuple[dict[str, Any], int]:
    """(the JSON header of a safetensors file, the size the file must have): an 8-byte
    little-endian header length, the JSON, then the tensors' bytes (up to the largest
    ``data_offsets`` end)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError(f"{path} is not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER:
                raise ValueError(f"{path} is not a safetensors file (header length {n} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {e.strerror or e}") from None
    if len(raw) != n:
        raise ValueError(f"{path} is truncated: its header length says {n} bytes, {len(raw)} follow it")
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{path} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file (its header is not a JSON object)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
                or offsets[0] > offsets[1]):
            raise ValueError(f"{path}: tensor {name!r} has no valid data_offsets in the header")
        end = max(end, offsets[1])
    return header, 8 + n + end


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (8-byte little-endian length, then the JSON)."""
    return _header_and_size(path)[0]


def check_safetensors(path: str | os.PathLike) -> dict[str, Any]:
    """The header of the safetensors file ``path``, after checking that the file holds every
    byte the header describes: a file cut short (an interrupted copy or download) is a
    ValueError naming it, before any tensor is read. Returns the header."""
    path = Path(path)
    header, want = _header_and_size(path)
    have = path.stat().st_size
    if have < want:
        raise ValueError(f"{path} is truncated: its header describes {want} bytes, the file has {have} "
                         "(an interrupted copy or download? copy it again)")
    return header


def estimate_bytes(ckpt: Checkpoint, dtype: torch.dtype) -> int:
    """Bytes the weights take once loaded with floating tensors in ``dtype`` (from the headers)."""
    item = torch.empty((), dtype=dtype).element_size()
    total = 0
    for path in ckpt.weights:
        for name, info in _header(path).items():
            if name == "__metadata__":
                continue
            try:
                st_dtype, shape = info["dtype"], info["shape"]
                numel = math.prod(int(s) for s in shape)
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}: tensor {name!r} has no valid dtype/shape in the header") from None
            total += numel * (item if st_dtype in _FLOAT_ST else _ST_BYTES.get(st_dtype, 8))
    return total


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``), None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(ckpt: Checkpoint, dtype: torch.dtype, available: int | None = None) -> int:
    """Refuse (ValueError) a model whose weights in ``dtype`` plus a small overhead exceed the
    available memory; returns the estimated bytes. ``available`` defaults to :func:`available_memory`."""
    need = estimate_bytes(ckpt, dtype)
    avail = available_memory() if available is None else available
    if avail is not None and need + _OVERHEAD_BYTES > avail:
        gib = 2.0**30
        raise ValueError(
            f"MODEL_DIR {str(ckpt.path)!r} needs about {need / gib:.2f} GiB in {str(dtype).removeprefix('torch.')} "
            f"(from its safetensors headers) plus {_OVERHEAD_BYTES / gib:.1f} GiB overhead, but only "
            f"{avail / gib:.2f} GiB of memory is available; load it in bfloat16 (probe: --dtype bfloat16, bench: --bf16) or use a machine with more memory"
        )
    return need


def fingerprint(ckpt: Checkpoint) -> str:
    """sha256 of config.json and every safetensors header (names, dtypes, shapes, offsets):
    changes when the checkpoint is replaced, without reading gigabytes of weights."""
    h = hashlib.sha256(json.dumps(ckpt.config, sort_keys=True).encode())
    for path in ckpt.weights:
        h.update(path.name.encode())
        h.update(json.dumps(_header(path), sort_keys=True).encode())
    return h.hexdigest()


#: Where a config gives its trained length, in the order read: the length before any scaling
#: (top level, as Phi-3 writes it, then inside the rope dict), the position table's size, and
#: GPT-J's name for that (transformers' attribute_map: max_position_embeddings -> n_positions).
_LENGTH_KEYS = ("original_max_position_embeddings", "rope dict", "max_position_embeddings", "n_positions")


def trained_length(config: Any) -> int:
    """The length a checkpoint was trained at, from its config (a config.json dict or a
    transformers ``PretrainedConfig``): ``original_max_position_embeddings`` (top level, or in
    the rope dict), else ``max_position_embeddings``, else ``n_positions`` (GPT-J). The one
    reading used by ``posenc probe``, ``posenc bench --model`` and :func:`~posenc.hf.patch_model`."""
    if not isinstance(config, dict):
        to_dict = getattr(config, "to_dict", None)
        if not callable(to_dict):
            raise TypeError(f"config must be a dict (config.json) or a transformers PretrainedConfig, "
                            f"got {type(config).__name__}")
        config = to_dict()
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    for key in _LENGTH_KEYS:
        if key == "rope dict":
            value = rope.get("original_max_position_embeddings") if isinstance(rope, dict) else None
            name = "the rope dict's original_max_position_embeddings"
        else:
            value, name = config.get(key), key
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} (the trained length) must be an int >= 2, got {value!r}")
            return value
    raise ValueError("config.json has neither original_max_position_embeddings nor max_position_embeddings "
                     "(nor GPT-J's n_positions): the trained length is unknown")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError("this command needs transformers (pip install 'posenc[hf]')") from None
    return transformers


def load_model(ckpt: Checkpoint, dtype: torch.dtype, *, attn_implementation: str | None = None, device: str = "cpu",
               progress: bool = True):
    """The checkpoint as a transformers causal LM in eval mode (after :func:`check_fits`).
    ``attn_implementation``: None takes transformers' choice for the architecture (SDPA where
    the family has it, eager else: GPT-J has no SDPA path). ``progress=False`` also hides
    transformers' own weight-loading bar. A float32 model on CUDA for which transformers chose
    SDPA is switched to :data:`posenc.hf.attention.ATTENTION_NAME` (its SDPA with the key/value
    heads expanded: otherwise the math kernel's (H, T, T) scores)."""
    transformers = _transformers()
    for path in ckpt.weights:  # a truncated file: one line naming it, not transformers' SafetensorError
        check_safetensors(path)
    if device == "cpu":
        check_fits(ckpt, dtype)
    hf_logging = transformers.utils.logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        chosen = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(ckpt.path), dtype=dtype, output_loading_info=True, use_safetensors=True, **chosen
        )
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    # transformers initialises a weight the files lack at random and only logs it: evaluating
    # that model would give plausible wrong numbers
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ValueError(f"MODEL_DIR {str(ckpt.path)!r} lacks {len(missing)} weight(s) its "
                         f"{ckpt.config.get('model_type')} model needs ({shown}): the checkpoint is incomplete "
                         "or of another architecture")
    model = model.to(device).eval()
    switch = attention_for(device, dtype, model.config._attn_implementation) if attn_implementation is None else None
    if switch is not None:  # float32 SDPA on CUDA: the key/value heads expanded (posenc.hf.attention)
        register_attention()
        model.set_attn_implementation(switch)
    return model


class ByteTokenizer:
    """Byte-level fallback: token id = byte value (UTF-8), for checkpoints saved without a
    tokenizer (random-init test models). Needs a vocabulary of at least 256 ids."""

    kind = "bytes"

    def __init__(self, vocab_size: int):
        if vocab_size < 256:
            raise ValueError(f"the byte-level fallback tokenizer needs vocab_size >= 256, got {vocab_size}; "
                             "save a tokenizer in MODEL_DIR")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens)."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    bos_token_id = None


class _HFTokenizer:
    """A transformers tokenizer behind the same two methods as :class:`ByteTokenizer`."""

    kind = "model"

    def __init__(self, tok: Any):
        self.tok = tok
        self.bos_token_id = tok.bos_token_id
        self.vocab_size = len(tok)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


def load_tokenizer(ckpt: Checkpoint):
    """The folder's tokenizer if one was saved (tokenizer.json / tokenizer_config.json /
    tokenizer.model), else :class:`ByteTokenizer` over the config's ``vocab_size``."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    if any((ckpt.path / n).is_file() for n in names):
        tok = _transformers().AutoTokenizer.from_pretrained(str(ckpt.path))
        vocab = ckpt.config.get("vocab_size")
        if isinstance(vocab, int) and len(tok) > vocab:  # ids past the embedding table
            raise ValueError(f"the tokenizer has {len(tok)} tokens but the model's vocab_size is {vocab}: "
                             "MODEL_DIR's tokenizer does not belong to this model")
        return _HFTokenizer(tok)
    vocab = ckpt.config.get("vocab_size")
    if not isinstance(vocab, int):
        raise ValueError("config.json has no int vocab_size and MODEL_DIR has no tokenizer")
    return ByteTokenizer(vocab)


def read_checkpoint(folder: str | os.PathLike,
                    wanted: re.Pattern[str] | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json as a dict, the tensors whose names match ``wanted``, all when None) of a
    local checkpoint folder: every ``*.safetensors`` file (each checked by
    :func:`check_safetensors` first; only the matching tensors are read), else
    ``pytorch_model.bin`` (read with ``weights_only=True``). Every failure is a ValueError
    naming the folder or the file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"source must be a checkpoint folder (config.json + weights), a module or a state dict; "
                         f"folder {str(folder)!r} does not exist")
    config = read_config(folder)
    state: dict[str, torch.Tensor] = {}
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from .._optional import require

        safe_open = require("safetensors", extra="hf").safe_open
        for file in files:
            check_safetensors(file)
            try:
                with safe_open(str(file), framework="pt") as f:
                    for key in f.keys():
                        if wanted is None or wanted.search(key):
                            state[key] = f.get_tensor(key)
            except Exception as e:  # safetensors' own SafetensorError (a bad dtype, overlapping offsets)
                raise ValueError(f"{file} cannot be read as safetensors: {' '.join(str(e).split())}") from None
    elif (folder / "pytorch_model.bin").is_file():
        path = folder / "pytorch_model.bin"
        try:
            full = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated zip, a pickle that weights_only refuses
            raise ValueError(f"{path} cannot be read as a torch state dict: {' '.join(str(e).split())[:200]}") from None
        if not isinstance(full, dict):
            raise ValueError(f"{path} must hold a state dict (name -> tensor), got {type(full).__name__}")
        state = {k: v for k, v in full.items() if wanted is None or wanted.search(k)}
    else:
        raise ValueError(f"checkpoint folder {str(folder)!r} has no *.safetensors or pytorch_model.bin")
    return config, state
