"""``posenc extend MODEL --to N``: which training-free RoPE scaling serves length N, measured, and shipped.

Examples::

    posenc extend smollm2-135m --to 16384 --out smollm2-16k       # 2L (see Cost below)
    posenc extend smollm2-135m --to 2048 --trained-length 1024     # a demonstration: the table only
    posenc extend ./ckpt --to 8192 --factors 1 1.5 2 --out ckpt-8k

For a checkpoint trained at L, every candidate of a small grid
(:mod:`posenc.hf.extend_grid`) is evaluated at length N on the local corpus (token perplexity
with its 95 % block-bootstrap interval, one or more windows of N tokens; the Python standard
library's sources unless ``--data``) and on passkey retrieval (``--passkey-examples`` per depth
of ``--depths``, default 0, 0.5 and 1; the accuracy with its 95 % Wilson interval):

* the model as it is (``none``), always;
* each training-free scaling of the registry (``list_scalings(extends=True)``, or those of
  ``--scalings``; ``--scalings none``: no scaling) at the factors ``m * N / L`` for each
  multiplier m of ``--factors`` (default 1 and 2), with the parameters of the scaling's own
  ``extension`` rule; a type whose rule ignores the factor (dynamic NTK, which rescales by the
  current length) is evaluated once. For static NTK the factor is the raised base:
  ``base * s^(d/(d-2))``;
* each training-free attention method (:data:`posenc.methods.METHODS`: Self-Extend, ReRoPE,
  Dual Chunk Attention, or those of ``--methods``; ``--methods none``: no method) at its paper's
  ``recommended(L, N)`` (with ``--method-grid small``, also at the few neighbours its paper or
  code varies: the method's ``grid(L, N)``), on the model types whose attention they replace
  (:data:`posenc.hf.methods.METHOD_MODEL_TYPES`).

**The rule**: the candidates not significantly worse at passkey than the best one (their
accuracy's 95 % Wilson interval reaches the best accuracy) are eligible; among them the lowest
perplexity wins; ties go to the earlier candidate in the table. The winner is written to
``--out`` as a Hugging Face checkpoint that
plain transformers loads unchanged: ``config.json`` with its ``rope_parameters`` from
:func:`posenc.rotary.to_hf` of the patched RoPE (keyed by layer type for Gemma 3, whose
scaling goes to its full layers; and ``max_position_embeddings = N``), the
weights hard-linked (or copied across file systems) and the tokenizer files, beside
``extend.json``, the evidence: settings, the rule, every candidate's numbers and intervals, the
winner. An attention method is not a config entry transformers reads: when one wins, the folder
gets the best RoPE candidate by the same rule (``written`` in extend.json) and the command says
how to run the method (``posenc.hf.patch_model(model, method=..., **params)``).

On several processes: ``torchrun --nproc_per_node R -m posenc extend ...`` splits the
candidates' perplexities and passkey prompts over the R ranks (gloo on a CPU, NCCL with
``--device cuda``, each rank on its own GPU) and gives one process's rows exactly; rank 0 prints
and writes (:mod:`posenc.hf.extend_measure`).

While it runs, one line per finished candidate goes to stderr (``[3/9] YaRN x1.5: ppl 12.3
[12.1, 12.6], passkey 2/3; 41 s; ETA 6.2 min``), the ETA refined from the candidates already
run (their seconds per FLOP times the FLOPs left); on a terminal a bar as well.

Cost: one forward of N tokens per perplexity window and per passkey example, for every
candidate (an attention method costs more: several q·k per pair); the command prints its estimate (:mod:`posenc.hf.cost`, measured on this machine)
before the first forward. docs/real_models.md ("Cost") gives the FLOPs of a forward by length:
at SmolLM2's L = 8192, 4.5 TFLOP at L and 14 TFLOP at 2L.

``--trained-length`` states a shorter L than the checkpoint's own, so that ``N = 2 L`` is cheap:
a demonstration of the procedure, not a measurement of extension (the model was trained well
past that L). It keeps the table and, with ``--json PATH``, the evidence (extend.json's
content); ``--out`` with it is refused, since the folder's config.json would claim an
extension the checkpoint never needed.

Everything config.json decides (the RoPE, L, ``--to``, ``--out``) and the text (the corpus is
long enough for ``--windows`` windows of N tokens) is checked before any weight is read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..files import write_json
from .extend_measure import measure_grid as _measure

__all__ = ["DEVICES", "MAX_COUNT", "MAX_TO", "ExtendSettings", "check_device", "check_writable",
           "clean_stale_temporaries", "extend", "extended_config", "hf_entries", "write_extended"]

#: passkey depths by default: the key at the start, the middle and the end of the prompt
DEPTHS = (0.0, 0.5, 1.0)
#: the device types extend runs on (``cuda:N`` names one GPU)
DEVICES = ("cpu", "cuda")
#: the longest --to: 2^20 tokens, 8x Llama 3.1's 128K
MAX_TO = 2**20
#: the most --windows and --passkey-examples: each is a forward of N tokens per candidate
MAX_COUNT = 1000


@dataclass(frozen=True)
class ExtendSettings:
    """What ``posenc extend`` measures (stored in extend.json). ``scalings`` / ``methods``: the
    families' names in the grid (None: all; (): none); ``depths``: the passkey depths in [0, 1];
    ``device`` (cpu, cuda, cuda:N) and ``dtype`` (a key of :data:`posenc.hf.checkpoint.DTYPES`):
    where and in what the model is loaded."""

    to: int
    trained_length: int | None = None
    factors: tuple[float, ...] = (1.0, 2.0)
    windows: int = 1
    passkey_examples: int = 1
    data: str | None = None
    eval_seed: int = 1234
    scalings: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None
    method_grid: str = "recommended"
    depths: tuple[float, ...] = DEPTHS
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        from ..config import check_choice, check_int, check_positive, check_range

        check_int("--to", self.to, minimum=2, maximum=MAX_TO)
        if self.trained_length is not None:
            check_int("--trained-length", self.trained_length, minimum=2, maximum=MAX_TO)
        if not self.factors:
            raise ValueError("--factors must hold at least one multiplier, got none")
        for f in self.factors:
            check_positive("--factors", f)
        check_int("--windows", self.windows, minimum=1, maximum=MAX_COUNT)
        check_int("--passkey-examples", self.passkey_examples, minimum=1, maximum=MAX_COUNT)
        check_int("eval_seed", self.eval_seed, minimum=0)
        from .checkpoint import DTYPES
        from .extend_grid import METHOD_GRIDS, check_names, method_names, scaling_names

        check_names("--scalings", self.scalings, scaling_names())
        check_names("--methods", self.methods, method_names())
        check_choice("--method-grid", self.method_grid, METHOD_GRIDS)
        if not self.depths:
            raise ValueError("--depths must hold at least one depth in [0, 1], got none")
        for d in self.depths:
            check_range("--depths", d, 0.0, 1.0)
        check_choice("--dtype", self.dtype, tuple(DTYPES))
        check_device(self.device, available=False)

    @property
    def samples(self) -> int:
        """Passkey prompts per candidate."""
        return self.passkey_examples * len(self.depths)


def check_device(device: str, *, available: bool = True) -> None:
    """``device`` must be cpu, cuda or cuda:N (``available``: and present on this machine), else
    one ``ValueError`` naming ``--device``."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type not in DEVICES:
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    if available and dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device!r}: CUDA is not available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def check_writable(config: dict[str, Any], where: str) -> None:
    """Refuse, before any weight is read, a checkpoint whose scaled RoPE extend cannot write as
    transformers ``rope_parameters``: a family whose config has no rope dict (GPT-J: base 10000,
    fixed), and a family with a RoPE per layer type and no layer type a scaling goes to (Gemma
    4: its full layers are p-RoPE, its sliding layers short-range; which to scale is the user's
    call, ``patch_model(model, layer_type=...)``), and an M-RoPE model (Qwen2-VL and its
    successors: to_hf spells 1-D RoPE only)."""
    from ..rotary.hf_readings import HF_READINGS
    from ..rotary.mrope import MROPE_MODEL_TYPES

    model_type = config.get("model_type")
    if model_type in MROPE_MODEL_TYPES:
        raise ValueError(f"{where}: model_type {model_type!r} rotates with M-RoPE (time, height and width sections): "
                         "extend cannot write a scaled M-RoPE as rope_parameters (posenc.rotary.to_hf spells 1-D RoPE)")
    rope = config.get("rope_parameters") or {}
    nested = isinstance(rope, dict) and bool(rope) and all(v is None or isinstance(v, dict) for v in rope.values())
    reading = HF_READINGS.get(model_type)
    if reading is not None and reading.types() == ("default",):
        raise ValueError(f"{where}: model_type {model_type!r} has no rope_parameters in its config (its RoPE is fixed: "
                         "base 10000, no scaling): extend cannot write a scaling transformers would read")
    if reading is None or not (reading.per_layer or nested):
        return
    types = sorted({t for t in config.get("layer_types") or () if not nested or rope.get(t) is not None})
    if len(types) > 1 and not any(t in types for t in reading.scaled_layers):
        raise ValueError(f"{where}: model_type {model_type!r} has a RoPE per layer type ({', '.join(types)}) and none "
                         "is the one its family's rope_scaling scales: extend cannot choose which to scale (patch_model("
                         "model, layer_type=..., scaling=...) and posenc.rotary.to_hf write one by hand)")


