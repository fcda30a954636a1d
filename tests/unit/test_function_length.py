"""No function in src/tnrec runs longer than 80 lines without its docstring."""

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "tnrec"
LIMIT = 80


def _long_functions() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if len(body) == 1:
                    continue
                first = body[1]  # the docstring does not count
            length = (node.end_lineno or first.lineno) - first.lineno + 1
            if length > LIMIT:
                found.append(f"{path.relative_to(SRC.parent)}:{node.lineno} {node.name}: {length}")
    return found


@pytest.mark.parametrize("limit", [pytest.param(LIMIT, id="80-lines")])
def test_functions_fit_in_80_lines_without_their_docstring(limit):
    assert _long_functions() == [], f"functions over {limit} lines"
