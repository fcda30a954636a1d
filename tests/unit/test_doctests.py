"""Every module's docstring examples run and pass, so they cannot drift from the code.

One test per module under ``src/tnrec`` (found on disk, so a module that does
not import fails here instead of being skipped). Each test runs the module's
doctests with the stdlib ``doctest`` in an empty working directory, with
``tempfile`` pointed at pytest's temporary directory: an example that writes
must do so under ``tempfile.mkdtemp()``, and one that writes into the current
directory fails. Every ``>>>`` line in the file must be collected and none may
be skipped: a call that cannot run in a doctest (torchrun, a long training) is
shown as a comment, ``# model.fit(reader)``.
"""

from __future__ import annotations

import doctest
import importlib
import io
import tempfile
from pathlib import Path

import pytest

import tnrec

PACKAGE_DIR = Path(tnrec.__file__).resolve().parent

OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if "__pycache__" not in path.parts:
            found.append((_module_name(path), path))
    return found


def _params() -> list[pytest.param]:
    params = []
    for name, path in _modules():
        params.append(pytest.param(name, path, id=name))
    return params


def _prompt_count(path: Path) -> int:
    """The ``>>>`` lines of a source file that start an example (not a bare comment)."""
    count = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.lstrip()
        if stripped.startswith(">>>") and not stripped[3:].lstrip().startswith("#"):
            count += bool(stripped[3:].strip())
    return count


def test_modules_found() -> None:
    names = {name for name, _ in _modules()}
    assert {"tnrec", "tnrec.data", "tnrec.data.reader"} <= names, names


@pytest.mark.parametrize(("name", "path"), _params())
def test_doctests(name: str, path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(name)  # an import error fails the test
    tests = doctest.DocTestFinder().find(module, name)
    examples = [(t, ex) for t in tests for ex in t.examples]

    prompts = _prompt_count(path)
    assert len(examples) == prompts, (
        f"{path}: {prompts} '>>>' lines but doctest collects {len(examples)} examples "
        f"(from {[t.name for t in tests if t.examples]}); an example in a docstring doctest "
        "cannot see (a numba kernel, an object defined elsewhere) never runs"
    )
    skipped = [
        f"{t.name} line {(t.lineno or 0) + ex.lineno + 1}: {ex.source.strip()}"
        for t, ex in examples
        if ex.options.get(doctest.SKIP)
    ]
    assert not skipped, (
        "doctest: +SKIP hides an example; show a call that cannot run as a comment: "
        + "; ".join(skipped)
    )

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(tempfile, "tempdir", str(temp_root))

    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS, verbose=False)
    for test in tests:
        runner.run(test, out=report.write)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} failed\n" + (
        report.getvalue()
    )
    written = sorted(p.name for p in cwd.iterdir())
    assert not written, f"{name}: doctests wrote {written} into the current directory"
