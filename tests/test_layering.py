"""The application packages form layers, not a cycle: ``analysis`` may import ``hf`` and
``bench``, ``hf`` may import ``bench``, and never the other way round (issue: one house, easy
to change). Every import is read from the source, lazy ones inside functions included."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "src" / "posenc"
PACKAGES = ("analysis", "bench", "engines", "hf")
ALLOWED = {("analysis", "bench"), ("analysis", "hf"), ("hf", "bench"), ("analysis", "engines"), ("hf", "engines")}


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


WINGS = ("analysis", "bench", "engines", "hf", "cli", "speed")


def test_the_core_and_the_neutral_services_import_no_wing():
    # files.py, results.py, text.py, progress.py and the core are below every application
    below = [p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in WINGS and "__pycache__" not in p.parts]
    assert any(p.name == "results.py" for p in below) and len(below) > 50
    bad = {}
    for path in below:
        for name in imported_modules(path):
            parts = name.split(".")
            if len(parts) > 1 and parts[0] == "posenc" and parts[1] in WINGS:
                bad.setdefault(str(path.relative_to(ROOT)), []).append(name)
    assert not bad, f"modules below the wings import a wing: {bad}"


def test_no_library_module_imports_the_cli():
    # __main__.py is `python -m posenc`: the command line's own entry
    bad = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in ("cli", "__main__.py")
           for n in imported_modules(p) if n.startswith("posenc.cli") or n.startswith("posenc_entry")}
    assert not bad, f"the library imports the command line: {bad}"
