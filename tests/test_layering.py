"""The application packages form layers, not a cycle: ``analysis`` may import ``hf`` and
``bench``, ``hf`` may import ``bench``, and never the other way round (issue: one house, easy
to change). Every import is read from the source, lazy ones inside functions included."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "src" / "posenc"
PACKAGES = ("analysis", "bench", "hf")
ALLOWED = {("analysis", "bench"), ("analysis", "hf"), ("hf", "bench")}


def imported_modules(path: pathlib.Path) -> list[str]:
    rel = path.relative_to(ROOT).parts
    package = ["posenc", *rel[:-1]]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out += [name] + [f"{name}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def package_edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for path in ROOT.rglob("*.py"):
        src = path.relative_to(ROOT).parts[0]
        if src not in PACKAGES:
            continue
        for name in imported_modules(path):
            parts = name.split(".")
            if len(parts) > 1 and parts[0] == "posenc" and parts[1] in PACKAGES and parts[1] != src:
                edges.setdefault((src, parts[1]), []).append(str(path.relative_to(ROOT)))
    return edges


def test_the_scan_sees_imports():
    # hf's bench --model reads bench's tasks: if the scan found no edge at all it would prove nothing
    assert ("hf", "bench") in package_edges()


def test_application_packages_form_layers():
    bad = {edge: files for edge, files in package_edges().items() if edge not in ALLOWED}
    assert not bad, f"imports against the layering (analysis > hf > bench): {bad}"
