"""One run of ``bench/compare.py``: one model, one implementation, one repeat, in this process.

:func:`run_one` trains for one pass, times every step after the warm-up,
scores the held-out split and reads the process's RSS; with ``--split`` it
also times tnrec's step part by part, and against the dense-only step as a
whole and part by part.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from compare_data import B, deepfm_batches, micro_batches
from compare_impls import DenseImpl, FixedTables, PlainImpl, TnrecImpl, TorchrecImpl


def _rss_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def collision_rate(fixed: FixedTables, batches: list) -> float:
    """Share of distinct keys that share their fixed-table row with another distinct key."""
    shared = total = 0
    for c, name in enumerate(fixed.cols):
        keys = np.unique(np.concatenate([b.sparse[name].keys for b in batches]))
        rows = keys.view(np.uint64) % np.uint64(fixed.rows[c])
        _, inv, counts = np.unique(rows, return_inverse=True, return_counts=True)
        shared += int((counts[inv] > 1).sum())
        total += keys.shape[0]
    return shared / max(total, 1)


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """Train one implementation for one pass in this process; return its figures."""
    import torch

    torch.set_num_threads(args.threads)
    # Repeat r seeds torch with r in every implementation: a run is reproducible,
    # and within a repeat the dense layers (built first, in the same order) start equal.
    torch.manual_seed(args.seed)
    from tnrec.metrics import exact_auc

    if args.model == "deepfm":
        train, test = deepfm_batches(Path(args.data))
    else:
        train, test, base_keys = micro_batches(args.model, args.steps, args.test_steps)
    rss_data = _rss_mib("VmRSS")
    res: dict[str, Any] = {"model": args.model, "impl": args.impl}
    if args.impl == "tnrec":
        impl: Any = TnrecImpl(args.model)
        if args.model != "deepfm":
            # TorchRec and plain start with every row allocated; tnrec starts with
            # the base ids' rows (zipf: the 5% never-seen ids are created in the step).
            t0 = time.perf_counter()
            impl.prefill(base_keys)
            res["prefill_s"] = time.perf_counter() - t0
    elif args.impl == "torchrec":
        impl = TorchrecImpl(args.model, train[0])
        res["collision_rate"] = collision_rate(impl.fixed, train + test)
    elif args.impl == "plain":
        impl = PlainImpl(args.model, train[0])
        res["collision_rate"] = collision_rate(impl.fixed, train + test)
    else:
        impl = DenseImpl(args.model, train[0])
    times = []
    for b in train:
        if args.impl in ("torchrec", "plain"):
            impl.inputs(b)  # index hashing outside the timed step (tnrec's keys come hashed)
        t0 = time.perf_counter()
        impl.train_step(b)
        times.append(time.perf_counter() - t0)
        if args.impl in ("torchrec", "plain"):
            impl.forget(b)
    timed = times[args.warmup :]
    res["samples_per_s"] = B * len(timed) / sum(timed)
    res["step_ms_median"] = 1e3 * float(np.median(timed))
    if args.impl != "dense":
        y = np.concatenate([b.labels[:, 0] for b in test])
        p = np.concatenate([impl.predict(b) for b in test])
        res["auc"] = exact_auc(y, p)
    res["rss_after_data_mib"] = rss_data
    res["peak_rss_mib"] = _rss_mib("VmHWM")  # before the split's second model
    if args.impl == "tnrec" and args.split:
        res["split_ms"] = tnrec_split(impl.model, train[-args.split_steps :])
        fresh = TnrecImpl(args.model)  # a first pass again: new keys get their rows created
        if args.model != "deepfm":
            fresh.prefill(base_keys)
        dense = DenseImpl(args.model, train[0])
        res["alternating_ms"] = alternating(fresh, dense, train)
        # the same batches again: every key has its row (no row created, no new memory)
        res["alternating_again_ms"] = alternating(fresh, dense, train)
        # and a third time, part by part: where the step's time over the dense-only goes
        res["alternating_parts_ms"] = alternating_parts(fresh, dense, train)
        # what users run: fit, with its input pipeline (layouts and de-duplication of
        # the next batch in a background thread) and without, each a fresh model and then a
        # second pass; the passes in the order on, off, off, on, so a drift of the machine's
        # speed over the four passes weighs on both alike
        fits = {}
        for pipeline in (True, False):
            fits[pipeline] = TnrecImpl(args.model)
            if args.model != "deepfm":
                fits[pipeline].prefill(base_keys)
        for key, pipeline in (
            ("alternating_fit_ms", True),
            ("alternating_fit_nopipe_ms", False),
            ("alternating_fit_nopipe_again_ms", False),
            ("alternating_fit_again_ms", True),
        ):
            res[key] = alternating_fit(fits[pipeline].model, dense, train, pipeline=pipeline)
    return res


def _medians(times: dict[str, list[float]]) -> dict[str, float]:
    """Median ms of each side's steps after the first, and tnrec's over the dense-only's."""
    out = {k: 1e3 * float(np.median(v[1:])) for k, v in times.items()}
    out["ratio"] = out["tnrec"] / out["dense"]
    return out


