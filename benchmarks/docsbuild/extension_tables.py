"""Tables of the real extension measurement: SmolLM2-135M past its own trained length L = 8192,
each training-free RoPE scaling and attention method, token perplexity over the whole window and
over the tokens past L with 95 % intervals; and what a method's forward costs by length.

Row names come from the library (``posenc.hf.scalings.variant_label``: a scaling's registry
label, a method's class label), parameters from the rules the rows ran with.
"""

from __future__ import annotations

from .captions import caption, captions, md_table, ratio

#: the measurement's results files, one per corpus (``bench --model ... --corpus C``)
EXTENSION_FILES = {"code": "bench_model_smollm2_L8192_code", "prose": "bench_model_smollm2_L8192_prose"}
CORPUS_WORDS = {"code": "Python sources", "prose": "King James Bible"}


def _label(settings: dict, variant: str, n: int) -> str:
    """A row's name with the parameters it ran with at length ``n``."""
    from posenc.hf.scalings import MODEL_METHODS, RAISED_BASE, method_params_at, variant_label

    if variant == "base":
        return "the model as it is"
    label = variant_label(settings, variant)
    if variant in MODEL_METHODS:
        L = settings["trained_length"]
        label += " (" + ", ".join(f"{k} {v:g}" for k, v in method_params_at(variant, n / L, L).items()) + ")"
    return label if variant == RAISED_BASE else "+ " + label


def _cell(p: dict | None, key: str = "") -> str:
    """``12.34 [12.10, 12.61]`` from a point's value (or its ``beyond`` part) and interval."""
    if p is None:
        return ""
    v, lo, hi = (p["value"], p.get("low"), p.get("high")) if not key else (p.get(key), p.get(key + "_low"),
                                                                         p.get(key + "_high"))
    if v is None or v != v:
        return "nan"
    return f"{v:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None and lo == lo else "")


def _points(data: dict) -> dict[tuple[str, int], dict]:
    """{(variant, length): point} of the lm run of a results file."""
    runs = [r for r in data["runs"] if r["task"] == "lm"]
    assert runs, "no lm run in the results file"
    return {(p["variant"], p["length"]): p for p in runs[0]["points"]}


def smollm2_extension(page: str, load) -> str:
    """Per corpus: every row at 1.5L and 2L, the whole window and the tokens past L apart."""
    return "\n\n".join(_extension_table(page, load, corpus, name) for corpus, name in EXTENSION_FILES.items())


#: 4L (32768 tokens) on the code corpus, one window (on a GPU, two method rows finished on the CPU)
EXTENSION_4L = ("code", "bench_model_smollm2_L8192_code_4L")


def smollm2_extension_4L(page: str, load) -> str:
    """Every row at 4L on one corpus, the whole window and the tokens past L apart."""
    return _extension_table(page, load, *EXTENSION_4L)


def _extension_table(page: str, load, corpus: str, name: str) -> str:
    """One results file's rows past L: the whole window and the tokens past L, per length."""
    data = load(name)
    s = data["settings"]
    L = s["trained_length"]
    pts = _points(data)
    lengths = sorted({n for _, n in pts if n > L})
    variants = list(dict.fromkeys(v for v, _ in pts))
    assert lengths and variants, f"{name}.json has no point past L"
    base_L = pts.get(("base", L))
    head = [f"{CORPUS_WORDS[corpus]}: token perplexity, 95 % interval"]
    for n in lengths:
        head += [f"{n} ({n / L:g}L), whole window", f"{n}: the tokens past L"]
    rows = []
    for v in variants:
        row = [_label(s, v, lengths[-1])]
        for n in lengths:
            p = pts.get((v, n))
            row += [_cell(p), _cell(p, "beyond")]
        rows.append(row)
    at_L = f"at L = {L} the model reads {_cell(base_L)}" if base_L else ""
    return md_table(head, rows) + "\n\n" + caption(name, page, data, at_L)


