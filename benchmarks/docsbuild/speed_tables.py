"""Tables of the speed commands (``posenc speed rope | relative | model``) and of SmolLM2's decoding
speed and memory with posenc's RoPE patched in. Ratios are side by side within one run."""

from __future__ import annotations

from .captions import caption, duration, gib, md_table, ratio

# The RoPE implementations of ``posenc speed rope``, as their columns are headed.
ROPE_IMPLS = {"posenc": "posenc (auto)", "posenc-interleaved": "posenc-interleaved", "posenc-eager": "posenc-eager",
              "posenc-eager-interleaved": "posenc-eager-interleaved",
              "hf": "transformers `apply_rotary_pos_emb`", "ret": "rotary-embedding-torch"}


ROPE_IMPLS_CUDA = {"posenc": "posenc (auto)", "posenc-triton-table": "posenc Triton (cos/sin tables)",
                   "posenc-triton-angles": "posenc Triton (angles in the kernel)",
                   "hf": "transformers `apply_rotary_pos_emb`"}


def rope(page: str, load) -> str:
    """Every posenc kernel and layout beside the peers, as a multiple of a plain copy of q and k."""
    return _rope(page, load, "rope_cpu", ROPE_IMPLS)


def rope_cuda(page: str, load) -> str:
    """The same on one GPU, with posenc's Triton kernel."""
    return _rope(page, load, "rope_h100", ROPE_IMPLS_CUDA)


def _rope(page: str, load, name: str, impls: dict[str, str]) -> str:
    data = load(name)
    blocks: dict[tuple[str, str, int], dict[str, dict]] = {}
    for r in data["rows"]:  # files from before forward+backward timing are "fwd"
        blocks.setdefault((r["dtype"], r.get("mode", "fwd"), r["T"]), {})[r["impl"]] = r
    assert blocks, f"{name}.json has no rows"
    with_mode = len({mode for _, mode, _ in blocks}) > 1  # a mode column only when there is a choice
    rows = [[dtype, *([mode] if with_mode else []), str(T), f"{b['copy']['ms']:.3f}"]
            + [ratio(b[i]["x_copy"]) if i in b else "–" for i in impls] for (dtype, mode, T), b in blocks.items()]
    header = ["dtype", *(["mode"] if with_mode else []), "T", "copy ms", *impls.values()]
    shape = f"B={data['B']}, H={data['H']}, D={data['D']}"
    return md_table(header, rows) + "\n\n" + caption(name, page, data,
                                                     f"Rotate q and k ({shape}); time as a multiple of the copy")


RELATIVE_T = 2048  # the length the tables quote; the file holds every length


def _relative_at(data: dict, T: int) -> dict[str, dict]:
    for res in data["results"]:
        if res["length"] == T:
            return res["rows"]
    raise ValueError(f"relative results have no T={T}; lengths: {[r['length'] for r in data['results']]}")


def relative_scores(page: str, load) -> str:
    """Score terms at T=2048 against plain q·k^T and HF's (T, T, D) einsum."""
    data = load("relative_cpu")
    rows = _relative_at(data, RELATIVE_T)
    base, ein = rows["plain q·k^T"], rows["einsum (T,T,D) rkq"]
    out = [[label.removeprefix("score "), ratio(r["time_ms"] / base["time_ms"]), ratio(ein["time_ms"] / r["time_ms"]),
            ratio(ein["peak_mib"] / r["peak_mib"])] for label, r in rows.items() if label.startswith("score ")]
    assert out, "relative_cpu.json has no score rows"
    setup = (f"T = {RELATIVE_T}, batch {data['batch']}, {data['heads']} heads, head dim {data['head_dim']}, "
             f"{data['dtype']}; plain q·k^T {base['time_ms']:.1f} ms")
    return (md_table(["score term", "time vs q·k^T", "faster than the einsum", "less peak memory than the einsum"], out)
            + "\n\n" + caption("relative_cpu", page, data, setup))


