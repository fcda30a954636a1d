"""The batcher runs small batches on the event loop and larger ones on its predict thread.

A real ModelSlot serving export ``a``; the Predictor's ``predict`` records the
thread each call ran on. The answers are the Predictor's either way.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from tnrec.serve.batcher import Batcher
from tnrec.serve.metrics import Metrics
from tnrec.serve.model import ModelSlot
from tnrec.serving import Predictor


def features(rows):
    return [{k: v for k, v in r.items() if k != "label"} for r in rows]


async def _serve(export: str, inline_rows: int, requests: list[list[dict]]) -> tuple:
    metrics = Metrics()
    slot = ModelSlot(metrics)
    slot.reload(export)
    predictor = slot.current.predictor
    threads: list[tuple[int, int]] = []  # (rows, thread id) of each Predictor call
    predict = predictor.predict

    def recording(rows):
        threads.append((len(rows), threading.get_ident()))
        return predict(rows)

    predictor.predict = recording
    batcher = Batcher(slot, metrics, max_batch=64, max_wait_ms=0.0, inline_rows=inline_rows)
    runner = asyncio.create_task(batcher.run())
    try:
        answers = []
        for rows in requests:  # one at a time: each batch is one request
            answers.append(await batcher.predict("rows", rows, len(rows)))
    finally:
        runner.cancel()
        batcher.close()
    return answers, threads, threading.get_ident()


@pytest.mark.parametrize(
    ("inline_rows", "on_loop"),
    [(16, [True, True, False]), (0, [False, False, False]), (64, [True, True, True])],
    ids=["default-16", "never", "all"],
)
def test_batches_up_to_inline_rows_run_on_the_event_loop(exports, inline_rows, on_loop):
    rows = features(exports["rows"])
    requests = [rows[:1], rows[1:17], rows[17:34]]  # 1, 16 and 17 rows
    answers, threads, loop_thread = asyncio.run(_serve(exports["a"], inline_rows, requests))
    assert [n for n, _ in threads] == [1, 16, 17]
    assert [t == loop_thread for _, t in threads] == on_loop
    want = Predictor(exports["a"])
    for req, (got, version) in zip(requests, answers, strict=True):
        np.testing.assert_array_equal(got, want.predict(req))
        assert version
