"""The package's import layers, as docs/design.md draws them, and no import cycles.

The layer table in ``docs/design.md`` is the authority: a module may import only
from its own layer or below, at any level (module top, inside a function, under
``TYPE_CHECKING``). Separately, no two modules may import each other, directly or
through others.
"""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "tnrec"
DESIGN = ROOT / "docs" / "design.md"


def layer_table() -> dict[str, int]:
    """``{module prefix: layer}`` from the design doc's "Layers" table."""
    text = DESIGN.read_text(encoding="utf-8")
    table: dict[str, int] = {}
    for layer, cells in re.findall(r"^\| (\d+) \| (.+?) \|$", text, flags=re.M):
        for name in re.findall(r"`([\w.]+)`", cells):
            table[f"tnrec.{name}"] = int(layer)
    return table


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}
TOP = {"tnrec", "tnrec.__main__"}  # the package's own re-exports and entry point


def imports(name: str) -> set[str]:
    """Every tnrec module ``name`` imports, at any level of its code."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tnrec")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if not base.startswith("tnrec"):
                continue
            for alias in node.names:  # `from tnrec.table import files` imports a module
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


def layer_of(name: str, table: dict[str, int]) -> int:
    best = max((p for p in table if name == p or name.startswith(p + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"{name} is in no layer of {DESIGN}")
    return table[best]


def test_the_design_doc_places_every_module():
    table = layer_table()
    assert table, f"no layer table found in {DESIGN}"
    for name in MODULES:
        if name not in TOP:
            layer_of(name, table)


@pytest.mark.parametrize("name", sorted(set(MODULES) - TOP))
def test_imports_point_down_the_layers(name):
    table = layer_table()
    mine = layer_of(name, table)
    upward = {m: layer_of(m, table) for m in imports(name) if layer_of(m, table) > mine}
    assert not upward, f"{name} (layer {mine}) imports from higher layers: {upward}"


def test_no_import_cycles():
    graph = {name: imports(name) for name in MODULES if name not in TOP}
    # a package's __init__ only re-exports its own submodules; an edge into it from one of
    # them is the submodule importing a sibling through the package, so follow it by name
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_table_feature_column_and_data_do_not_import_torch():
    code = (
        "import sys, tnrec.table, tnrec.feature_column, tnrec.data, tnrec.data.synthetic, "
        "tnrec.metrics; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
