"""The figure of docs/real_models.md's length-extension section: SmolLM2-135M's token perplexity
against length on both corpora, and passkey accuracy, one line per row (the model itself, each
training-free scaling, the raised base), from the committed results files.

    python benchmarks/plot_bench_model.py --out docs/img/bench_model_smollm2.png

Each scaling is evaluated beyond L only (at and below L it is the model itself), so its line
starts at the model's point at L. The 4L points and passkey at 1.5L come from their separate
results files when they are there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# (panel title, results files whose lm points it draws)
LM_PANELS = (("Python sources (--corpus code)", ("bench_model_smollm2_code.json", "bench_model_smollm2_code_4L.json")),
             ("King James Bible (--corpus prose)", ("bench_model_smollm2_prose.json", "bench_model_smollm2_prose_4L.json")))
# passkey reads no corpus: the code run's, and the 1.5L run's
PASSKEY_FILES = ("bench_model_smollm2_code.json", "bench_model_smollm2_passkey_1.5L.json")


def cells(files: tuple[str, ...], task: str, results: Path = RESULTS) -> tuple[dict[str, dict[int, float]], int, dict]:
    """{row name: {length: value}} of ``task`` over the files that exist (passkey: % over depths), L, settings."""
    from posenc.hf.scalings import variant_label

    rows: dict[str, dict[int, list[float]]] = {}
    L, settings = None, None
    for name in files:
        path = results / name
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        s = data["settings"]
        L, settings = s["trained_length"], settings or s
        for run in data["runs"]:
            if run["task"] != task:
                continue
            for p in run["points"]:
                row = s["label"] if p["variant"] == "base" else variant_label(s, p["variant"])
                rows.setdefault(row, {}).setdefault(p["length"], []).append(p["value"])
    scale = 100.0 if task == "passkey" else 1.0
    out = {row: {n: scale * sum(v) / len(v) for n, v in sorted(pts.items())} for row, pts in rows.items()}
    if L is None:
        raise FileNotFoundError(f"none of {', '.join(files)} is in {results}")
    return out, L, settings


def draw(ax, rows: dict[str, dict[int, float]], L: int, ylabel: str, log: bool) -> None:
    """One line per row; rows within 0.1 % of each other at every length are drawn once, named together."""
    model = next(iter(rows.values()))  # the model itself: the first row evaluated
    lengths = sorted({n for r in rows.values() for n in r})
    full = {}
    for name, r in rows.items():
        pts = dict(r)
        if r is not model and L in model:
            pts.setdefault(L, model[L])  # a scaling equals the model at L
        full[name] = pts
    groups: list[list[str]] = []
    for name, pts in full.items():
        for g in groups:
            ref = full[g[0]]
            if ref.keys() == pts.keys() and all(abs(ref[n] - pts[n]) <= 1e-3 * max(abs(ref[n]), 1e-9) for n in pts):
                g.append(name)
                break
        else:
            groups.append([name])
    order = list(full)  # a row keeps its colour in every panel, grouped or not
    for g in groups:
        i = order.index(g[0])
        pts = full[g[0]]
        is_model = rows[g[0]] is model
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], "o-" if is_model else "o--", color=f"C{i}", lw=2 if is_model else 1.2,
                ms=4, label=" = ".join(g), zorder=1 if is_model else 2)  # a scaling on the model's line stays visible
    ax.axvline(L, color="k", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [f"{n}\n{n / L:g} L" for n in lengths], fontsize=8)
    ax.minorticks_off()
    if log:
        ax.set_yscale("log")
        lo = min(v for r in rows.values() for v in r.values())
        hi = max(v for r in rows.values() for v in r.values())
        ticks = [t for t in (2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 30, 40, 60, 100, 200, 400, 1000) if lo / 1.1 <= t <= hi * 1.1]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_ylim(lo / 1.08, hi * 1.08)
    ax.set_xlabel("tokens (L stated as %d)" % L, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.grid(alpha=0.3, which="both")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("docs/img/bench_model_smollm2.png"), help="the PNG to write")
    p.add_argument("--results", type=Path, default=RESULTS, help="the folder of the results files (default: the committed)")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    for ax, (title, files) in zip(axes, LM_PANELS):
        rows, L, _ = cells(files, "lm", args.results)
        draw(ax, rows, L, "token perplexity (log scale; lower is better)", log=True)
        ax.set_title(title, fontsize=10)
    rows, L, s = cells(PASSKEY_FILES, "passkey", args.results)
    draw(axes[2], rows, L, "passkey accuracy, % (mean over depths)", log=False)
    axes[2].set_ylim(-5, 105)
    depths = ", ".join(f"{d:g}" for d in s["passkey_depths"])
    axes[2].set_title(f"passkey: depths {depths}, {s['passkey_examples']} example each", fontsize=10)
    for ax in axes:
        ax.legend(fontsize=7, loc="lower left" if ax is axes[2] else "upper left")
    fig.suptitle(f"SmolLM2-135M past a stated L = {L} (trained at 8192: the procedure, not an extension test)",
                 fontsize=11)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
