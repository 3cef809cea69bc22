"""Tables of ``posenc bench`` runs: the quick and standard presets, determinism and the demo's
timing (the published claims tested on the standard run: :mod:`.bench_claims`).

Each renderer takes the page it renders into and ``load`` (results name -> data). Labels come
from the library: a RoPE scaling's from its registry entry (``posenc.bench.report``), the
synthetic tasks from the bench task registry.
"""

from __future__ import annotations

import math

from .captions import brief, caption, duration, link, md_table, ratio


def bench_setup(data: dict) -> str:
    """Seeds, model, steps, each task's L, the runs and their training time (a bench caption)."""
    from posenc.bench.tasks import get_task

    s = data["settings"]
    lengths = {r["task"]: r["train_length"] for r in data["runs"]}
    ls = ", ".join(f"{t} {L} {get_task(t).unit}" for t, L in lengths.items())
    train = sum(r["train_seconds"] for r in data["runs"])
    text = (f"{s['seeds']} seed{'s' if s['seeds'] > 1 else ''}; d_model {s['d_model']}, {s['n_layer']} layers, "
            f"{s['steps']} steps; training length L: {ls}; {len(data['runs'])} runs, "
            f"{duration(train)} of training in all")
    if "wall_s" in data:
        text += f", {duration(data['wall_s'])} wall for the whole command"
    return text


def quick(page: str, load) -> str:
    """The quick benchmark, one row per encoding (and RoPE scaling), ≤L | >L per task: a headline
    table, its caption in full under the printed table of docs/bench.md."""
    from posenc.bench.report import cell_text, significance_lines, variant_label
    from posenc.bench.summary import ranking

    data = load("bench_quick")
    summary = data["summary"]
    assert summary, "bench_quick.json has no summary rows"
    tasks = list(dict.fromkeys(r["task"] for r in summary))
    metric = {r["task"]: r["metric"] for r in summary}
    longest = max(data["settings"]["lm_eval_factors"])
    header = ["encoding"]
    for t in tasks:
        header.append(f"{t} ppl at L | {longest}L" if metric[t] == "ppl" else f"{t} acc % ≤L | >L")
        if metric[t] == "ppl":
            header.append(f"{t} ppl {longest}L / L")
    rank = data.get("ranking") or ranking(summary)  # files from before the intervals: computed here
    ci = {i["encoding"]: i for i in rank["intervals"]}
    header.append(f"MRR [{round(100 * rank['method']['confidence'])} % CI]")
    idx = {(r["task"], r["encoding"], r["variant"]): r for r in summary}
    rows = []
    for enc, var in dict.fromkeys((r["encoding"], r["variant"]) for r in summary):
        row = ["none (NoPE)" if (enc, var) == ("none", "base") else variant_label(enc, var)]
        for t in tasks:
            r = idx.get((t, enc, var))
            if r is None:
                row += [""] * (2 if metric[t] == "ppl" else 1)
                continue
            base = None if var == "base" else enc  # a scaling within L is the unscaled model: "as rope"
            row.append(f"{cell_text(r, 'in', base)} | {cell_text(r, 'beyond', base)}")
            if metric[t] == "ppl":  # a scaling is applied beyond L only: its L is the base model's
                at_L = r["in_mean"] if not math.isnan(r["in_mean"]) else idx[(t, enc, "base")]["in_mean"]
                ppl_ratio = r["beyond_mean"] / at_L
                row.append("n/a" if math.isnan(ppl_ratio) else ratio(ppl_ratio))
        mrr = data["mrr"].get(enc) if var == "base" else None
        row.append("" if mrr is None else f"{mrr:.2f}" + (f" [{ci[enc]['low']:.2f}, {ci[enc]['high']:.2f}]" if enc in ci else ""))
        rows.append(row)
    notes = "\n".join(f"- {line}" for line in significance_lines(dict(data, ranking=rank)))
    full = f"[docs/bench.md]({link(page, 'docs/bench.md')}#a-quick-preset-run)"
    return md_table(header, rows) + "\n\n" + (notes + "\n\n" if notes else "") + brief("bench_quick", page, data, full)