def method_cost(page: str, load) -> str:
    """One forward's time and peak memory by length: the model, each method, the model again."""
    from posenc.methods import METHODS

    data = load("method_cost_cpu")
    rows_in = data["rows"]
    assert rows_in, "method_cost_cpu.json has no rows"
    lengths = sorted({r["length"] for r in rows_in})
    rows = []
    for n in lengths:
        at = [r for r in rows_in if r["length"] == n]
        plain = [r for r in at if r["method"] == "none"]
        ref = sum(r["seconds"] for r in plain) / len(plain)
        mem = sum(r["growth_mib"] for r in plain) / len(plain)
        for r in at:
            name = "the model as it is" + (" (again)" if r.get("second") else "")
            if r["method"] != "none":
                name = METHODS[r["method"]].label + " (" + ", ".join(f"{k} {v:g}" for k, v in r["params"].items()) + ")"
            rows.append([str(n), name, f"{r['seconds']:.1f}", ratio(r["seconds"] / ref), f"{r['growth_mib']:.0f}",
                         ratio(r["growth_mib"] / mem) if mem else ""])
    extra = (f"load average {data['load_before'][0]:.2f} before and {data['load_after'][0]:.2f} after"
             if "load_after" in data else "")
    return (md_table(["tokens", "row", "seconds per forward", "vs the model", "memory growth, MiB", "vs the model"],
                     rows) + "\n\n" + caption("method_cost_cpu", page, data, extra))


def extension_headline(page: str, load) -> str:
    """README: every row at 2L on both corpora, the tokens past L."""
    cols, files = {}, []
    for corpus, name in EXTENSION_FILES.items():
        data = load(name)
        files.append((name, data, ""))
        pts = _points(data)
        n = max(n for _, n in pts)
        cols[corpus] = (data["settings"], n, pts)
    s, n, _ = cols["code"]
    L = s["trained_length"]
    variants = list(dict.fromkeys(v for v, _ in cols["code"][2]))
    rows = [[_label(s, v, n)] + [_cell(pts.get((v, n)), "beyond") for _, n, pts in cols.values()] for v in variants]
    head = [f"SmolLM2-135M at {n} tokens (2L, L = {L}, its own)"] + [
        f"ppl of the tokens past L, {CORPUS_WORDS[c]}" for c in cols]
    return md_table(head, rows) + "\n\n" + captions(page, files, notes=False)


# The papers' statements about training-free extension, each as (source, the claim, the rows
# claimed better, the rows claimed worse); "base" is the model as it is. Checked on the
# perplexity of the tokens past L at 2L, on both corpora.
EXTENSION_CLAIMS = (
    ("Peng et al. 2023 (YaRN), introduction", "past L the model without a scaling fails; a training-free scaling "
     "keeps it working", ("ntk", "dynamic", "yarn", "llama3"), ("base",)),
    ("Peng et al. 2023, \"NTK-aware\"", "NTK-aware extends a model without fine-tuning much better than PI",
     ("ntk",), ("linear",)),
    ("Peng et al. 2023, \"NTK-by-parts\"", "NTK-by-parts (Llama 3's ramp) beats NTK-aware and PI", ("llama3",),
     ("ntk", "linear")),
    ("Peng et al. 2023, YaRN", "YaRN beats every earlier scaling", ("yarn",), ("linear", "ntk", "dynamic", "llama3")),
    ("Jin et al. 2024 (Self-Extend), section 4.1", "Self-Extend keeps perplexity low past L where the model as it "
     "is fails, without fine-tuning", ("self_extend",), ("base",)),
    ("Jin et al. 2024, tables 1-2", "Self-Extend does better than the training-free scalings", ("self_extend",),
     ("linear", "ntk", "dynamic", "yarn")),
    ("An et al. 2024 (Dual Chunk Attention), table 1", "DCA keeps perplexity low past L, better than PI and "
     "NTK-aware without training", ("dual_chunk",), ("base", "linear", "ntk")),
    ("Su 2023 (ReRoPE)", "ReRoPE extrapolates past L with no loss, better than NTK-aware", ("rerope",),
     ("base", "ntk")),
)


