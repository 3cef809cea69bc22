"""docs/architecture.md stays true: its module tree names every module there is (and nothing
that is gone), and its recipe for adding an encoding is what every built-in encoding actually
has (a module in its family package, one import line there, its claims declared at registration,
a test file of its own named after its module)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from posenc.registry import get_info, list_encodings

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PKG = ROOT / "src" / "posenc"


def tree() -> str:
    start = DOC.index("```\nsrc/posenc/")
    return DOC[start: DOC.index("```", start + 3)]


def recipe(name: str) -> str:
    m = re.search(rf"<!-- recipe: {name} -->\n(.*?)<!-- end recipe -->", DOC, re.S)
    assert m, f"docs/architecture.md has no '{name}' recipe"
    return m.group(1)


def modules() -> list[str]:
    """Every module of the package, as the tree names it: 'config.py', 'analysis/probes.py'."""
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.name == "__init__.py" or "__pycache__" in rel.parts:
            continue
        out.append(str(rel))
    return out


def test_the_tree_names_every_module():
    text = tree()
    found = modules()
    assert len(found) > 50
    # a module is named by its file name or, in a list of a package's modules, by its stem
    missing = [m for m in found if not re.search(rf"(?<![\w/]){re.escape(Path(m).stem)}(\.py)?\b", text)]
    assert not missing, f"docs/architecture.md's module tree does not name {missing}"


def test_the_tree_names_nothing_that_is_gone():
    text = tree()
    named = set(re.findall(r"(?<![\w/])([a-z_]+\.py)\b", text)) - {"posenc_entry.py"}
    assert named, "no module named in the tree"
    present = {Path(m).name for m in modules()} | {"__init__.py"}
    assert not named - present, f"the tree names modules that do not exist: {sorted(named - present)}"


def test_every_recipe_names_files_that_exist():
    for name in ("encoding", "scaling", "leaf", "bench_task", "model_task", "subcommand"):
        paths = re.findall(r"`((?:src|tests|docs)/[^`]+)`", recipe(name))
        assert paths, name
        for p in paths:
            if "<" in p:  # a pattern: its folder must exist
                assert (ROOT / p.split("<")[0]).parent.is_dir(), p
            else:
                assert (ROOT / p).exists(), p


BUILT_IN = [n for n in list_encodings() if get_info(n).cls.__module__.startswith("posenc.")]


def test_there_are_built_in_encodings():
    assert len(BUILT_IN) >= 20


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_encoding_follows_the_recipe(name):
    assert "`src/posenc/<family>/<name>.py`" in recipe("encoding")
    module = get_info(name).cls.__module__  # posenc.<family>.<module>
    parts = module.split(".")
    assert len(parts) == 3 and parts[1] in ("absolute", "relative", "rotary"), module
    family_init = (PKG / parts[1] / "__init__.py").read_text()
    assert re.search(rf"^from \. import .*\b{parts[2]}\b|^from \.{parts[2]} import", family_init, re.M), \
        f"{module} is not imported by {parts[1]}/__init__.py"
    importlib.import_module(module)
    assert get_info(name).claims, f"{name} declares no literature claims at registration (@register(claims=...))"
    own = [f"test_{parts[2]}.py", f"test_{parts[1]}_{parts[2]}.py"]  # tests/ mirrors the package
    found = [f for f in own if (ROOT / "tests" / f).is_file()]
    assert found, f"{name} ({module}) has no test file of its own: expected tests/{own[0]} or tests/{own[1]}"
    assert re.search(rf"['\"]{name}['\"]", (ROOT / "tests" / found[0]).read_text()), \
        f"tests/{found[0]} does not name {name!r}"


# ------------------------------------------------------------------ the claims the doc makes

def _sources(outside: str) -> dict[str, str]:
    return {str(p.relative_to(PKG)): p.read_text() for p in PKG.rglob("*.py")
            if "__pycache__" not in p.parts and not str(p.relative_to(PKG)).startswith(outside)}


def test_the_leaf_table_names_every_leaf():
    from posenc.backends.planner import Leaf

    section = DOC[DOC.index("## How an attention call runs"):DOC.index("## How a new encoding gets")]
    named = set(re.findall(r"^\| `([A-Z_]+)`(?: / `([A-Z_]+)`)? \|", section, re.M))
    named = {n for pair in named for n in pair if n}
    assert named == {leaf.name for leaf in Leaf}


def _imports(path: str, text: str) -> set[str]:
    package = ["posenc", *Path(path).parts[:-1]]
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out |= {name} | {f"{name}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_only_the_planner_chooses_a_path():
    leaves = {f"posenc.backends.{m}" for m in ("eager", "sdpa", "cpu_flash", "fused", "flex")}
    sources = _sources("backends/")
    assert len(sources) > 50
    found = {path for path, text in sources.items()
             if _imports(path, text) & (leaves | {"posenc.backends.planner", "posenc.backends.Leaf"})
             or re.search(r"\bLeaf\.[A-Z]", text)}
    # the relative-scores benchmark times one leaf function directly, on purpose
    assert found == {"speed/relative.py"}, f"outside backends/, these choose or call a leaf: {sorted(found)}"


def test_no_module_is_over_500_lines():
    sizes = {str(p.relative_to(PKG)): len(p.read_text().splitlines()) for p in PKG.rglob("*.py")}
    assert sizes
    assert not {m: n for m, n in sizes.items() if n > 500}, "one idea per file: split these"


def _names_a_task(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_task(e, names) for e in node.elts)
    return False


def test_no_code_branches_on_a_task_name():
    # a task is an object found in a registry: code asks it, never compares its name
    # (the synthetic tasks' names are common words: "copy" is also a kernel of the RoPE timing)
    from posenc.bench.tasks import task_names
    from posenc.hf.tasks import model_task_names

    names = set(model_task_names())
    assert {"lm", "passkey"} <= names <= set(task_names()) | names
    hits = []
    for path, text in _sources("\0").items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Compare) and any(_names_a_task(n, names) for n in [node.left, *node.comparators]):
                hits.append(f"{path}:{node.lineno}")
    assert not hits, f"code that compares a task's name: {hits}"


def test_lm_is_named_only_where_it_is_defined():
    lines = [f"{path}: {line.strip()}" for path, text in _sources("\0").items()
             for line in text.splitlines() if '"lm"' in line]
    assert lines and all(re.search(r'^\S+: name = "lm"', line) for line in lines), lines
