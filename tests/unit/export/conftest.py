"""Shared export fixtures: a trained one-head model and its export, built once per module."""

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import export_common  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return export_common.train_tiny()


@pytest.fixture(scope="module")
def tiny_export(tiny, tmp_path_factory):
    return tiny.export(str(tmp_path_factory.mktemp("tiny") / "exp"), dt="d1")


@pytest.fixture
def exp(tiny_export, tmp_path):
    """A fresh copy of the tiny export, free to damage."""
    return shutil.copytree(tiny_export, str(tmp_path / "exp"))
