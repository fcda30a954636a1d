"""A small model and data for checkpoint tests (shared with the kill-test child process)."""

import pytest

from tests.unit.checkpoint import ckpt_common


@pytest.fixture
def common():
    return ckpt_common