def relative_bias(page: str, load) -> str:
    """Content-independent biases at T=2048: per layer and per forward, against causal SDPA."""
    data = load("relative_cpu")
    rows = _relative_at(data, RELATIVE_T)
    sdpa = rows["sdpa causal"]
    names = [label.removeprefix("bias ").removesuffix(" (per forward)") for label in rows if label.startswith("bias ")]
    assert names, "relative_cpu.json has no bias rows"
    out = [[n, ratio(rows[f"sdpa + bias {n} (per layer)"]["time_ms"] / sdpa["time_ms"]),
            ratio(rows[f"bias {n} (per forward)"]["time_ms"] / sdpa["time_ms"])] for n in names]
    return (md_table(["bias", "causal SDPA with the bias, per layer", "building the masked bias, per forward"], out)
            + "\n\n" + caption("relative_cpu", page, data,
                               f"T = {RELATIVE_T}; as a multiple of plain causal SDPA ({sdpa['time_ms']:.1f} ms)"))


def relative_long(page: str, load) -> str:
    """Score terms at T=8192: time and peak memory (the einsum is not run at this length)."""
    data = load("relative_cpu_8192")
    (res,) = data["results"]
    rows = res["rows"]
    base = rows["plain q·k^T"]
    out = [[label.removeprefix("score "), ratio(r["time_ms"] / base["time_ms"]), f"{r['peak_mib'] / 1024:.2f}"]
           for label, r in rows.items() if label.startswith("score ")]
    assert out, "relative_cpu_8192.json has no score rows"
    return (md_table(["score term", "time vs q·k^T", "peak GiB"], out) + "\n\n"
            + caption("relative_cpu_8192", page, data, f"T = {res['length']}; plain q·k^T {base['peak_mib'] / 1024:.2f} GiB"))


def model(page: str, load) -> str:
    """Whole-model training step and decoding, every encoding as a ratio to NoPE (the paired
    ratios of ``posenc.speed.model``)."""
    from posenc.speed.model import goal_label, row_ratios, within_goal

    data = load("model_cpu")
    train, decode, mem = data["train"], data["decode"], data["memory"]
    assert train, "model results have no rows"
    (T,) = train["none"]  # one training length in the quoted command
    contexts = list(decode["none"])
    rows = []
    for name in train:
        if name == "none":
            continue
        train_ratio, decode_ratio = row_ratios(data, name)
        r = [train_ratio[T]] + [decode_ratio[c] for c in contexts]
        (Tm, m), = mem[name].items()
        m_ratio = m / mem["none"][Tm]
        time_goal, mem_goal = goal_label(data, name, fmt=ratio)
        goal_text = time_goal + (f", memory {mem_goal}" if mem_goal is not None else "")
        rows.append([name, goal_text, *map(ratio, r), ratio(m_ratio), "yes" if within_goal(data, name) else "no"])
    header = ["encoding", "goal", f"train step T={T}", *(f"decode at {c}" for c in contexts),
              "peak memory (train)", "within goal"]
    base = (f"ratios to NoPE: {train['none'][T]:.2f} s per training step, "
            + ", ".join(f"{decode['none'][c]:.1f} tokens/s decoding at {c}" for c in contexts))
    return md_table(header, rows) + "\n\n" + caption("model_cpu", page, data, base)


