"""Small GGUF files written with the ``gguf`` package, for the tests of ``posenc.hf.models``.

:func:`write_llama` writes a complete Llama checkpoint in the layout llama.cpp gives a real one
(SmolLM2-135M's file: ``token_embd``, ``blk.N.attn_q`` ..., the metadata keys ``llama.*`` and a
byte-level BPE tokenizer ``tokenizer.ggml.*``), small enough to convert in a second; its
arguments make the faults the tests need (a tensor renamed, metadata keys left out).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["byte_tokens", "write_llama", "write_tensor_only"]


def byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet: the 256 printable characters that stand for the bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(keep, keep))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return [chr(chars[b]) for b in range(256)]


def write_llama(path: str | Path, *, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                ffn: int = 64, rename: tuple[str, str] | None = None, metadata: bool = True, seed: int = 0) -> Path:
    """A float32 Llama GGUF file: ``rename`` = (tensor, new name) misnames one tensor;
    ``metadata=False`` leaves out every ``llama.*`` size key (transformers then takes its defaults)."""
    import numpy as np
    from gguf import GGUFWriter

    path = Path(path)
    tokens = ["<|endoftext|>", *byte_tokens(), "Ġt", "he"]
    vocab = len(tokens)
    w = GGUFWriter(str(path), "llama")
    if metadata:
        w.add_block_count(layers)
        w.add_context_length(128)
        w.add_embedding_length(hidden)
        w.add_feed_forward_length(ffn)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (vocab - 1))
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    hd = hidden // heads
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for i in range(layers):
        shapes.update({f"blk.{i}.attn_norm.weight": (hidden,), f"blk.{i}.ffn_norm.weight": (hidden,),
                       f"blk.{i}.attn_q.weight": (hidden, hidden), f"blk.{i}.attn_k.weight": (kv_heads * hd, hidden),
                       f"blk.{i}.attn_v.weight": (kv_heads * hd, hidden),
                       f"blk.{i}.attn_output.weight": (hidden, hidden), f"blk.{i}.ffn_gate.weight": (ffn, hidden),
                       f"blk.{i}.ffn_up.weight": (ffn, hidden), f"blk.{i}.ffn_down.weight": (hidden, ffn)})
    rng = np.random.default_rng(seed)
    for name, shape in shapes.items():
        if rename is not None and name == rename[0]:
            name = rename[1]
        w.add_tensor(name, (0.1 * rng.standard_normal(shape)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tensor_only(path: str | Path, arch: str = "llama", shape: tuple[int, ...] = (32, 32),
                      name: str = "token_embd.weight") -> Path:
    """A GGUF with an architecture and one float32 tensor ``name``, and no other metadata: the file
    a size check of the tensors alone takes for a 4 KB model."""
    import numpy as np
    from gguf import GGUFWriter

    path = Path(path)
    w = GGUFWriter(str(path), arch)
    w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
