"""The metrics keep NumPy's BLAS threads asleep (``tnrec._numeric.dot``).

OpenBLAS's worker threads spin for a while after every threaded call, and
beside torch's threads on every core they take a core away from training. A
fresh process measures the CPU time its other threads take while an AUC
with a big histogram is read five times, against the same for ``a @ a``.
"""

import subprocess
import sys

import pytest

CODE = r"""
import os, time
import numpy as np
from tnrec.metrics import AUC, LogLoss

def other_ticks():
    me, n = os.getpid(), 0
    for t in os.listdir("/proc/self/task"):
        if int(t) != me:
            with open(f"/proc/self/task/{t}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            n += int(rest[11]) + int(rest[12])  # utime + stime, in clock ticks
    return n

def ticks(fn):
    t0 = other_ticks()
    for _ in range(5):
        fn()
        time.sleep(0.05)
    return other_ticks() - t0

time.sleep(0.5)  # BLAS's threads, started with NumPy, go to sleep
rng = np.random.default_rng(0)
y = (rng.random(200_000) < 0.3).astype(np.float64)
p, w = rng.random(200_000), rng.random(200_000)
auc, logloss = AUC(), LogLoss()
auc.update(y, p)
print(ticks(lambda: (auc.result(), logloss.update(y, p, w))))
a = rng.random(1 << 17)
print(ticks(lambda: float(a @ a)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_reading_the_metrics_leaves_numpys_blas_threads_asleep():
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=True
    )
    metric, blas = (int(x) for x in out.stdout.split())
    if blas < 5:
        pytest.skip(f"NumPy's BLAS runs no spinning threads here (a @ a: {blas} ticks)")
    assert metric <= 2, f"the metrics woke BLAS's threads: {metric} ticks (a @ a: {blas})"
