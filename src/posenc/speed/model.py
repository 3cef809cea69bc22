"""Whole-model cost of every encoding: a training step and KV-cache decoding, as ratios to NoPE.

Each encoding is put in the same model (same width, depth, heads, seed) and timed side by side
with NoPE in one run, in pairs: only the encoding's model and NoPE's are alive while they
alternate, so a machine that slows down for a while slows both alike. Training: one step of
each per round, the ratio is the median over rounds of the two steps' ratio. Decoding: both
models hold a cache of the context and decode in turn, one token each, ``rounds *
decode_tokens`` timed steps apiece; the ratio is that of the median steps. NoPE's own
numbers are the medians over all its pairs.

``isolate=True`` (the CLI's default) measures each encoding in a process of its own, one after
the other, each with a NoPE of its own: rows no longer inherit what earlier rows left in the
process. In one process, the rows measured after the memory-heavy ones (PaTH, DeBERTa) read
their decoding up to 4 % slower against NoPE than the same encodings measured alone (RoPE
1.07x / 1.06x after them, 1.03x / 1.04x alone), the extra Python work of a step slowing more
than NoPE's step. NoPE's absolute numbers are then the medians over the processes' own.

Goals (ratio to NoPE, :data:`GOALS`), by the hooks an encoding uses: rotary and absolute <= 1.05;
content-independent biases (``logit_bias``) <= 1.15 in time and 1.10 in peak memory;
content-dependent terms (``terms``) <= 1.6 in time and 1.3 in peak memory with one logit term
per layer (Shaw, relative_key, CoPE's count) and <= 2 with two (relative_key_query,
Transformer-XL, DeBERTa), decoding included; prefix-sum terms alone (FoX: O(T) sums, no
(T, T) tensor) are held to a bias's goal. An encoding whose ``rotate`` widens q and k (PoPE:
2D channels against D) does more work by construction: its time goal in each column is its
class goal times the ratio of the model's matmul FLOPs to NoPE's there (:func:`flops_ratio`:
projections, MLP, head, and q·kᵀ and p·v over the keys each query sees; a training step's
backward as the backend runs it, a flash backward recomputing q·kᵀ), so only the cost beyond
its arithmetic counts against it.

``impl`` picks the attention backend of every model (posenc.backends: eager, sdpa, flex,
auto); the results record it. Where flex_attention cannot train (on CPU unless
:data:`posenc.torch_facts.FLEX_HAS_CPU_BACKWARD`), ``flex`` is refused for the training columns.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch
import torch.nn.functional as F

from ..attention import Attention
from ..backends import IMPLS
from ..config import check_int
from ..encoding import QKProjection
from ..model import Transformer
from ..model_config import ModelConfig
from ..registry import get_info
from ..terms import PrefixSumTerm, ValueTerm
from ..torch_facts import FLEX_HAS_CPU_BACKWARD
from .timing import describe_machine, peak_memory

__all__ = ["GOALS", "goal_for", "qk_width", "flops_ratio", "run_model_speed", "row_ratios", "column_goals",
           "within_goal", "goal_label", "format_table"]


# Goals, ratios to NoPE: (time, for the training step and every decoding context; peak training
# memory, or None where none is set).
GOALS: dict[str, tuple[float, float | None]] = {
    "rotary/absolute": (1.05, None),
    "position bias": (1.15, 1.10),
    "prefix sums": (1.15, 1.10),  # FoX: per-token sums, a bias's cost
    "content-dependent, one term": (1.6, 1.3),  # Shaw, relative_key, CoPE
    "content-dependent, two terms": (2.0, None),  # relative_key_query, Transformer-XL, DeBERTa
}


def goal_for(model: Transformer) -> tuple[str, float, float | None]:
    """(class, time goal, memory goal) of a model's encodings, from the hooks they use (never
    their names): content-dependent terms, counted on a two-token probe, or a bias."""
    encs = list(model.encodings)
    if any(e.has_terms or e.has_value_terms for e in encs):
        kinds = [_logit_terms(e) for e in encs]
        if max(map(len, kinds)) >= 2:
            cls = "content-dependent, two terms"
        elif all(isinstance(t, PrefixSumTerm) for k in kinds for t in k) and any(kinds):
            cls = "prefix sums"
        else:
            cls = "content-dependent, one term"
    elif any(e.has_bias for e in encs):
        cls = "position bias"
    else:
        cls = "rotary/absolute"
    return (cls, *GOALS[cls])


def qk_width(enc) -> int:
    """The width of q and k after ``enc.rotate`` (PoPE: twice the head dim), from a probe."""
    dims = enc.dims
    if not enc.has_rotate:
        return dims.head_dim
    pos = torch.arange(2)[None]
    q = torch.zeros(1, dims.num_heads, 2, dims.head_dim)
    with torch.no_grad():
        return enc.rotate(q, q, pos, pos, enc.prepare(pos, pos))[0].shape[-1]


def flops_ratio(model: Transformer, keys: float, *, backward: bool = False, recompute: bool = True) -> float:
    """Matmul FLOPs per token of ``model`` over NoPE's in the same shape, with ``keys`` keys
    per query (causal training at length T: (T + 1) / 2; decoding at context C: C + 1): the
    projections, the MLP and the head, plus q·kᵀ at the width the encodings' ``rotate`` returns
    (w) and p·v at the head dim (D).

    ``backward``: a training step's count, the forward and the backward. Every dense layer's
    backward is two products of its forward's size (3x in all). Attention's backward is dq and
    dk at width w, dv = Pᵀ·dO and dP = dO·vᵀ at D, and, with ``recompute`` (a flash backward,
    Dao et al. 2022, Alg. 2: torch's SDPA kernels and posenc's blockwise ones, every backend but
    ``eager``), q·kᵀ once more at w: per query, key and head 4w + 3D in all against NoPE's 7D
    (without it 3w + 3D against 6D)."""
    c = model.cfg
    H, C = c.n_head, c.d_model
    D = C // H
    Hkv = c.n_kv_head or H
    d_ff = c.d_ff or 4 * C
    dense = c.n_layer * (C * (H * D) * 2 + 2 * C * (Hkv * D) + 2 * C * d_ff) + C * c.vocab_size
    w = max(qk_width(e) for e in model.encodings) if len(model.encodings) else D
    if not backward:
        per_key, nope = w + D, 2 * D
    elif recompute:
        dense, per_key, nope = 3 * dense, 4 * w + 3 * D, 7 * D
    else:
        dense, per_key, nope = 3 * dense, 3 * w + 3 * D, 6 * D
    return (dense + c.n_layer * H * keys * per_key) / (dense + c.n_layer * H * keys * nope)


def column_goals(res: dict[str, Any], name: str) -> tuple[dict, dict]:
    """``name``'s time goal per training length and per decoding context: its class goal, times
    the FLOPs ratio where the results hold one (``res["flops_ratio"]``; 1 for every encoding
    that keeps q·k's width, and for files written before)."""
    goal = res["goal"][name][1]
    flops = res.get("flops_ratio", {}).get(name, {})
    train, decode = row_ratios(res, name)
    return ({T: goal * flops.get("train", {}).get(T, 1.0) for T in train},
            {C: goal * flops.get("decode", {}).get(C, 1.0) for C in decode})


def within_goal(res: dict[str, Any], name: str) -> bool:
    """Whether every time ratio of ``name`` is within its column's goal and its peak training
    memory within the memory goal (where its class has one)."""
    mem_goal = (*res["goal"][name], None)[2]  # older files have no memory goal
    (T_mem, m), = res["memory"][name].items()
    mem_ok = mem_goal is None or m / res["memory"]["none"][T_mem] <= mem_goal
    goals, ratios = column_goals(res, name), row_ratios(res, name)
    return mem_ok and all(ratios[i][key] <= goals[i][key] for i in (0, 1) for key in ratios[i])


def goal_label(res: dict[str, Any], name: str, fmt=lambda x: f"<= {x:.2f}x") -> tuple[str, str | None]:
    """(time goal, memory goal or None) as text; a goal scaled by FLOPs names its columns' values."""
    _, goal, mem_goal = (*res["goal"][name], None)[:3]
    train, decode = column_goals(res, name)
    values = [*train.values(), *decode.values()]
    text = fmt(goal)
    if any(abs(v - goal) > 1e-9 for v in values):
        text += " × FLOPs ratio (" + ", ".join(f"{v:.2f}" for v in values) + ")"
    return text, None if mem_goal is None else fmt(mem_goal)


def _logit_terms(enc) -> list:
    """The logit terms (not value terms) ``enc.terms`` returns for one layer."""
    if not enc.has_terms:
        return []
    dims = enc.dims
    pos = torch.arange(2)[None]
    q = torch.zeros(1, dims.num_heads, 2, dims.head_dim)
    layer = Attention(dims.d_model, dims.num_heads, head_dim=dims.head_dim)
    proj = QKProjection.of(layer, torch.zeros(1, 2, dims.d_model))  # a layer input, for terms that read it (FoX)
    with torch.no_grad():
        terms = enc.terms(q, q, enc.prepare(pos, pos), proj)
    return [t for t in terms if not isinstance(t, ValueTerm)]


def _config_for(name: str, max_len: int) -> dict[str, Any]:
    # Table-based encodings must cover the longest context measured.
    fields = {f.name for f in dataclasses.fields(get_info(name).config_cls)}
    return {"max_len": max_len} if "max_len" in fields else {}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_model_speed(
    encodings: list[str],
    lengths: list[int],
    *,
    batch: int = 8,
    layers: int = 6,
    width: int = 512,
    heads: int = 8,
    rounds: int = 3,
    decode_contexts: list[int] = (1024, 4096),
    decode_tokens: int = 16,
    decode_batch: int = 1,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    vocab: int = 256,
    progress: bool = True,
    impl: str = "sdpa",
    isolate: bool = False,
) -> dict[str, Any]:
    """Time a training step per length and decoding per context for every encoding, every
    model with attention backend ``impl`` (one of posenc.backends.IMPLS); ``isolate``: each
    encoding in a process of its own (see the module docstring)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}")
    if impl == "flex" and device == "cpu" and lengths and not FLEX_HAS_CPU_BACKWARD:
        raise ValueError(f"impl='flex' cannot time training on CPU (flex_attention has no CPU backward in "
                         f"torch {torch.__version__}); use --impl sdpa/auto, or a CUDA device")
    for field, value in (("batch", batch), ("layers", layers), ("width", width), ("heads", heads),
                         ("rounds", rounds), ("decode_tokens", decode_tokens), ("decode_batch", decode_batch)):
        check_int(field, value, minimum=1)
    if width % heads:
        raise ValueError(f"width ({width}) must be divisible by heads ({heads})")
    if not lengths:
        raise ValueError("lengths must name at least one training length (the memory column is measured at the shortest)")
    for T in lengths:
        check_int("lengths", T, minimum=1)
    for C in decode_contexts:
        check_int("decode_contexts", C, minimum=1)
    others = [n for n in dict.fromkeys(encodings) if n != "none"]
    if not isinstance(isolate, bool):
        raise TypeError(f"isolate must be a bool, got {isolate!r}")
    if isolate and len(others) > 1:
        settings = dict(lengths=lengths, batch=batch, layers=layers, width=width, heads=heads, rounds=rounds,
                        decode_contexts=decode_contexts, decode_tokens=decode_tokens, decode_batch=decode_batch,
                        device=device, dtype=dtype, vocab=vocab, impl=impl)
        return _run_isolated(others, settings, progress)
    max_len = max([*lengths, *(c + rounds * decode_tokens + 1 for c in decode_contexts)])
    g = torch.Generator().manual_seed(0)

    def build_model(name: str) -> tuple[Transformer, torch.optim.Optimizer]:
        torch.manual_seed(0)
        cfg = ModelConfig(
            vocab_size=vocab, d_model=width, n_layer=layers, n_head=heads,
            encoding=name, encoding_config=_config_for(name, max_len), attn_impl=impl,
        )
        model = Transformer(cfg).to(device=device, dtype=dtype)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step(pair: tuple[Transformer, torch.optim.Optimizer], T: int) -> float:
        """One training step's seconds."""
        m, opt = pair
        x = torch.randint(0, vocab, (batch, T + 1), generator=g).to(device)
        _sync()
        t0 = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16 and device == "cuda"):
            logits = m(x[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _sync()
        return time.perf_counter() - t0

    @torch.no_grad()
    def decode_steps(models: list[Transformer], C: int) -> list[list[float]]:
        """Seconds of each timed greedy step per model: every model holds a cache of C random
        tokens and they decode in turn, one token each (the first step untimed)."""
        live = []
        for m in models:
            m.eval()
            cache = m.new_cache()
            x = torch.randint(0, vocab, (decode_batch, C), generator=g).to(device)
            live.append([cache, m(x, cache=cache)[:, -1:].argmax(-1)])
        steps: list[list[float]] = [[] for _ in models]
        for i in range(rounds * decode_tokens + 1):
            for m, state, out in zip(models, live, steps):
                _sync()
                t0 = time.perf_counter()
                state[1] = m(state[1], cache=state[0])[:, -1:].argmax(-1)
                _sync()
                if i:
                    out.append(time.perf_counter() - t0)
        for m in models:
            m.train()
        return steps

    results: dict[str, Any] = {
        "machine": describe_machine(),
        "settings": dict(batch=batch, layers=layers, width=width, heads=heads, dtype=str(dtype),
                         rounds=rounds, decode_tokens=decode_tokens, decode_batch=decode_batch, impl=impl, isolate=False,
                         method="paired: each encoding alternates with NoPE; ratios are medians of "
                                "per-round training ratios and ratios of median decoding steps"),
        "train": {"none": {}}, "decode": {"none": {}}, "memory": {}, "goal": {}, "flops_ratio": {},
        "ratio": {"train": {"none": {T: 1.0 for T in lengths}}, "decode": {"none": {C: 1.0 for C in decode_contexts}}},
        "rounds": {},  # every round's training ratio to NoPE, per encoding and length
    }
    per_encoding = len(lengths) * (rounds + 1) + len(decode_contexts) + 1
    bar = None
    if progress:
        from ..progress import bar as progress_bar

        bar = progress_bar(max(len(others), 1) * per_encoding, "speed model", unit="run")
    reference = build_model("none")
    ref_train: dict[int, list[float]] = {T: [] for T in lengths}
    ref_decode: dict[int, list[float]] = {C: [] for C in decode_contexts}
    # Each encoding is measured against NoPE in alternation, with only the two models (and their
    # optimizer state) alive: with every model of the registry alive at once, a training step
    # varied by +-15% from round to round on a 2-core machine; in pairs, by about 5%.
    for name in others or ["none"]:
        model = reference if name == "none" else build_model(name)
        for T in lengths:
            pairs = []
            for r in range(rounds + 1):  # round 0 is warm-up
                t_ref = train_step(reference, T)
                t = t_ref if name == "none" else train_step(model, T)
                if r:
                    pairs.append((t_ref, t))
                if bar:
                    bar.update()
            ref_train[T] += [a for a, _ in pairs]
            results["train"].setdefault(name, {})[T] = statistics.median(b for _, b in pairs)
            results["ratio"]["train"].setdefault(name, {})[T] = statistics.median(b / a for a, b in pairs)
            results["rounds"].setdefault(name, {})[T] = [round(b / a, 4) for a, b in pairs]  # the spread, kept
        for C in decode_contexts:
            # Tokens/s from the median step: a step that meets a one-off cost (the KV cache
            # doubling its buffers, a scheduler hiccup) does not move it.
            if name == "none":
                (ref_steps,) = decode_steps([reference[0]], C)
                steps = ref_steps
            else:
                ref_steps, steps = decode_steps([reference[0], model[0]], C)
            ref_decode[C] += ref_steps
            results["decode"].setdefault(name, {})[C] = decode_batch / statistics.median(steps)
            results["ratio"]["decode"].setdefault(name, {})[C] = statistics.median(steps) / statistics.median(ref_steps)
            if bar:
                bar.update()
        T_mem = min(lengths)
        results["memory"][name] = {T_mem: peak_memory(lambda: train_step(model, T_mem))}
        results["goal"][name] = goal_for(model[0])
        results["flops_ratio"][name] = {"train": {T: flops_ratio(model[0], (T + 1) / 2, backward=True,
                                                                 recompute=impl != "eager") for T in lengths},
                                        "decode": {C: flops_ratio(model[0], C + 1) for C in decode_contexts}}
        if bar:
            bar.update()
        del model
    for T in lengths:
        results["train"]["none"][T] = statistics.median(ref_train[T])
    for C in decode_contexts:
        results["decode"]["none"][C] = decode_batch / statistics.median(ref_decode[C])
    if "none" not in results["memory"]:
        results["memory"]["none"] = {min(lengths): peak_memory(lambda: train_step(reference, min(lengths)))}
        results["goal"]["none"] = goal_for(reference[0])
        results["flops_ratio"]["none"] = {"train": {T: 1.0 for T in lengths}, "decode": {C: 1.0 for C in decode_contexts}}
    if bar:
        bar.close()
    # Rows in the order asked for, NoPE first.
    order = ["none", *others]
    for key in ("train", "decode", "memory", "goal", "flops_ratio"):
        results[key] = {n: results[key][n] for n in order}
    for key in ("train", "decode"):
        results["ratio"][key] = {n: results["ratio"][key][n] for n in order}
    return results


def _one_row(name: str, settings: dict[str, Any], threads: int) -> dict[str, Any]:
    """One encoding paired with a NoPE of its own, in a fresh process (``isolate``)."""
    torch.set_num_threads(threads)
    return run_model_speed([name], progress=False, **settings)


def _run_isolated(names: list[str], settings: dict[str, Any], progress: bool) -> dict[str, Any]:
    """:func:`run_model_speed` with each of ``names`` in a process of its own, one at a time
    (never two at once: they would time each other), merged into one result with NoPE first."""
    rows = []
    bar = None
    if progress:
        from ..progress import bar as progress_bar

        bar = progress_bar(len(names), "speed model", unit="encoding")
    # A spawned process per row (a fork would inherit this process's heap and threads).
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                             max_tasks_per_child=1) as pool:
        for name in names:
            rows.append(pool.submit(_one_row, name, settings, torch.get_num_threads()).result())
            if bar:
                bar.update()
    if bar:
        bar.close()
    merged: dict[str, Any] = {"machine": rows[0]["machine"], "settings": {**rows[0]["settings"], "isolate": True}}
    for key in ("train", "decode", "memory"):  # NoPE's numbers: the median over the processes' own
        merged[key] = {"none": {c: statistics.median(row[key]["none"][c] for row in rows) for c in rows[0][key]["none"]},
                       **{n: row[key][n] for row, n in zip(rows, names)}}
    for key in ("goal", "flops_ratio"):
        merged[key] = {"none": rows[0][key]["none"], **{n: row[key][n] for row, n in zip(rows, names)}}
    merged["ratio"] = {k: {"none": rows[0]["ratio"][k]["none"], **{n: row["ratio"][k][n] for row, n in zip(rows, names)}}
                       for k in ("train", "decode")}
    merged["rounds"] = {n: row["rounds"][n] for row, n in zip(rows, names)}
    return merged


def row_ratios(res: dict[str, Any], name: str) -> tuple[dict, dict]:
    """``name``'s (training-step ratio per length, decoding-step ratio per context) to NoPE:
    the paired ratios of the results (``res["ratio"]``), or, in files written before the
    measurement was paired, the ratios of the absolute numbers."""
    if "ratio" in res:
        return res["ratio"]["train"][name], res["ratio"]["decode"][name]
    train, decode = res["train"], res["decode"]
    return ({T: train[name][T] / train["none"][T] for T in train[name]},
            {C: decode["none"][C] / decode[name][C] for C in decode[name]})


def format_table(res: dict[str, Any]) -> str:
    """Rows: encodings; columns: train-step ratio per length, decode ratio per context."""
    train, decode, mem = res["train"], res["decode"], res["memory"]
    lengths = sorted(next(iter(train.values())))
    contexts = sorted(next(iter(decode.values()))) if decode else []
    head = ["encoding", "goal"] + [f"train T={T}" for T in lengths] + [f"decode ctx={C}" for C in contexts]
    head += ["peak mem", "within goal"]
    rows = [head]
    for name in train:
        train_ratio, decode_ratio = row_ratios(res, name)  # decoding: time per token
        ratios = [train_ratio[T] for T in lengths] + [decode_ratio[C] for C in contexts]
        (T_mem, m), = mem[name].items()
        m0 = mem["none"][T_mem]
        time_goal, mem_goal = goal_label(res, name)
        label = time_goal + (f", mem {mem_goal}" if mem_goal is not None else "")
        ok = within_goal(res, name)
        rows.append([name, label] + [f"{r:.2f}x" for r in ratios] + [f"{m / m0:.2f}x", "yes" if ok else "NO"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    base = [f"NoPE: " + ", ".join(f"train T={T} {train['none'][T]*1e3:.0f} ms" for T in lengths)]
    base += [", ".join(f"decode ctx={C} {decode['none'][C]:.1f} tok/s" for C in contexts)]
    return "\n".join(lines + [""] + base + [f"machine: {res['machine']}"])

