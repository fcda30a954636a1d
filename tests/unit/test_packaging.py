"""The declared Python floor is the one mypy and ruff check against."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_mypy_and_ruff_check_the_declared_python_floor():
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    floor = doc["project"]["requires-python"].removeprefix(">=")
    assert doc["tool"]["mypy"]["python_version"] == floor
    assert doc["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")