def hf_entries(model: Any) -> dict[str, Any]:
    """The config entries of the RoPE(s) a patched ``model`` rotates with:
    :func:`posenc.rotary.to_hf` of :func:`posenc.hf.patch.patched_ropes`, so a model with a RoPE
    per layer type (Gemma 3) gets ``rope_parameters`` keyed by layer type, the scaled type's and
    the others' as patched. ``rope_parameters`` spell frequencies, not the pairing of channels:
    a family that rotates interleaved pairs by its own attention code (Llama 4, Cohere2) is
    written as the same frequencies in to_hf's half layout, which its config reads unchanged."""
    from ..rotary import RotaryEmbedding, to_hf
    from ..rotary.hf_readings import HF_READINGS
    from .patch import patched_ropes

    reading = HF_READINGS.get(model.config.model_type)  # None: an M-RoPE text model (half layout)
    own_layout = reading.layout if reading is not None else "half"

    def spelt(rope: RotaryEmbedding) -> RotaryEmbedding:
        cfg = rope.config
        if cfg.layout == "half" or cfg.layout != own_layout:
            return rope  # half, or a layout the family does not imply: to_hf's own check speaks
        fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
        return type(rope)(type(cfg)(**(fields | dict(cfg.scaling_params()) | {"layout": "half"})), rope.dims)

    ropes = patched_ropes(model)
    if ropes is None:
        raise ValueError("hf_entries needs a patched model (posenc.hf.patch_model)")
    return to_hf({t: spelt(r) for t, r in ropes.items()} if isinstance(ropes, dict) else spelt(ropes))


