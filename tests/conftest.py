"""Shared pytest setup: one numba cache for the whole run (also for spawned processes)."""

import os

os.environ.setdefault(
    "NUMBA_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".numba_cache")
)
