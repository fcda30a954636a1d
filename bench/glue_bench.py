"""What tnrec's step costs beyond its kernels: ``train_step`` against the same calls by hand.

    NUMBA_CACHE_DIR=.numba_cache python3 bench/glue_bench.py            # ~10 seconds
    python3 bench/glue_bench.py --threads 1,2 --repeats 3 --strict
    python3 bench/glue_bench.py --rows 16 --repeats 3 --strict      # the step's fixed part

The micro model of ``compare.py`` (2 columns, dim 16, ``Linear(32, 1)``, Adam,
batch 4096, every row created before the timing). Three steps run one after
another on every batch, in a rotating order, in one process (so the machine's
drift weighs on all three alike), ms a step, median (min-max) over the repeats:

* ``train_step``: ``Model.train_step`` (pull, forward, loss, backward, the
  checks, push, dense step);
* ``by hand``: a second, identically seeded model stepped by :class:`HandStep`,
  the calls ``train_step`` makes for this model and nothing else: the batch
  layout, the de-duplication, the table's pull, the one-key pooling, the
  dense part, the loss, the backward, show and click, the table's push and
  the dense optimizer. No label or weight check, no finite check, no
  bookkeeping for other layers, tables, heads, workers or the input pipeline.
  It trains the same model bit for bit (``tests/unit/test_bench_glue_bench.py``);
* ``dense only``: the dense part on fixed inputs (``compare.py``'s
  ``DenseImpl``).

``--rows N`` steps on the first ``N`` rows of each batch: at 16 rows the
kernels cost next to nothing, and what is left is each step's fixed part.

``train_step - by hand`` is what tnrec's own Python, its checks and its
bookkeeping cost the step over the kernels and torch calls they wrap. The
machine's state is recorded around each thread count's run
(``machine_state.py``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from machine_state import MachineWatch, check_runs, cpu_line
from reader_bench import add_run_args, print_by_threads

LINES = ("train_step", "by hand", "dense only")


class HandStep:
    """The micro model's training step as the kernels and torch calls alone.

    Args:
        model: a ``compare_impls.TnrecImpl("micro")`` model (one ``concat``
            layer of one-key columns over one AdaGrad table, ``lin``, a
            binary cross-entropy head, a compiled dense optimizer).
    """

    def __init__(self, model: Any) -> None:
        import torch
        import torch.nn.functional as F

        from tnrec.layers.embedding import bag_layout
        from tnrec.layers.pooling import PoolOneKey, one_key_bags
        from tnrec.ps.unique import show_click, unique_inverse

        self.torch = torch
        self.bce = F.binary_cross_entropy_with_logits
        self.bag_layout = bag_layout
        self.unique_inverse = unique_inverse
        self.one_key_bags = one_key_bags
        self.pool = PoolOneKey.apply
        self.show_click = show_click
        self.model = model
        (self.table,) = model.tables.values()
        self.columns = tuple(c.key for c in model.emb.columns)
        self.opt = model.optimizer

    def __call__(self, batch: Any) -> float:
        """Train on ``batch``; return the loss."""
        torch = self.torch
        B = batch.size
        lay = self.bag_layout(batch, self.columns)
        uniq, inverse = self.unique_inverse(lay.keys)  # [U], [N]
        E = torch.from_numpy(self.table.pull_unchecked(uniq, True)).requires_grad_(True)
        ids = self.one_key_bags(inverse, lay.offsets, B, uniq.shape[0])
        pooled = self.pool(E, ids, B, len(self.columns))  # [B, C*D]
        logit = self.model.forward_dense({"emb": pooled}, None)  # [B]
        y = torch.from_numpy(np.ascontiguousarray(batch.labels[:, 0]))
        per_row = self.bce(logit, y, reduction="none")  # [B]
        loss = 1.0 * per_row.sum() / float(B)  # train_step's term: head weight x sum / rows
        for group in self.opt.param_groups:
            for p in group["params"]:
                p.grad = None
        loss.backward()
        label = batch.labels[:, 0].astype(np.float64)
        ones = np.ones(B, np.float32)
        show, click = self.show_click(inverse, lay.rows, ones, label, uniq.shape[0])
        self.table.push_unchecked(uniq, E.grad.numpy(), show, click)
        self.opt.step()
        return float(loss.detach())


def micro_setup(steps: int, seed: int = 0) -> tuple[list, Any, HandStep, Any]:
    """Return ``(batches, train_step model, HandStep over its twin, dense-only step)``:
    the two models seeded alike, every row of the batches created in both."""
    import torch

    from compare_data import micro_batches
    from compare_impls import DenseImpl, TnrecImpl

    batches, _, base = micro_batches("micro", steps, 0, seed=seed)
    impls = []
    for _ in range(2):
        torch.manual_seed(seed)
        impl = TnrecImpl("micro")
        impl.prefill(base)
        impls.append(impl)
    torch.manual_seed(seed)
    return batches, impls[0].model, HandStep(impls[1].model), DenseImpl("micro", batches[0])


def run(threads: int, repeats: int, steps: int, rows: int = 4096) -> dict[str, Any]:
    """Median ms a step of each line, per repeat, at ``threads`` torch threads, on the
    first ``rows`` rows of each batch."""
    import torch

    from tnrec.table.warmup import warm

    torch.set_num_threads(threads)
    warm()
    batches, model, hand, dense = micro_setup(steps)
    batches = [b.slice(0, min(rows, b.size)) for b in batches]
    runners = [model.train_step, hand, dense.train_step]
    for b in batches[:5]:  # untimed: every path's first calls
        for fn in runners:
            fn(b)
    times: dict[str, list[float]] = {line: [] for line in LINES}
    with MachineWatch() as watch:
        for _ in range(repeats):
            per: list[list[float]] = [[] for _ in LINES]
            for i, b in enumerate(batches):
                for k in range(len(LINES)):
                    j = (i + k) % len(LINES)  # rotate which step runs first
                    t0 = time.perf_counter()
                    runners[j](b)
                    per[j].append(time.perf_counter() - t0)
            for line, ts in zip(LINES, per, strict=True):
                times[line].append(1e3 * float(np.median(ts)))
    return {"times": times, "state": watch.state}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_run_args(p, "batches of 4096 a repeat")
    p.add_argument(
        "--rows", type=int, default=4096, help="rows of each batch stepped on (default all 4096)"
    )
    a = p.parse_args()
    if not 1 <= a.rows <= 4096:
        p.error(f"--rows must be in [1, 4096]; got {a.rows}")
    counts = [int(t) for t in a.threads.split(",")]
    results = {t: run(t, a.repeats, a.steps, a.rows) for t in counts}
    notes = check_runs([(f"threads {t}", r["state"]) for t, r in results.items()], a.strict)
    print(f"machine: {cpu_line()}; {a.steps} batches of {a.rows}, {a.repeats} repeats")
    print("ms a step, median (min-max) over the repeats; micro model, rows exist")
    rows = [(line, {t: r["times"][line] for t, r in results.items()}) for line in LINES]
    glue = {
        t: [s - h for s, h in zip(r["times"][LINES[0]], r["times"][LINES[1]], strict=True)]
        for t, r in results.items()
    }
    print_by_threads(counts, [*rows, ("train_step - by hand", glue)], 24)
    for t, r in results.items():
        print(f"threads {t}: {r['state'].summary()}")
    for line in notes:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