def quick_text(page: str, load) -> str:
    """The quick benchmark exactly as ``posenc bench`` prints it."""
    from posenc.bench.report import format_table

    data = load("bench_quick")
    return "```\n" + format_table(data) + "\n```\n\n" + caption("bench_quick", page, data, bench_setup(data))


def standard(page: str, load) -> str:
    """The standard benchmark: every encoding, every task, 3 seeds."""
    from posenc.bench.report import settings_text, table_cells
    from posenc.bench.summary import ranking

    data = load("bench_standard")
    assert data["summary"], "bench_standard.json has no summary rows"
    head, rows = table_cells(data)
    rank = data.get("ranking") or ranking(data["summary"])
    ahead = [f"{p['first']} > {p['second']}" for p in rank["pairs"] if p["significant"]]
    m = rank["method"]
    note = (f"Mean ± std over seeds; accuracy in %, ppl: byte perplexity. MRR over {m['cells']} (task, seed) cells, "
            f"[{round(100 * m['confidence'])} % CI]: paired percentile bootstrap of the cells, {m['resamples']:,} "
            f"resamples. {len(ahead)} of {len(rank['pairs'])} pairwise MRR differences are significant.")
    return md_table(head, rows) + "\n\n" + note + "\n\n" + caption("bench_standard", page, data, settings_text(data))


def determinism(page: str, load) -> str:
    """One bench run in fresh processes under changes: its loss and weights bit for bit."""
    data = load("determinism")
    rows = data["rows"]
    assert rows, "determinism.json has no rows"
    ref = rows[0]
    out = []
    for r in rows:
        same = r["loss_hex"] == ref["loss_hex"] and r["weights"] == ref["weights"]
        verdict = ("the reference" if r is ref else "bitwise equal" if same else
                   f"differs: loss {abs(r['loss'] - ref['loss']) / abs(ref['loss']):.1e} relative, other weights")
        out.append([r["change"], str(r["threads"]), r["capability"], repr(r["loss"]), verdict])
    run = data["run"]
    committed = "equals" if ref["loss"] == data["committed_loss"] else "differs from"
    extra = (f"the quick preset's {run['task']} / {run['encoding']} / seed {run['seed']} run, {run['steps']} steps, each "
             f"row a fresh interpreter (PYTHONHASHSEED=0 unless the row sets it), Python {data['python']}; the "
             f"reference's loss {committed} the committed quick table's run of the same seed, bit for bit")
    return md_table(["what changes", "threads", "CPU capability", "train loss", "against the reference"], out) \
        + "\n\n" + caption("determinism", page, data, extra)


def demo_timing(page: str, load) -> str:
    """`make demo` from a fresh clone, per phase."""
    data = load("demo_cpu")
    assert not data["dry_run"] and data["returncode"] == 0, "demo_cpu.json is not a finished make demo"
    assert data["phases"], "demo_cpu.json has no phases"
    rows = [[p["phase"], duration(p["seconds"])] for p in data["phases"]]
    rows.append(["**the whole `make demo`**", f"**{duration(data['seconds'])}**"])
    extra = f"{data['fresh']}; commit {data['commit'][:7]}"
    quick_run = load("bench_quick")
    if data["commit"][:7] in quick_run.get("note", ""):  # the committed quick table is this very run
        per_task: dict[str, float] = {}
        for r in quick_run["runs"]:
            per_task[r["task"]] = per_task.get(r["task"], 0.0) + r["train_seconds"]
        split = ", ".join(f"{t} {duration(v)}" for t, v in sorted(per_task.items(), key=lambda kv: -kv[1]))
        extra += (f". Its training, summed over each task's runs (bench_quick.json, the same run): {split}; "
                  f"passkey and copy train in one process, the real model and then lm in the other")
    return md_table(["phase", "wall time"], rows) + "\n\n" + caption("demo_cpu", page, data, extra)


def demo_headline(page: str, load) -> str:
    """One line for the README: how long a fresh clone's ``make demo`` took, and where."""
    data = load("demo_cpu")
    assert not data["dry_run"] and data["returncode"] == 0, "demo_cpu.json is not a finished make demo"
    where = f"{link(page, 'docs/bench.md')}#make-demo-seeds-and-timing"
    return (f"From a fresh clone, installs included, `make demo` took {duration(data['seconds'])} on "
            f"{data['machine']} ([phase by phase]({where})).")
