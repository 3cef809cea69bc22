"""``posenc extend --export`` / ``--gguf`` and :mod:`posenc.hf.export`: each bad input refused in
one line before a model is loaded (the CLI's) or before a file is written."""

from __future__ import annotations

import tempfile
from pathlib import Path

from . import Case

A = "hf export: extend --export, --gguf"
#: the page's text of a message naming a temporary file (its folder differs every run)
_DOC = "--gguf 'TMP/m.gguf'{}"
_X = ["extend", "/no/such/model", "--to", "256"]
_CONFIG = dict(model_type="llama", hidden_size=32, num_attention_heads=4, head_dim=8, rope_theta=10000.0,
               max_position_embeddings=64)


def _winner(**kw) -> object:
    from posenc.hf.export import Winner

    row = dict(label="none", scaling=None, method=None, params={}, hf=None, ppl=1.0, passkey=1.0, passkey_high=1.0)
    return Winner(**(dict(rows=(row,), index=0, config=_CONFIG, L=64, N=256, checkpoint="/m") | kw))


def _check(ctx: int = 64, base: float = 10000.0, rope_freqs: bool = False, raw: bytes | None = None) -> object:
    """check_gguf on a tiny GGUF written here (or ``raw`` bytes)."""
    import numpy as np
    from gguf import GGUFWriter

    from posenc.hf.export.gguf_rope import check_gguf

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.gguf"
        if raw is not None:
            path.write_bytes(raw)
        else:
            w = GGUFWriter(str(path), "llama")
            w.add_context_length(ctx)
            w.add_rope_freq_base(base)
            w.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
            if rope_freqs:
                w.add_tensor("rope_freqs.weight", np.ones(4, dtype=np.float32))
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
        check_gguf(path, _winner())
    return None


def _not_gguf_flag() -> object:
    from posenc.hf.export import check_export

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "m.gguf").write_text("not a gguf")
        check_export(("llama.cpp",), d, Path(d) / "m.gguf")
    return None


def _parse(value: str) -> object:
    from posenc.hf.export import parse_targets

    return parse_targets(value)


CASES = [
    Case(A, "`posenc extend --export hf,ollama` (an unknown target)",
         r"argument --export: must be a comma list of hf, vllm, llama\.cpp; got 'hf,ollama'",
         argv=[*_X, "--export", "hf,ollama"]),
    Case(A, "`posenc extend --export vllm` without --out", r"--export vllm writes files: give --out DIR",
         argv=[*_X, "--export", "vllm"]),
    Case(A, "`posenc extend --gguf m.gguf` without llama.cpp in --export",
         r"--gguf is the llama\.cpp export's input: add llama\.cpp to --export \(got hf\)",
         argv=[*_X, "--out", "/tmp/posenc-never-written", "--gguf", "m.gguf"]),
    Case(A, "`posenc extend --export llama.cpp --gguf /no/such.gguf`", r"--gguf '/no/such\.gguf': no such file",
         argv=[*_X, "--out", "/tmp/posenc-never-written", "--export", "llama.cpp", "--gguf", "/no/such.gguf"]),
    Case(A, "--gguf naming a file that is not a GGUF", r"--gguf '.*m\.gguf' is not a GGUF file \(it starts with b'not ', ",
         run=_not_gguf_flag, doc=_DOC.format(" is not a GGUF file (it starts with b'not ', not b'GGUF')")),
    Case(A, "--gguf naming a truncated GGUF (the magic alone)", r"the GGUF file is unreadable \(truncated or corrupt\)",
         run=lambda: _check(raw=b"GGUF\x03\x00"), doc=_DOC.format(": the GGUF file is unreadable (truncated or corrupt): ...")),
    Case(A, "--gguf of another checkpoint: its context_length is not L", r"llama\.context_length is 128, not the "
         r"checkpoint's L = 64 \(give a GGUF of the same checkpoint\)", run=lambda: _check(ctx=128),
         doc=_DOC.format(": llama.context_length is 128, not the checkpoint's L = 64 (give a GGUF of the same "
                         "checkpoint)")),
    Case(A, "--gguf of another checkpoint: its rope base differs", r"llama\.rope\.freq_base is 500000, not the "
         r"checkpoint's rope base 10000", run=lambda: _check(base=500000.0),
         doc=_DOC.format(": llama.rope.freq_base is 500000, not the checkpoint's rope base 10000 (give a GGUF of "
                         "the same checkpoint)")),
    Case(A, "--gguf that already has rope_freqs.weight (per-pair factors)", r"already has rope_freqs\.weight",
         run=lambda: _check(rope_freqs=True),
         doc=_DOC.format(" already has rope_freqs.weight (per-pair RoPE factors): the export writes the winner's "
                         "RoPE over a GGUF whose RoPE is plain")),
    Case(A, "parse_targets('') (an empty --export)", r"--export must be a comma list of hf, vllm, llama\.cpp; got ''",
         run=lambda: _parse("")),
    Case(A, "Winner with an index past its rows", r"index must be in \[0, 0\], got 3", run=lambda: _winner(index=3)),
    Case(A, "Winner with N not above L", r"L and N must satisfy 1 <= L < N, got L = 64, N = 64",
         run=lambda: _winner(N=64)),
]
