"""fit's input pipeline in dist_bench.py: per-phase times with and without it, and the share hidden.

Used by ``bench/dist_bench.py`` (``--no-pipeline`` skips it). On every worker,
the same model trains ``fit`` twice over the same lazily made batches, once
with ``pipeline=False`` and once with ``pipeline=True``. The phases are timed
where they run, by wrapping the functions that do them (bench only):

    read+hash  the data's ``next``: Zipf ids drawn and hashed (mix64) per column
    dedup      tnrec.prepare.prepare_batch: bag layouts and unique_inverse per table
    route      ShardedPS.route: key counts and keys all_to_all, owners' de-duplication (W > 1)
    pull       the rest of the pull: the owners' row gather and the rows' all_to_all
    push       Model.push
    compute    the rest of the step (forward, loss, backward, dense all-reduce and step)

Input = read+hash + dedup + route. Unpipelined, all of it is on the step's
path; pipelined, the input thread does it and the steps only wait
``model.input_seconds["wait"]`` for it: hidden = 1 - wait / input.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

PHASES = ("read+hash", "dedup", "route", "pull", "push", "compute")


class Clock:
    """Seconds per (phase, thread) of wrapped functions; nested phases are not counted twice."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = {}
        self._local = threading.local()

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kw: Any) -> Any:
            stack = getattr(self._local, "stack", None)
            if stack is None:
                stack = self._local.stack = []
            stack.append(0.0)  # time of phases nested in this one
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                took = time.perf_counter() - t0
                nested = stack.pop()
                self.add(phase, took - nested)
                if stack:
                    stack[-1] += took

        return timed

    def add(self, phase: str, secs: float) -> None:
        key = (phase, threading.current_thread().name)
        self.seconds[key] = self.seconds.get(key, 0.0) + secs

    def total(self, phase: str, thread: str | None = None) -> float:
        return sum(v for (p, t), v in self.seconds.items() if p == phase and thread in (None, t))


class LazyBatches:
    """Batches made (ids drawn, hashed) when taken: the read+hash phase of a reader."""

    def __init__(self, make: Callable[[int], Any], steps: int, clock: Clock) -> None:
        self.make, self.steps, self.clock = make, steps, clock

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.steps):
            t0 = time.perf_counter()
            batch = self.make(i)
            self.clock.add("read+hash", time.perf_counter() - t0)
            yield batch


def measure(model: Any, make: Callable[[int], Any], steps: int, pipeline: bool) -> dict[str, Any]:
    """Fit ``model`` one epoch of ``steps`` batches ``make(i)``; return ms a step per phase."""
    import tnrec.pipeline
    import tnrec.prepare
    from tnrec.ps import LocalPS, ShardedPS

    clock = Clock()
    patched = [
        (tnrec.prepare, "prepare_batch", "dedup"),
        (tnrec.pipeline, "prepare_batch", "dedup"),
        (ShardedPS, "route", "route"),
        (ShardedPS, "pull", "pull"),
        (LocalPS, "pull", "pull"),
        (type(model), "push", "push"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for owner, name, phase in patched:
        setattr(owner, name, clock.wrap(phase, getattr(owner, name)))
    try:
        start = time.perf_counter()
        model.fit(LazyBatches(make, steps, clock), verbose=0, pipeline=pipeline, log_every=0)
        total = time.perf_counter() - start
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    main = threading.main_thread().name
    ms = {p: 1000 * clock.total(p) / steps for p in PHASES if p != "compute"}
    on_path = {p: 1000 * clock.total(p, main) / steps for p in ("read+hash", "dedup", "route")}
    # the steps' wait for input: the pipeline's, or all of the input when it runs in the step
    wait = 1000 * model.input_seconds["wait"] / steps if pipeline else sum(on_path.values())
    step = 1000 * total / steps
    ms["compute"] = step - wait - ms["pull"] - ms["push"]
    inp = ms["read+hash"] + ms["dedup"] + ms["route"]
    return {
        "pipeline": pipeline,
        "step_ms": step,
        "phases_ms": ms,
        "input_ms": inp,
        "wait_ms": wait,
        "hidden": (1 - wait / inp) if pipeline and inp > 0 else 0.0,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """Print the phases of every (world, pipeline) run, rank 0's figures."""
    print()
    print("fit's input pipeline (rank 0, ms per step; input = read+hash + dedup + route)")
    head = f"{'W':>2} {'pipeline':>8} {'step':>7} " + " ".join(f"{p:>9}" for p in PHASES)
    print(head + f" {'input':>7} {'waited':>7} {'hidden':>7} {'speedup':>8}")
    base: dict[int, float] = {}
    for r in rows:
        w = r["world"]
        if not r["pipeline"]:
            base[w] = r["step_ms"]
        speed = f"{base[w] / r['step_ms']:.2f}x" if r["pipeline"] and w in base else "-"
        phases = " ".join(f"{r['phases_ms'][p]:>9.2f}" for p in PHASES)
        hidden = f"{100 * r['hidden']:.0f}%" if r["pipeline"] else "-"
        print(
            f"{w:>2} {'on' if r['pipeline'] else 'off':>8} {r['step_ms']:>7.1f} {phases} "
            f"{r['input_ms']:>7.2f} {r['wait_ms']:>7.2f} {hidden:>7} {speed:>8}"
        )
