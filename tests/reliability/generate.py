"""Write docs/reliability.md from the reliability cases: ``python -m tests.reliability.generate``.

Run from the repository root. Every case is run; a case whose error differs from what it
states fails here as it fails in the tests.
"""

from __future__ import annotations

import pathlib
import sys

from . import all_cases, run_case

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"

HEADER = """# Reliability: bad inputs and faults, with the error each gives

Every row is a case in `tests/reliability/cases_*.py`, run by `tests/test_reliability.py`, which
asserts the error type and that the message names what is wrong; this page is written from the
messages those runs produce (`python -m tests.reliability.generate`), and a test fails when it
is out of date. CLI errors are one line on stderr with exit code 2. "result" rows are inputs that
have a defined result instead of an error. Where the message depends on the machine (an optional
package, a GPU), the row says what each machine gets.
"""


def render() -> str:
    cases = all_cases()
    out = [HEADER, f"{len(cases)} cases.\n", "| area | cases |\n|---|---|"]
    counts: dict[str, int] = {}
    for case in cases:
        counts[case.area] = counts.get(case.area, 0) + 1
    out += [f"| {area} | {n} |" for area, n in counts.items()]
    out.append("")
    area = None
    for case in cases:
        if case.area != area:
            area = case.area
            out.append(f"\n## {area}\n\n| input or fault | gives |\n|---|---|")
        o = run_case(case)
        msg = (o.message if case.doc is None else case.doc).replace("|", "\\|").replace("\n", " ")
        what = case.what.replace("|", "\\|")
        out.append(f"| {what} | `{o.kind}`: {msg} |")
    return "\n".join(out) + "\n"


def main() -> int:
    DOC.write_text(render())
    print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