def extension_claims(page: str, load) -> str:
    """Each paper's claim against SmolLM2 at 2L: the rows' perplexity past L, and whether every
    row claimed better is below every row claimed worse (and whether their intervals separate)."""
    from posenc.hf.scalings import variant_label

    columns = {}
    for corpus, name in EXTENSION_FILES.items():
        data = load(name)
        pts = _points(data)
        n = max(n for _, n in pts)
        columns[corpus] = (data["settings"], n, pts)
    body = []
    for where, claim, better, worse in EXTENSION_CLAIMS:
        cells, verdicts = [], []
        for corpus, (s, n, pts) in columns.items():
            got = {v: pts.get((v, n)) for v in (*better, *worse)}
            missing = [v for v, p in got.items() if p is None or p.get("beyond") is None]
            if missing:
                cells.append("")
                verdicts.append(f"not measured ({', '.join(missing)})")
                continue
            name = lambda v: "the model as it is" if v == "base" else variant_label(s, v)  # noqa: E731
            cells.append(", ".join(f"{name(v)} {p['beyond']:.2f}" for v, p in got.items()))
            b_hi = max(got[v]["beyond"] for v in better)
            w_lo = min(got[v]["beyond"] for v in worse)
            apart = max(got[v]["beyond_high"] for v in better) < min(got[v]["beyond_low"] for v in worse)
            verdicts.append(("holds" + (", intervals apart" if apart else ", within the intervals")) if b_hi < w_lo
                            else "does not hold")
        verdict = verdicts[0] if len(set(verdicts)) == 1 else "; ".join(
            f"{CORPUS_WORDS[c]}: {v}" for c, v in zip(columns, verdicts))
        body.append([where, claim, *cells, verdict])
    s, n, _ = columns["code"]
    return md_table(["source", "claim (no fine-tuning)",
                     *(f"ppl past L at {columns[c][1]} tokens, {CORPUS_WORDS[c]}" for c in columns),
                     f"on SmolLM2 (L = {s['trained_length']}, its own)"], body)


#: the needle tasks past L, measured in shards of disjoint prompts (one ``--eval-seed`` each)
TASK_SHARDS = ("bench_model_smollm2_L8192_tasks_s0", "bench_model_smollm2_L8192_tasks_s1")
#: the same tasks at L and 1.5L, and passkey at 4L (on a GPU; pooled the same way)
TASK_SHARDS_15L = ("bench_model_smollm2_L8192_tasks_1.5L_s0", "bench_model_smollm2_L8192_tasks_1.5L_s1")
PASSKEY_SHARDS_4L = ("bench_model_smollm2_L8192_passkey_4L_s0",)
TASK_WORDS = {"passkey": "passkey", "multikey": "multi-key needle (RULER)", "vartrack": "variable tracking (RULER)"}


