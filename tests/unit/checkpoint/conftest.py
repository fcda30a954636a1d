"""A small model and data for checkpoint tests (shared with the kill-test child process)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import ckpt_common  # noqa: E402


@pytest.fixture
def common():
    return ckpt_common
