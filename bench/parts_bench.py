"""Single parts of a step, timed alone: the initializer, dense Adam, a creating pull, the
concat pooling.

    NUMBA_CACHE_DIR=.numba_cache python3 bench/parts_bench.py      # ~30 seconds
    python3 bench/parts_bench.py --strict

* **initializer**: ``rows.init_vectors`` (what ``create_rows`` runs for each new
  key) with ``tn.table.normal`` at dim 16 on 1M keys, ns a key (median of 5);
* **Adam**: ``torch.optim.Adam`` on DeepFM's MLP parameters (429-400-400-400-1)
  and on the micro model's ``Linear(32, 1)``, gradients set, the default
  implementation against ``fused=True`` (what ``tn.optimizer.Adam`` builds),
  median of 50 steps, 1 torch thread;
* **creating pull**: pulls of 8,192 new keys (a first epoch's micro step) into
  a table of dim 16 holding 1M keys, each right after a torch matrix product,
  at 2 torch threads, alternating the default (the lookups, the inserts by
  region and the new rows on torch's OpenMP team, :mod:`tnrec.table.team`) with
  ``TNREC_TABLE_TEAM=0`` (the table's Python threads), µs, median of 60 each;
* **pooling**: a DeepFM-shaped ``output="concat"`` layer (26 columns, 4096
  rows, one key or none a bag, 24k unique keys) at D = 16 and D = 1, forward
  and backward, by the general kernels and by the one-key kernels
  (``layers/pooling.py``), median of 25: *hot* right after the same call,
  *cold* after reading 96 MB (as after a dense network's step).

The machine's state is recorded around the whole run (``machine_state.py``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from machine_state import MachineWatch, add_strict_flag, check_runs


def _median_s(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def initializer_ns(keys: int = 1_000_000, dim: int = 16) -> float:
    from tnrec.table import rows
    from tnrec.table.init import INIT_NORMAL

    k = np.arange(keys, dtype=np.int64)
    out = np.empty((keys, dim), np.float32)
    run = lambda: rows.init_vectors(k, np.uint64(7), INIT_NORMAL, 1.0, dim, out)  # noqa: E731
    run()  # compile / load from the cache
    return _median_s(run, 5) / keys * 1e9


def adam_ms(shapes: list[tuple[int, ...]], fused: bool) -> float:
    params = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-3, fused=fused)
    for _ in range(5):
        opt.step()
    return _median_s(opt.step, 50) * 1e3


def creating_pull_us(pulls: int = 60, keys: int = 8192) -> dict[str, float]:
    """Median µs of a creating pull of ``keys`` new keys at 2 torch threads, on the team
    (the default) and on the Python threads (``TNREC_TABLE_TEAM=0``), alternating."""
    from tnrec.table import AdaGrad, SparseTable

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    t = SparseTable(16, AdaGrad(0.05), name="parts")
    t.pull_unchecked(np.arange(1_000_000, dtype=np.int64), True)
    a = torch.randn(256, 256)
    times: dict[str, list[float]] = {"on torch's team": [], "on the Python threads": []}
    env = os.environ.get("TNREC_TABLE_TEAM")
    try:
        for i in range(2 * pulls):
            line = list(times)[i % 2]
            if line == "on the Python threads":
                os.environ["TNREC_TABLE_TEAM"] = "0"
            else:
                os.environ.pop("TNREC_TABLE_TEAM", None)
            k = np.arange(keys, dtype=np.int64) + (1_000_000 + i * keys)
            (a @ a).sum()  # torch's workers now spin, as after a step's dense part
            t0 = time.perf_counter()
            t.pull_unchecked(k, True)
            times[line].append(time.perf_counter() - t0)
    finally:
        if env is None:
            os.environ.pop("TNREC_TABLE_TEAM", None)
        else:
            os.environ["TNREC_TABLE_TEAM"] = env
        torch.set_num_threads(before)
    return {line: 1e6 * float(np.median(ts[2:])) for line, ts in times.items()}


def pooling_ms(dim: int, cold: bool) -> dict[str, float]:
    """Forward and backward ms of the general and the one-key kernels on DeepFM-shaped bags."""
    from tnrec.layers import pooling

    rng = np.random.default_rng(0)
    C, B, U = 26, 4096, 24_000
    lengths = (rng.random(C * B) >= 0.08).astype(np.int64)  # [C*B] 8% empty bags
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # [C*B + 1]
    vids = rng.integers(0, U, int(offsets[-1])).astype(np.int64)  # [N]
    scales = pooling.bag_scales(lengths, "sum")
    ids = pooling.one_key_bags(vids, offsets, B, U)
    assert ids is not None
    E = rng.standard_normal((U, dim)).astype(np.float32)
    grad = rng.standard_normal(B * C * dim).astype(np.float32)
    flush = [np.ones(4_000_000) for _ in range(3)]  # 96 MB

    def timed(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(25):
            if cold:
                for f in flush:
                    f.sum()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1e3

    def out() -> np.ndarray:
        return torch.empty(B * C * dim).numpy()

    def zeros() -> np.ndarray:
        return torch.zeros(U, dim).numpy()

    calls = {
        "forward, general": lambda: pooling._pool_forward(E, vids, offsets, scales, out(), B, True),
        "forward, one-key": lambda: pooling._one_key_forward(E, ids, out()),
        "backward, general": lambda: pooling._pool_backward(
            grad, vids, offsets, scales, zeros(), B, True
        ),
        "backward, one-key": lambda: pooling._one_key_backward(grad, ids, zeros()),
    }
    for fn in calls.values():
        fn()  # compile / load from the cache
    return {name: timed(fn) for name, fn in calls.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_strict_flag(p)
    a = p.parse_args()
    torch.set_num_threads(1)
    deepfm = [(400, 429), (400,), (400, 400), (400,), (400, 400), (400,), (1, 400), (1,)]
    micro = [(1, 32), (1,)]
    with MachineWatch() as watch:
        init = initializer_ns()
        rows = [(name, adam_ms(s, False), adam_ms(s, True)) for name, s in (
            ("DeepFM MLP", deepfm), ("micro Linear(32, 1)", micro))]  # fmt: skip
        pools = {(d, cold): pooling_ms(d, cold) for d in (16, 1) for cold in (False, True)}
        creating = creating_pull_us()
    notes = check_runs([("parts_bench", watch.state)], a.strict)
    print(f"machine: {watch.state.summary()}")
    print(f"normal initializer, dim 16, 1M keys: {init:.1f} ns a key ({init / 16:.1f} an element)")
    print(f"{'Adam step, 1 thread':22s} {'default ms':>10s} {'fused ms':>9s}")
    for name, default, fused in rows:
        print(f"{name:22s} {default:10.3f} {fused:9.3f}")
    print()
    print("creating pull, 8,192 new keys, dim 16, 1M keys held, 2 torch threads, µs")
    for line, us in creating.items():
        print(f"{line:22s} {us:10.1f}")
    print()
    print("concat pooling, 26 columns x 4096 rows, one key or none a bag, ms")
    print(f"{'':20s}" + "".join(f"{f'D={d} {c}':>12s}" for d in (16, 1) for c in ("hot", "cold")))
    for name in pools[(16, False)]:
        cells = "".join(f"{pools[(d, c)][name]:12.3f}" for d in (16, 1) for c in (False, True))
        print(f"{name:20s}{cells}")
    for line in notes:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
