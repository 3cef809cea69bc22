"""Tables of checkpoints: the tiny Llama trained on CPU, the probe's verdicts on SmolLM2 and Gemma 3,
SmolLM2 past a stated trained length on two corpora (and YaRN's ordering tested on it),
``posenc extend``'s choice, HF parity, and the ``posenc check`` table.

Row names come from the library: a scaling's label from its registry entry
(``posenc.rotary.SCALINGS``), a checkpoint run's rows as ``posenc bench --model`` names them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

from .captions import caption, captions, duration, link, md_table


def check(page: str, load) -> str:
    """The ``posenc check`` table, as the command prints it."""
    from posenc.analysis.checks import CheckResult, format_table

    data = load("check_cpu")
    results = {n: {k: CheckResult(**r) for k, r in rs.items()} for n, rs in data["results"].items()}
    assert results, "check_cpu.json has no encodings"
    extra = f"{duration(data['wall_s'])} wall" if "wall_s" in data else ""
    return "```\n" + format_table(results) + "\n```\n\n" + caption("check_cpu", page, data, extra)


def hf_parity(page: str, load) -> str:
    """Parity with transformers per family, by the script's own table function."""
    path = Path(__file__).resolve().parents[1] / "hf_parity.py"
    spec = importlib.util.spec_from_file_location("_hf_parity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    data = load("hf_parity")
    assert data["rows"], "hf_parity.json has no rows"
    return mod.table(data["rows"]) + "\n\n" + caption("hf_parity", page, data)


def probe_tiny_llama(page: str, load) -> str:
    """The tiny Llama's training and its probe curves at d = 0, L, 8L."""
    data = load("probe_tiny_llama")
    tr, L = data["training"], data["trained_length"]
    s = tr["settings"]
    curves = data["layers"]["0"]["curves"]
    assert curves, "probe_tiny_llama.json has no curves"
    d = data["distances"]
    at = {"d = 0": 0, f"d = L = {L}": min(range(len(d)), key=lambda i: abs(d[i] - L)), f"d = {d[-1]}": len(d) - 1}
    rows = [[name] + [f"{c['full'][i]:.3f}" for i in at.values()] for name, c in curves.items()]  # the heads' mean
    head = (f"{tr['parameters']:,}-parameter byte-level Llama ({s['layers']} layers, width {s['width']}, {s['heads']} heads, "
            f"RoPE base {s['rope_theta']:g}, L = {L}), {s['steps']} steps of batch {s['batch']} on the Python standard "
            f"library in {duration(tr['train_seconds'])}: final training loss {tr['final_train_loss']:.3f} nats/byte "
            f"(mean of the last {tr['final_train_loss_steps']} steps), validation byte perplexity at L "
            f"{tr['val_at_L']['ppl']:.2f} ({tr['val_at_L']['tokens']:,} bytes).")
    table = md_table(["layer 0, mean of all heads: logit at"] + list(at), rows)
    return head + "\n\n" + table + "\n\n" + caption("probe_tiny_llama", page, data)


def bench_model_tiny_llama(page: str, load) -> str:
    """The tiny Llama's byte perplexity at 1x..8x L, plain and per scaling, as bench prints it."""
    from posenc.bench.report import format_table

    data = load("bench_model_tiny_llama")
    return "```\n" + format_table(data) + "\n```\n\n" + caption("bench_model_tiny_llama", page, data)


def probe_real(page: str, load) -> str:
    """The probe's three verdicts per probed layer of SmolLM2 and Gemma 3."""
    rows, sources = [], []
    for name in ("probe_smollm2", "probe_gemma3"):
        data = load(name)
        assert data["layers"], f"{name}.json has no layers"
        for idx, layer in data["layers"].items():
            v, rope = layer["verdicts"], layer["rope"]
            hold = lambda k: "holds" if v[k]["holds"] else "does not hold"  # noqa: E731
            kind = f", {layer['layer_type'].replace('_attention', '')}" if layer.get("layer_type") else ""
            rows.append([f"{'-'.join(data['model'].split('-')[:2])} layer {idx}{kind}",
                         f"{rope['base']:.0f}", str(layer["trained_distance"]),
                         f"{hold('rise')} (rise / fall {v['rise']['rise_over_fall']:.2f})",
                         f"{hold('raised_base')} (rise {v['raised_base']['rise_over_model_fall']:.2f} F)",
                         f"{hold('low_half')} (low share {v['low_half']['low_share']:.2f})"])
        s = data["settings"]
        sources.append((name, data, f"{s['tokens']} tokens of q and k, curves to {s['extend']:g} Ld, {s['dtype']}"))
    head = ["layer", "RoPE base", "trained distance Ld", "(a) rises again past Ld",
            "(b) base × 16 brings the decay back", "(c) low-frequency half keeps the decay"]
    return md_table(head, rows) + "\n\n" + captions(page, sources)


# SmolLM2 past a stated L: each table's task and results files, the main run's first
SMOLLM2_FILES = {
    "lm code": ("bench_model_smollm2_code", "bench_model_smollm2_code_4L"),
    "lm prose": ("bench_model_smollm2_prose", "bench_model_smollm2_prose_4L"),
    "passkey": ("bench_model_smollm2_code", "bench_model_smollm2_passkey_1.5L"),
}


def _smollm2_cells(table: str, load) -> tuple[dict[str, dict[int, list[float]]], list[tuple[str, dict]]]:
    """{row name: {length: values}} of one SmolLM2 table over its results files (the model's row
    first, then each scaling), and the (name, data) of each file read."""
    from posenc.hf.scalings import variant_label

    task = table.split()[0]
    rows: dict[str, dict[int, list[float]]] = {}
    files = []
    for name in SMOLLM2_FILES[table]:
        data = load(name)
        files.append((name, data))
        s = data["settings"]
        for run in data["runs"]:
            if run["task"] == task:
                for p in run["points"]:
                    row = s["label"] if p["variant"] == "base" else "+ " + variant_label(s, p["variant"])
                    rows.setdefault(row, {}).setdefault(p["length"], []).append(p["value"])
    assert rows, f"{table}: no points in {', '.join(SMOLLM2_FILES[table])}"
    return rows, files


def _smollm2_setup(data: dict) -> str:
    s = data["settings"]
    L = s["trained_length"]
    parts = [f"L stated as {L} (SmolLM2 was trained at 8192: the procedure at small n, not a length-extension test)"]
    tasks = {r["task"] for r in data["runs"]}
    if "lm" in tasks:
        lengths = sorted({round(f * L) for f in s["lm_eval_factors"]})
        parts.append("lm: windows of the validation text read on their own, "
                     + ", ".join(f"{max(1, s['lm_eval_tokens'] // n)} x {n}" for n in lengths) + " tokens")
    if "passkey" in tasks:
        parts.append(f"passkey: {s['passkey_examples']} example per depth, depths "
                     f"{', '.join(f'{d:g}' for d in s['passkey_depths'])}")
    if data.get("wall_s"):
        parts.append(f"{duration(data['wall_s'])} wall for the command")
    return "; ".join(parts)


def _smollm2_table(table: str, title: str, page: str, load, cell: Callable[[list[float]], str]) -> str:
    rows, files = _smollm2_cells(table, load)
    L = files[0][1]["settings"]["trained_length"]
    lengths = sorted({n for r in rows.values() for n in r})
    body = [[row] + [cell(r[n]) if n in r else "" for n in lengths] for row, r in rows.items()]
    return (md_table([title] + [f"{n} ({n / L:g} L)" for n in lengths], body) + "\n\n"
            + captions(page, [(name, data, _smollm2_setup(data)) for name, data in files]))


def smollm2(page: str, load) -> str:
    """SmolLM2's token perplexity per length on both corpora, passkey per length and depth."""
    ppl = lambda v: f"{v[0]:.2f}"  # noqa: E731
    depths = "/".join(f"{d:g}" for d in load("bench_model_smollm2_code")["settings"]["passkey_depths"])
    return "\n\n".join([
        _smollm2_table("lm code", "token perplexity, Python sources", page, load, ppl),
        _smollm2_table("lm prose", "token perplexity, King James Bible", page, load, ppl),
        _smollm2_table("passkey", f"passkey % (right at depth {depths})", page, load,
                       lambda v: f"{100 * sum(v) / len(v):.0f} ({'/'.join(f'{x:.0f}' for x in v)})"),
    ])


def smollm2_headline(page: str, load) -> str:
    """SmolLM2 at 2L (L stated as 1024): token perplexity on both corpora and passkey, per row."""
    code, files = _smollm2_cells("lm code", load)
    prose, prose_files = _smollm2_cells("lm prose", load)
    passkey, _ = _smollm2_cells("passkey", load)
    L = files[0][1]["settings"]["trained_length"]
    n = 2 * L
    fmt = lambda r: f"{r[n][0]:.2f}" if n in r else ""  # noqa: E731
    body = [[row, fmt(code[row]), fmt(prose.get(row, {})),
             f"{100 * sum(passkey[row][n]) / len(passkey[row][n]):.0f}" if n in passkey.get(row, {}) else ""]
            for row in code]
    full = f"[docs/real_models.md]({link(page, 'docs/real_models.md')}#length-extension-measured-on-smollm2-two-corpora)"
    under = captions(page, [(name, data, "") for name, data in (files[0], prose_files[0])], notes=False, details=full)
    return (md_table([f"at {n} tokens (2L, L stated as {L})", "token ppl, Python sources", "token ppl, King James Bible",
                      "passkey %"], body) + "\n\n" + under)


# Peng et al. 2023 (YaRN, arXiv 2309.00071), its statements about scalings without fine-tuning,
# each as (section, the claim, the variants compared as (better, worse...)). "base" is the model as
# it is; Llama 3's rule is the paper's NTK-by-parts ramp over wavelengths without the temperature.
YARN_CLAIMS = (
    ("abstract, introduction", "past L the model without a scaling fails; a training-free scaling keeps it working",
     ("ntk", "dynamic", "yarn", "llama3"), ("base",)),
    ("\"NTK-aware\" interpolation", "NTK-aware extends a model without fine-tuning much better than PI", ("ntk",), ("linear",)),
    ("\"NTK-by-parts\" interpolation", "NTK-by-parts (here Llama 3's ramp, no temperature) beats NTK-aware and PI", ("llama3",), ("ntk", "linear")),
    ("YaRN", "YaRN (by-parts and the temperature 0.1 ln s + 1) beats every earlier method", ("yarn",),
     ("linear", "ntk", "dynamic", "llama3")),
    ("dynamic scaling", "a factor from the current length (dynamic) degrades gracefully where a fixed factor breaks",
     ("dynamic",), ("ntk",)),
)


def smollm2_yarn(page: str, load) -> str:
    """YaRN's training-free ordering, claim by claim, against SmolLM2 at 2L (and 4L where committed)."""
    from posenc.rotary import SCALINGS

    columns = {}  # (corpus, length) -> {variant: ppl}
    for table, corpus in (("lm code", "Python sources"), ("lm prose", "King James Bible")):
        rows, files = _smollm2_cells(table, load)
        s = files[0][1]["settings"]
        L = s["trained_length"]
        for n in (2 * L, 4 * L):
            vals = {v: rows[s["label"] if v == "base" else "+ " + SCALINGS[v].label].get(n)
                    for v in ("base", *s["scalings"])}
            if all(x is not None for x in vals.values()):
                columns[corpus, n] = {v: x[0] for v, x in vals.items()}
    label = lambda v: "the model as it is" if v == "base" else SCALINGS[v].label  # noqa: E731
    body = []
    for where, claim, better, worse in YARN_CLAIMS:
        cells, verdicts = [], []
        for vals in columns.values():
            b, w = {v: vals[v] for v in better}, {v: vals[v] for v in worse}
            cells.append(", ".join(f"{label(v)} {x:.2f}" for v, x in (b | w).items()))
            if worse == ("ntk",) and better == ("dynamic",):
                same = abs(b["dynamic"] - w["ntk"]) <= 1e-3 * w["ntk"]
                verdicts.append("not tested: equal within 0.1 % in one-window reads" if same else "they differ")
            else:
                verdicts.append("holds" if max(b.values()) < min(w.values()) else "does not hold")
        names = [f"{corpus} {n // L}L" for corpus, n in columns]
        verdict = verdicts[0] if len(set(verdicts)) == 1 else "; ".join(f"{nm}: {v}" for nm, v in zip(names, verdicts))
        body.append([where, claim, *cells, verdict])
    return md_table(["Peng et al. 2023", "claim (no fine-tuning)",
                     *(f"token ppl at {n // L}L, {corpus}" for corpus, n in columns),
                     f"on SmolLM2 (L stated as {L})"], body)


def real_extend(page: str, load) -> str:
    """posenc extend's candidates (perplexity and passkey at N) and the winner."""
    data = load("real_extend_smollm2_L256_N512")
    cands = data["candidates"]
    assert cands, "real_extend_smollm2_L256_N512.json has no candidates"
    s = data["settings"]
    rows = [[c["label"], f"{c['ppl']:.3f}", f"{100 * c['passkey']:.0f}", f"{c['seconds']:.1f}",
             "chosen" if c["label"] == data["winner"] else ""] for c in cands]
    total = sum(c["seconds"] for c in cands)
    extra = (f"model {data['model']} with L stated as {s['trained_length']} (trained at 8192: the procedure, not an "
             f"extension), N = {s['to']}, factors {s['factors']}, {s['windows']} window, {s['passkey_examples']} passkey "
             f"example per depth {data['depths']}; {duration(total)} of evaluation in all; the rule: {data['rule']}")
    return (md_table(["candidate", f"token ppl at {s['to']}", "passkey %", "seconds", ""], rows)
            + "\n\n" + caption("real_extend_smollm2_L256_N512", page, data, extra))


def estimate_check(page: str, load) -> str:
    """``bench --model``'s estimate, printed before the first forward, against the wall time of
    the same command on a machine with one process per core."""
    data = load("bench_model_smollm2_estimate_cpu")
    est, wall = data["estimate_s"], data["wall_s"]
    row = [str(data["forwards"]), str(data["longest"]), duration(est), duration(wall), f"{est / wall:.2f}",
           f"{data['load_before']:.2f} / {data['load_after']:.2f}"]
    head = ["forwards", "longest (tokens)", "printed estimate", "wall time", "estimate / wall",
            "load average before / after"]
    return md_table(head, [row]) + "\n\n" + caption("bench_model_smollm2_estimate_cpu", page, data)
