"""Export fixtures; ``tiny`` and ``tiny_export`` (shared with serving/) are in ../conftest.py."""

import shutil

import pytest


@pytest.fixture
def exp(tiny_export, tmp_path):
    """A fresh copy of the tiny export, free to damage."""
    return shutil.copytree(tiny_export, str(tmp_path / "exp"))