def extended_config(config: dict[str, Any], hf: dict[str, Any] | None, N: int) -> dict[str, Any]:
    """``config`` (a config.json dict) serving length ``N`` with the RoPE entries ``hf`` (from
    :func:`hf_entries`; None: the RoPE as it is): ``rope_parameters`` replaced, the top-level
    rope keys it supersedes removed (``rope_scaling``, ``rope_theta``, Gemma 3's
    ``rope_local_base_freq``), ``max_position_embeddings`` raised to N unless the entries set
    it (dynamic NTK reads it as the trained length)."""
    from ..rotary.hf_readings import HF_READINGS

    out = dict(config)
    if hf:
        reading = HF_READINGS.get(config.get("model_type"))
        legacy = {"rope_scaling", "rope_theta"} | {key for _, key, _ in (reading.per_layer if reading else ())}
        for key in legacy:  # rope_parameters says it all
            out.pop(key, None)
        out.update(hf)
    if not hf or "max_position_embeddings" not in hf:
        out["max_position_embeddings"] = max(N, int(config.get("max_position_embeddings") or 0))
    return out


def _temporaries(out: Path) -> list[tuple[Path, int]]:
    """(folder, writer's pid) of each temporary folder :func:`write_extended` left beside ``out``."""
    found = []
    for p in out.parent.glob(f".{out.name}.tmp-*"):
        pid = p.name.rsplit("-", 1)[1]
        if pid.isdigit() and p.is_dir():
            found.append((p, int(pid)))
    return found


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts: it cannot be signalled)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:  # not a pid this system can have
        return False
    return True


