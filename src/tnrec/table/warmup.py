"""Compile (or load from the numba cache) every table kernel once.

Run ``python -m tnrec.table.warmup`` with ``NUMBA_CACHE_DIR`` set before
starting many processes (tests, workers): they then load the compiled kernels
from the cache instead of each compiling them again.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np

from tnrec._hashing import bucket_of, mix64
from tnrec.table import team
from tnrec.table.init import normal, uniform, zeros
from tnrec.table.optimizers import SGD, AdaGrad, Adam, Ftrl
from tnrec.table.policy import EvictionPolicy
from tnrec.table.table import REGION_INSERT_MIN, SparseTable


def warm() -> float:
    """Run every kernel on a few keys; return the seconds it took."""
    t0 = time.perf_counter()
    keys = np.arange(-3, 3, dtype=np.int64)
    mix64(keys)
    bucket_of(keys)
    policy = EvictionPolicy(show_threshold=0.5, max_unseen_days=1)
    for opt, init in (
        (SGD(), zeros()),
        (AdaGrad(), normal()),
        (Adam(), uniform()),
        (Ftrl(), normal()),
    ):
        t = SparseTable(2, opt, name="warm", initializer=init, policy=policy)
        t.pull(keys)
        t.pull(keys, create=False)
        t.pull_unchecked(keys)
        ones = np.ones(keys.shape[0], np.float32)
        t.push(keys, np.ones((keys.shape[0], 2), np.float32), ones, ones)
        t.push_unchecked(keys, np.ones((keys.shape[0], 2), np.float32), ones, ones)
        # a push of other keys than the last pull's takes the lookup kernels
        t.pull(keys[::-1].copy())
        t.push(keys, np.ones((keys.shape[0], 2), np.float32), ones, ones)
        t.pull(keys[::-1].copy())
        t.push_unchecked(keys, np.ones((keys.shape[0], 2), np.float32), ones, ones)
        t.show_decay(2)
        t.evict()
        t.delete(keys[:1])
        with tempfile.TemporaryDirectory() as d:
            t.save(f"{d}/t")
            SparseTable.load(f"{d}/t")
    # Big inserts and a big index's growth go by region (REGION_INSERT_MIN keys, slots):
    # pulls of new keys found or inserted in one pass, one of present and new keys in
    # one pass, then (after a pull that missed half) a lookup and a region insert.
    t = SparseTable(1, AdaGrad(), name="warm")
    big = np.arange(REGION_INSERT_MIN, dtype=np.int64)
    t.pull(big)
    t.reserve(2 * REGION_INSERT_MIN)
    t.pull(big + REGION_INSERT_MIN)
    t.pull(np.arange(REGION_INSERT_MIN, 3 * REGION_INSERT_MIN, dtype=np.int64))
    t.pull(big + 3 * REGION_INSERT_MIN)
    team.warm()  # the bodies the step's pull and push run on torch's OpenMP team
    return time.perf_counter() - t0


if __name__ == "__main__":
    print(f"tnrec table kernels ready in {warm():.1f} s")
