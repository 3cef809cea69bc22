"""The formatting every table shares: ratios, durations, Markdown tables, and the caption under a
table (the machine once, then the command and the results file each number comes from)."""

from __future__ import annotations

import posixpath

from .results import RESULTS, recorded_command


def ratio(x: float) -> str:
    """A ratio with three significant digits: 0.89x, 2.19x, 17.2x, 100x."""
    if x >= 99.95:
        return f"{x:.0f}x"
    return f"{x:.1f}x" if x >= 9.995 else f"{x:.2f}x"


def duration(seconds: float) -> str:
    """``6 min 20 s`` (whole seconds; under a minute ``35 s``)."""
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; ``|`` inside a cell is escaped."""
    esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def machine_of(name: str, data: dict) -> str:
    """The machine a results file was measured on: recorded in the file, else stated in RESULTS."""
    machine = data.get("machine") or RESULTS[name].machine
    if machine:
        return machine
    meta = data.get("meta", {})
    if meta.get("torch"):  # a script that records its software but not the machine
        versions = ", ".join(f"{k} {meta[k]}" for k in ("torch", "transformers", "python") if k in meta)
        return f"not recorded ({versions})"
    raise ValueError(f"{RESULTS[name].file} records no machine; re-run it with --rerun {name}")


def _sentence(part: str) -> str:
    return f". {part[0].upper()}{part[1:]}" if part else ""


def link(page: str, target: str) -> str:
    """``target`` (a path from the repository root, maybe with an #anchor) as a link from ``page``."""
    return posixpath.relpath(target, posixpath.dirname(page) or ".")


def _source(name: str, page: str, data: dict, extra: str, notes: bool) -> str:
    """``Command: `...`; results: [file](link). Extra. Note`` (the link relative to ``page``)."""
    file = RESULTS[name].file
    text = f"Command: `{recorded_command(RESULTS[name], data)}`; results: [{file}]({link(page, f'benchmarks/results/{file}')})"
    text += _sentence(extra) + (_sentence(data.get("note", "")) if notes else "")
    return text + "."


def caption(name: str, page: str, data: dict, extra: str = "") -> str:
    """The line under a table: the machine, the command that wrote the file, the file, any note."""
    return f"Machine: {machine_of(name, data)}. " + _source(name, page, data, extra, notes=True)


def captions(page: str, sources: list[tuple[str, dict, str]], *, notes: bool = True, details: str = "") -> str:
    """The caption of a table drawn from one or more files, each (name, data, extra): the machine
    once when every file shares it, then each file's command, results and notes; ``details``
    links to where the caption is given in full (a README headline table)."""
    machines = [machine_of(name, data) for name, data, _ in sources]
    parts = [_source(n, page, d, e, notes) for n, d, e in sources]
    if len(set(machines)) > 1:
        text = "\n\n".join(f"Machine: {m}. {p}" for m, p in zip(machines, parts))
    elif len(parts) == 1:
        text = f"Machine: {machines[0]}. {parts[0]}"
    else:
        text = f"Machine, for each file below: {machines[0]}.\n\n" + "\n\n".join(parts)
    return text + (f" Setup and caption in full: {details}." if details else "")


def brief(name: str, page: str, data: dict, details: str) -> str:
    """The caption of a README headline table: machine, command and file, and where the full one is."""
    return captions(page, [(name, data, "")], notes=False, details=details)