def _tasks_table(page: str, load, shards: tuple[str, ...]) -> str:
    """Needle tasks from ``shards`` (one eval seed each): each row's matches out of its prompts
    (the shards pooled, every depth together) with the 95 % Wilson interval of the pool, per
    length (within L only the model as it is runs) and task."""
    from posenc.hf.bench_merge import merge_shards
    from posenc.intervals import wilson

    files = [(name, load(name), "") for name in shards]
    if len(files) > 1:
        settings, runs = merge_shards([data for _, data, _ in files])
    else:  # one shard: its own prompts
        settings, runs = dict(files[0][1]["settings"]), files[0][1]["runs"]
        settings["shards"] = [{"eval_seed": settings["eval_seed"]}]
    L = settings["trained_length"]
    lengths = sorted({p["length"] for r in runs for p in r["points"]})
    variants = list(dict.fromkeys(p["variant"] for r in runs for p in r["points"]))
    head = ["row"] + [f"{TASK_WORDS.get(r['task'], r['task'])} at {n} ({n / L:g}L)" for n in lengths for r in runs]
    rows = []
    for v in variants:
        row = [_label(settings, v, lengths[-1])]
        for n in lengths:
            for r in runs:
                pts = [p for p in r["points"] if p["variant"] == v and p["length"] == n]
                if not pts:  # a scaling or method is not run within L
                    row.append("")
                    continue
                trials = sum(p["count"] for p in pts)
                hits = sum(round(p["value"] * p["count"]) for p in pts)
                lo, hi = wilson(hits, trials)
                row.append(f"{hits}/{trials} [{100 * lo:.0f}, {100 * hi:.0f}] %")
        rows.append(row)
    depths = ", ".join(f"{d:g}" for d in settings["passkey_depths"])
    seeds = ", ".join(str(s["eval_seed"]) for s in settings["shards"])
    n = settings["passkey_examples"]
    extra = (f"{n} prompt{'s' if n != 1 else ''} per depth ({depths}), "
             + (f"{len(files)} shards of disjoint prompts (eval seeds {seeds})" if len(files) > 1 else f"eval seed {seeds}"))
    return md_table(head, rows) + "\n\n" + captions(page, [(*files[0][:2], extra), *files[1:]], notes=True)


def smollm2_tasks(page: str, load) -> str:
    """The needle tasks at 2L (the CPU run)."""
    return _tasks_table(page, load, TASK_SHARDS)


def smollm2_tasks_15L(page: str, load) -> str:
    """The needle tasks within L and at 1.5L (the GPU run)."""
    return _tasks_table(page, load, TASK_SHARDS_15L)


def smollm2_passkey_4L(page: str, load) -> str:
    """Passkey at 4L (the GPU run, its method rows finished on the CPU)."""
    return _tasks_table(page, load, PASSKEY_SHARDS_4L)


def engine_llamacpp(page: str, load) -> str:
    """llama.cpp against transformers + posenc on SmolLM2 past L: per length and scaling, the
    per-token NLL difference and each side's perplexity of the tokens past L."""
    from posenc.hf.scalings import variant_label

    data = load("engine_llamacpp_cpu")
    rows_in = data["rows"]
    assert rows_in, "engine_llamacpp_cpu.json has no rows"
    L = data["trained_length"]
    rows = []
    order = ("none", "linear", "ntk", "yarn")  # the script's --scalings order, whatever order the rows were made in
    for r in sorted(rows_in, key=lambda r: (r["length"], order.index(r["scaling"]) if r["scaling"] in order else 9)):
        name = "the model as it is" if r["scaling"] == "none" else variant_label({}, r["scaling"])
        control = r.get("unscaled_llamacpp_mean_abs")
        rows.append([f"{r['length']} ({r['length'] / L:g}L)", name, f"{r['mean_abs']:.1e}", f"{r['max_abs']:.1e}",
                     f"{r['ppl_past_llamacpp']:.3f}", f"{r['ppl_past_posenc']:.3f}",
                     f"{control:.2f}" if control is not None else "",
                     "yes" if r["matches"] else "no"])
    extra = (f"llama-cpp-python {data['llama_cpp_python']} built from source, the GGUF {data['gguf']}, the KV cache "
             f"in {data['kv_cache']}; a row matches when the mean |NLL difference| is under {data['match_mean']:g} "
             "nats per token")
    head = ["tokens", "scaling (llama.cpp flags / posenc)", "mean |dNLL|, nats", "max |dNLL|",
            "ppl past L, llama.cpp", "ppl past L, posenc", "the unscaled llama.cpp against it, mean |dNLL|", "matches"]
    return md_table(head, rows) + "\n\n" + caption("engine_llamacpp_cpu", page, data, extra)
