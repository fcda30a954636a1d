"""Every ```python block of README.md and docs/*.md runs against tiny data.

One test per block (id ``file:line``). The blocks of one file run in order in
one namespace and one working directory, so a later block may use the names
of an earlier one. Each file's working directory starts with the data the
examples name: ``data/<day>/part-00000.parquet`` for 2024-05-10 and
2024-05-11, holding the synthetic Criteo columns (``label``, ``I1``..``I13``,
``C1``..``C26``) and the columns of the README's examples (``user_id``,
``item_id``, ``clicked``, ``age``, ``price``, ``click``). A block that cannot
run by nature (a shell command, torchrun) is fenced ```bash or ```text.
"""

from __future__ import annotations

import os
import re
import shutil
import traceback
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tnrec.data.synthetic import SyntheticConfig, generate

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DAYS = ("2024-05-10", "2024-05-11")
ROWS_PER_DAY = 64

_FENCE = re.compile(r"^\s*```\s*(\S*)")


def _blocks(path: Path) -> list[tuple[int, str]]:
    """Return ``(line of the first code line, code)`` of each ```python block."""
    blocks: list[tuple[int, str]] = []
    lang: str | None = None
    start = 0
    code: list[str] = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = _FENCE.match(line)
        if lang is None:
            if m:
                lang, start, code = m.group(1), i + 1, []
        elif m and not m.group(1):
            if lang == "python":
                blocks.append((start, "\n".join(code) + "\n"))
            lang = None
        else:
            code.append(line)
    return blocks


def _params() -> list[pytest.param]:
    return [
        pytest.param(path, line, code, id=f"{path.relative_to(ROOT)}:{line - 1}")
        for path in DOC_FILES
        for line, code in _blocks(path)
    ]


def test_no_unlabelled_python_fences() -> None:
    """A block fenced ```py or ```python3 would not run here: use ```python."""
    odd = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in DOC_FILES
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if (m := _FENCE.match(line)) and m.group(1).startswith("py") and m.group(1) != "python"
    ]
    assert not odd, odd
    assert _params(), "no ```python blocks found"


def _readme_columns(n: int, day: int) -> dict[str, pa.Array]:
    """The README's and docs/data.md's columns, ``n`` rows of made-up values."""
    rows = range(n)
    return {
        "user_id": pa.array([1000 + (i * 7 + day) % 23 for i in rows], pa.int64()),
        "item_id": pa.array([f"item{(i * 5 + day) % 11}" for i in rows], pa.string()),
        "clicked": pa.array(
            [[f"item{(i + j) % 11}" for j in range(i % 4)] for i in rows], pa.list_(pa.string())
        ),
        "age": pa.array([None if i % 9 == 0 else 16 + (i * 3) % 50 for i in rows], pa.int64()),
        "price": pa.array([0.5 + (i % 13) * 1.25 for i in rows], pa.float64()),
        "click": pa.array([int(i % 5 == 0) for i in rows], pa.int64()),
    }


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``data/<day>/part-00000.parquet`` with the Criteo and the README columns."""
    root = tmp_path_factory.mktemp("doc_data") / "data"
    config = SyntheticConfig(rows_per_day=ROWS_PER_DAY, num_days=len(DAYS), test_rows=16)
    generated = generate(root, config)
    assert generated.days == DAYS
    for day_index, day in enumerate(DAYS):
        (path,) = generated.train_files[day]
        table = pq.read_table(path)
        for name, values in _readme_columns(table.num_rows, day_index).items():
            table = table.append_column(name, values)
        pq.write_table(table, path)
    return root


class _DocFile:
    """The namespace and working directory the blocks of one file share."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.namespace: dict[str, Any] = {"__name__": "__doc_example__"}
        self.done: set[int] = set()
        self.failed: str | None = None


_files: dict[Path, _DocFile] = {}


def _run(path: Path, line: int, code: str, doc: _DocFile) -> None:
    # Pad with blank lines so tracebacks give the line numbers of the doc file.
    source = "\n" * (line - 1) + code
    cwd = os.getcwd()
    os.chdir(doc.workdir)
    error: BaseException | None = None
    try:
        exec(compile(source, str(path), "exec"), doc.namespace)
    except (Exception, SystemExit) as e:
        error = e
    finally:
        os.chdir(cwd)
    doc.done.add(line)
    if error is not None:
        where = f"{path.relative_to(ROOT)}:{line - 1}"
        after = f" (after the block at {doc.failed} failed)" if doc.failed else ""
        doc.failed = doc.failed or where
        assert error.__traceback__ is not None
        # The traceback from the block's own frame on: it quotes the doc's lines.
        tb = traceback.format_exception(type(error), error, error.__traceback__.tb_next)
        pytest.fail(f"the block at {where} raised{after}:\n" + "".join(tb), pytrace=False)


@pytest.mark.parametrize(("path", "line", "code"), _params())
def test_doc_example(
    path: Path, line: int, code: str, tiny_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    doc = _files.get(path)
    if doc is None:
        workdir = tmp_path_factory.mktemp(path.stem)
        shutil.copytree(tiny_data, workdir / "data")
        doc = _files[path] = _DocFile(workdir)
    # Run the file's earlier blocks first when this one is selected alone.
    for earlier_line, earlier_code in _blocks(path):
        if earlier_line >= line:
            break
        if earlier_line not in doc.done:
            _run(path, earlier_line, earlier_code, doc)
    _run(path, line, code, doc)