def alternating(impl: Any, dense: Any, batches: list) -> dict[str, float]:
    """Median ms of tnrec's step and the dense-only step, run alternately in one process.

    Two processes run back to back still see different load on a shared
    machine (their ratio swung 0.73-1.47 between repeats); steps alternating in
    one process see the same, so their ratio is the steadier overhead figure.
    """
    times: dict[str, list[float]] = {"tnrec": [], "dense": []}
    for i, b in enumerate(batches):
        order = [("tnrec", impl), ("dense", dense)]
        for name, runner in order if i % 2 else order[::-1]:
            t0 = time.perf_counter()
            runner.train_step(b)
            times[name].append(time.perf_counter() - t0)
    return _medians(times)


def alternating_fit(
    model: Any, dense: Any, batches: list, pipeline: bool = True
) -> dict[str, float]:
    """Like :func:`alternating`, with tnrec's steps taken by ``model.fit(pipeline=pipeline)``.

    A callback times each tnrec step from ``on_train_batch_begin`` to
    ``on_train_batch_end`` (the wait for the pipeline's prepared batch and the
    whole ``train_step``) and, before taking the time, waits until the input
    thread has prepared the next batch (``model.input_pipeline.wait_answered``):
    that work is the step's, and in ``fit`` the next step would wait for it.
    Then it runs the dense-only step, so the input thread is idle while that
    runs (``fit`` asks for the next batch before ``on_train_batch_begin``: a
    dense step there would share the cores with the input thread). With
    ``False`` each step prepares its own batch.
    """
    import tnrec as tn

    times: dict[str, list[float]] = {"tnrec": [], "dense": []}

    class Alternate(tn.callbacks.Callback):
        def __init__(self) -> None:
            self.t0 = 0.0

        def on_train_batch_begin(self, step: int, logs: Any = None) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, step: int, logs: Any = None) -> None:
            pipe = self.model.input_pipeline
            if pipe is not None:
                pipe.wait_answered()
            times["tnrec"].append(time.perf_counter() - self.t0)
            t0 = time.perf_counter()
            dense.train_step(batches[step - 1])
            times["dense"].append(time.perf_counter() - t0)

    model.fit(batches, callbacks=[Alternate()], verbose=0, pipeline=pipeline)
    return _medians(times)


#: The parts of a step :func:`tnrec_parts` times, in order; the dense-only step has the
#: last three (:meth:`compare_impls.DenseImpl.timed_step`).
PARTS = ("pull", "forward", "backward", "push", "dense_opt")


def tnrec_parts(model: Any, batch: Any) -> dict[str, float]:
    """One training step of ``model`` by the calls of ``Model.train_step`` (without its
    finiteness checks); return the seconds of each of :data:`PARTS`."""
    opt = model.optimizer
    t0 = time.perf_counter()
    model.pull(batch)
    t1 = time.perf_counter()
    loss, _ = model.compute_loss(batch, model(batch), norm=float(batch.size))
    t2 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    t3 = time.perf_counter()
    model.push()
    t4 = time.perf_counter()
    opt.step()
    t5 = time.perf_counter()
    return dict(zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True))


def tnrec_split(model: Any, batches: list) -> dict[str, float]:
    """Median ms per part of a tnrec step (the same calls as ``Model.train_step``)."""
    import torch

    from tnrec.ps import unique_inverse

    parts: dict[str, list[float]] = {k: [] for k in ("dedup", *PARTS, "step")}
    for b in batches:
        keys = np.concatenate([j.keys for j in b.sparse.values()])
        t0 = time.perf_counter()
        unique_inverse(keys)
        parts["dedup"].append(time.perf_counter() - t0)
        step = tnrec_parts(model, b)
        torch.set_num_threads(torch.get_num_threads())
        for k, v in step.items():
            parts[k].append(v)
        parts["step"].append(sum(step.values()))
    return {k: 1e3 * float(np.median(v)) for k, v in parts.items()}


def alternating_parts(impl: Any, dense: Any, batches: list) -> dict[str, dict[str, float]]:
    """Median ms of each part of tnrec's step (:func:`tnrec_parts`) and of the dense-only
    step (``dense.timed_step``), the two run alternately in one process as in
    :func:`alternating`; where the step's time over the dense-only step goes.

    Returns ``{"tnrec": {part: ms}, "dense": {part: ms}, "excess": {part: ms}}``
    over :data:`PARTS` and ``"step"`` (the median of each step's sum of its parts, so
    the parts' medians need not add up to it); the dense-only step has no pull and no
    push (0), ``excess`` is tnrec's minus the dense-only's, part by part.
    """
    times: dict[str, list[dict[str, float]]] = {"tnrec": [], "dense": []}
    runners = [("tnrec", lambda b: tnrec_parts(impl.model, b)), ("dense", dense.timed_step)]
    for i, b in enumerate(batches):
        for name, run in runners if i % 2 else runners[::-1]:
            times[name].append(run(b))
    out: dict[str, dict[str, float]] = {}
    for name, steps in times.items():
        med = {k: 1e3 * float(np.median([s.get(k, 0.0) for s in steps[1:]])) for k in PARTS}
        med["step"] = 1e3 * float(np.median([sum(s.values()) for s in steps[1:]]))
        out[name] = med
    out["excess"] = {k: out["tnrec"][k] - out["dense"][k] for k in (*PARTS, "step")}
    return out
