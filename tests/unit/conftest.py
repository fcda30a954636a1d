"""Fixtures shared by sibling folders of tests/unit.

``batches`` and ``make_batch`` (layers/, model/) build hashed batches in memory;
``tiny`` and ``tiny_export`` (export/, serving/) are a trained one-head model and
its export, built once per module that asks for them.
"""

import pytest

from tests.unit import memory_batches
from tests.unit.checkpoint import ckpt_common
from tests.unit.export import export_common


@pytest.fixture
def batches():
    return memory_batches.synthetic_batches


@pytest.fixture
def make_batch():
    return memory_batches.batch_of


@pytest.fixture(scope="module")
def tiny():
    return export_common.train_tiny()


@pytest.fixture(scope="module")
def tiny_export(tiny, tmp_path_factory):
    return tiny.export(str(tmp_path_factory.mktemp("tiny") / "exp"), dt="d1")


@pytest.fixture
def common():
    """A small model and its data for checkpoint, daily-cycle and inspect tests."""
    return ckpt_common