def clean_stale_temporaries(out: str | os.PathLike) -> list[Path]:
    """Delete the temporary folders an earlier ``extend`` left beside ``out`` when it was killed
    (``kill -9``, a power cut: no ``except`` ran) and whose writer is gone; a live writer's is
    kept. Returns the folders deleted."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    gone = [p for p, pid in _temporaries(out) if not _alive(pid)]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def write_extended(src: Path, out: Path, config: dict[str, Any], evidence: dict[str, Any]) -> None:
    """``out``: ``config`` as config.json, the weights of ``src`` hard-linked (copied across file
    systems), its tokenizer files copied, ``extend.json``; written in a temporary folder beside
    ``out`` (``.NAME.tmp-PID``, removed by the next run if this one is killed) and renamed into place."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {str(out)!r} exists and is not empty; give a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for f in sorted(src.iterdir()):
            if not f.is_file() or f.name in ("config.json", "posenc_model.json", "extend.json"):
                continue
            if f.suffix == ".safetensors":
                try:
                    os.link(f.resolve(), tmp / f.name)
                except OSError:  # another file system: a copy
                    shutil.copy2(f, tmp / f.name)
            else:
                shutil.copy2(f, tmp / f.name)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (tmp / "extend.json").write_text(json.dumps(evidence, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def extend(model: str | os.PathLike, settings: ExtendSettings, out: str | os.PathLike | None = None, *,
           install: bool = True, progress: bool = True, loaded: Any = None, table: bool = True,
           export: tuple[str, ...] = ("hf",), gguf: str | os.PathLike | None = None) -> dict[str, Any]:
    """Measure the grid (module docstring) and, with ``out``, write the winner there.
    Returns the evidence (extend.json's content; with engine exports, ``exports``: what each
    wrote). ``loaded``: the already loaded model (tests; moved to ``settings.device`` and
    ``settings.dtype``); ``table``: print the table to stdout (False: stdout is left to the
    caller, e.g. JSON); ``progress``: a line per candidate on stderr; ``export``: the targets of
    :mod:`posenc.hf.export` (``hf``: the checkpoint folder), ``gguf``: the llama.cpp export's GGUF.

    Under ``torchrun`` the process group this call joins is left before it returns (after every
    rank is done): a rank that exits with a gloo group alive can abort in gloo's threads."""
    import torch.distributed as dist

    joined = dist.is_available() and dist.is_initialized()
    try:
        evidence = _extend(model, settings, out, install=install, progress=progress, loaded=loaded, table=table,
                           export=export, gguf=gguf)
    except BaseException:
        if not joined and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        raise
    if not joined and dist.is_available() and dist.is_initialized():
        dist.barrier()  # rank 0 writes the outputs; no rank leaves the group before it is done
        dist.destroy_process_group()
    return evidence


def _extend(model: str | os.PathLike, settings: ExtendSettings, out: str | os.PathLike | None, *, install: bool,
            progress: bool, loaded: Any, table: bool, export: tuple[str, ...],
            gguf: str | os.PathLike | None) -> dict[str, Any]:
    """:func:`extend`'s work, in the process group it joined (if any)."""
    from .export import Winner, check_export, export_engines
    from .export.gguf_rope import check_gguf
    from .checkpoint import DTYPES, load_model, load_tokenizer, open_checkpoint, trained_length
    from .cost import estimate_cost, forward_flops
    from .evaluation import HFCausalLM, check_finite_weights, check_has_rope, stated_trained_length, token_stream
    from .extend_grid import NONE, candidates, choose, format_table
    from .models import resolve_model
    from .patch import patch_model, unpatch_model
    from .tasks import TextPasskey

    check_device(settings.device)
    check_export(tuple(export), out, gguf)
    settings, rank = _join_ranks(settings)
    if rank:  # under torchrun: every rank measures its share; rank 0 alone prints and writes
        out, table, progress, export = None, False, False, ()
    if out is not None:
        clean_stale_temporaries(out)
        if Path(out).exists() and any(Path(out).iterdir()):
            raise ValueError(f"--out {str(out)!r} exists and is not empty; give a new folder")
    # what config.json, the tokenizer and the text decide, before any weight is read
    where = f"MODEL {str(model)!r}"
    ckpt = open_checkpoint(resolve_model(model, install=install))
    check_writable(ckpt.config, where)  # the family's own reading first: M-RoPE, GPT-J, Gemma 4
    check_has_rope(ckpt.config, where)
    L = stated_trained_length(ckpt, settings.trained_length)
    N = settings.to
    if N <= L:
        raise ValueError(f"--to must exceed the trained length L = {L} (a length the model already serves), got {N}")
    own = trained_length(ckpt.config)
    if out is not None and L < own:
        raise ValueError(f"--out with --trained-length {L}, shorter than the model's own {own}: a demonstration's "
                         "config.json would look like a shipped extension; drop --out (the table is the result) "
                         "or --trained-length")
    if gguf is not None:  # its context length and base against config.json, before any weight is read
        check_gguf(gguf, Winner(({"label": NONE, "scaling": None, "method": None, "params": {}},), 0,
                                ckpt.config, L, N, str(ckpt.path)))
    grid = candidates(L, N, settings.factors, scalings=settings.scalings, methods=settings.methods,
                      model_type=ckpt.config.get("model_type"), method_grid=settings.method_grid)
    tok = load_tokenizer(ckpt)
    passkey = TextPasskey(tok)
    if N < passkey.min_length:
        raise ValueError(f"--to {N} is shorter than a passkey prompt ({passkey.min_length} tokens)")
    stream = token_stream(tok, settings.data, settings.windows * N + 1,
                          asks=f"--to {N} with --windows {settings.windows} (windows of N tokens, and one more)")
    dtype = DTYPES[settings.dtype]
    if loaded is None:
        lm_model = load_model(ckpt, dtype, device=settings.device, progress=progress)
    else:
        lm_model = loaded.to(device=settings.device, dtype=dtype)
    check_finite_weights(lm_model, where)
    lm = HFCausalLM(lm_model).eval()
    cells = [(N, 1, N)] * settings.windows + [(N, 1, 1)] * settings.samples  # one candidate's forwards
    per_candidate = sum(b * forward_flops(ckpt.config, n, k) for n, b, k in cells)
    seconds, peak, _ = estimate_cost(lm, ckpt.config, cells * len(grid))
    if not rank:
        print(f"posenc extend: {len(grid)} candidates at N = {N} (L = {L}) on {settings.device} in {settings.dtype}: "
              f"estimated {seconds / 60:.1f} min, peak memory about {peak / 2**30:.2f} GiB", file=sys.stderr, flush=True)
    written = []  # each candidate's config entries, before any forward: what to_hf cannot spell fails now
    for c in grid:
        if c.scaling is None:
            written.append(None)
            continue
        patch_model(lm_model, scaling=c.scaling, **c.params)
        try:
            written.append(hf_entries(lm_model))
        finally:
            unpatch_model(lm_model)
    rows = _measure(lm, grid, written, settings, stream.to(settings.device), passkey, L,
                    per_candidate, seconds, progress)
    win, rule = choose(rows)
    ropes = [i for i, r in enumerate(rows) if r["method"] is None]  # what config.json can say
    ship = win if rows[win]["method"] is None else ropes[choose([rows[i] for i in ropes])[0]]
    if table:
        print(format_table(rows, win, N, written=ship))
    evidence = dict(model=str(model), checkpoint=str(ckpt.path), trained_length=L,
                    settings=asdict(settings), depths=list(settings.depths), rule=rule, candidates=rows,
                    winner=rows[win]["label"], written=rows[ship]["label"])
    if ship != win and not rank:
        params = ", ".join(f"{k}={v!r}" for k, v in rows[win]["params"].items())
        print(f"posenc extend: {rows[win]['label']} wins by the rule but is an attention method, not a config entry: "
              f"run it with posenc.hf.patch_model(model, method={rows[win]['method']!r}, {params}); "
              f"{'the folder gets ' if out is not None else 'the best RoPE candidate is '}{rows[ship]['label']}",
              file=sys.stderr)
    if out is not None:
        stream = sys.stdout if table else sys.stderr
        if "hf" in export:
            write_extended(ckpt.path, Path(out), extended_config(ckpt.config, rows[ship]["hf"], N), evidence)
            print(f"wrote {out}/config.json ({rows[ship]['label']}), the weights and extend.json", file=stream)
        else:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "extend.json").write_text(json.dumps(evidence, indent=2) + "\n")
        done = export_engines(tuple(export), Winner(tuple(rows), win, ckpt.config, L, N, str(ckpt.path)), out, gguf)
        for e in done:
            for note in e["notes"]:
                print(f"posenc extend: {e['target']}: {note}", file=sys.stderr)
            print(f"wrote {', '.join(e['files'])} ({e['written']}); {e['target']}:\n  {e['command']}", file=stream)
        if done:  # extend.json records what was exported too (written again, atomically)
            evidence = dict(evidence, exports=done)
            write_json(Path(out) / "extend.json", evidence, indent=2)
    return evidence


def _join_ranks(settings: ExtendSettings) -> tuple[ExtendSettings, int]:
    """Join the process group ``torchrun`` describes (gloo on a CPU, NCCL on GPUs), if any:
    ``(settings, rank)``, the device made this rank's own GPU (``cuda:LOCAL_RANK``)."""
    import torch

    from ..bench.train import init_distributed

    device = torch.device(settings.device)
    rank, world = init_distributed(device)
    if world > 1 and device.type == "cuda":
        settings = dataclasses.replace(settings, device=f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
    return settings, rank