def real_decoding(page: str, load) -> str:
    """SmolLM2 greedy decoding steps, posenc's RoPE patched in against transformers'."""
    data = load("real_speed_cpu")
    dec, rot = data["decoding"], data["rotary_step"]
    threads = list(dec["threads"])
    assert threads, "real_speed_cpu.json has no decoding rows"

    def cell(t: str, kind: str) -> str:
        r = dec["threads"][t][kind]
        lo, hi = r["ratio_quartiles"]
        return f"{r['unpatched_ms']:.1f} / {r['patched_ms']:.1f} ms: {ratio(r['median_ratio'])} ({lo:.3f}-{hi:.3f})"

    rows = [
        ["one decoding step, wall time: unpatched / patched (median): ratio (quartiles of the paired ratios)"]
        + [cell(t, "wall") for t in threads],
        ["the same steps in the process's CPU time"] + [cell(t, "cpu") for t in threads],
        ["the rotary call a decoding step makes (median, µs): transformers / posenc"]
        + [f"{rot[t]['unpatched_us']} / {rot[t]['patched_us']}" for t in threads],
    ]
    same = "the same tokens" if dec["same_tokens_patched_and_unpatched"] else "DIFFERENT tokens"
    pairs = dec["threads"][threads[0]]["wall"]["pairs"]
    extra = (f"the machine was shared with other jobs; model {data['model']}, loaded from the cache in "
             f"{duration(dec['load_seconds_from_cache'])}; {dec['prompt_tokens']}-token prompt, {pairs} paired "
             f"steps per thread count ({dec['rounds']} rounds of {dec['new_tokens']}); patched and unpatched "
             f"decode {same}; {duration(data['seconds'])} for the whole command")
    head = ["", *(f"{t} thread{'s' if t != '1' else ''}" for t in threads)]
    return md_table(head, rows) + "\n\n" + caption("real_speed_cpu", page, data, extra)


def real_memory(page: str, load) -> str:
    """Peak RSS of one perplexity forward per length, beside bench --model's estimate."""
    data = load("real_speed_cpu")
    mem = data["memory"]
    assert mem, "real_speed_cpu.json has no memory rows"
    rows = [[str(m["tokens"]), gib(m["peak_rss_after"]), "+" + gib(m["growth"]), gib(m["estimate_peak"]),
             f"{m['seconds']:.1f}"] for m in mem]
    extra = (f"the machine was shared with other jobs; float32, one window, each length in a fresh process; RSS after "
             f"loading {gib(mem[0]['peak_rss_before'])}, of which the weights {gib(mem[0]['weights'])}")
    return (md_table(["tokens", "peak RSS", "over the loaded model", "bench --model's estimate", "seconds"], rows)
            + "\n\n" + caption("real_speed_cpu", page, data, extra))


def cope(page: str, load) -> str:
    """CoPE's attention forward + backward by length: the fused path's block counting against
    the dense term it replaced, each as a multiple of causal SDPA, with peak memory."""
    data = load("cope_cpu")
    assert data["rows"], "cope_cpu.json has no rows"
    rows = []
    for r in data["rows"]:
        nope, blk, dense = r["nope"], r["blockwise"], r["dense"]
        dense_cells = ([f"{dense['ms']:.0f} ms, {ratio(dense['ms'] / nope['ms'])}", f"{dense['peak_mib']:.0f}"]
                       if "ms" in dense else [f"not run: needs about {dense['gib']:.0f} GiB", ""])
        rows.append([r["gates"], str(r["length"]), f"{nope['ms']:.0f}", f"{nope['peak_mib']:.0f}",
                     f"{blk['ms']:.0f} ms, {ratio(blk['ms'] / nope['ms'])}", f"{blk['peak_mib']:.0f}", *dense_cells])
    s = data["settings"]
    setup = (f"one causal attention call, B={s['batch']}, H={s['heads']}, D={s['head_dim']}, max_pos {s['max_pos']}, "
             f"{s['dtype']}, forward + backward, median of {s['rounds']} rounds taken in turn; load average "
             f"{data['load_before'][0]:.2f} before, {data['load_after'][0]:.2f} after")
    header = ["gates", "T", "causal SDPA ms", "SDPA peak MiB", "CoPE, counted by block", "peak MiB",
              "CoPE, dense term (before)", "peak MiB"]
    return md_table(header, rows) + "\n\n" + caption("cope_cpu", page, data, setup)
