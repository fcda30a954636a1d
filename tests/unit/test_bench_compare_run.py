"""bench/compare_run.py: the alternating step timings, on the micro model's small data."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from compare_data import micro_batches  # noqa: E402
from compare_impls import TnrecImpl  # noqa: E402
from compare_run import alternating, alternating_fit  # noqa: E402


class CountingDense:
    """Stands for the dense-only runner: records the batches it is handed, in order."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def train_step(self, batch: object) -> None:
        self.seen.append(id(batch))


def _check(out: dict[str, float]) -> None:
    assert set(out) == {"tnrec", "dense", "ratio"}
    assert out["tnrec"] > 0 and out["dense"] > 0
    assert np.isclose(out["ratio"], out["tnrec"] / out["dense"])


def test_alternating_fit_takes_every_step_through_fit_beside_one_dense_step_each():
    train, _, _ = micro_batches("micro", 4, 0)
    impl = TnrecImpl("micro")
    dense = CountingDense()
    out = alternating_fit(impl.model, dense, train)
    _check(out)
    assert dense.seen == [id(b) for b in train]  # the dense step saw each step's own batch
    assert impl.model.global_step == len(train)  # fit took every batch
    assert len(impl.model.tables["emb"]) > 0  # and trained the table


def test_alternating_fit_without_the_pipeline_trains_the_same_bits_in_the_loop():
    train, _, _ = micro_batches("micro", 3, 0)
    torch.manual_seed(0)
    piped = TnrecImpl("micro")
    torch.manual_seed(0)
    plain = TnrecImpl("micro")
    dense = CountingDense()
    _check(alternating_fit(piped.model, CountingDense(), train, pipeline=True))
    _check(alternating_fit(plain.model, dense, train, pipeline=False))
    assert (piped.model.fit_pipelined, plain.model.fit_pipelined) == (True, False)
    assert dense.seen == [id(b) for b in train]
    keys = np.sort(plain.model.tables["emb"].keys())
    np.testing.assert_array_equal(np.sort(piped.model.tables["emb"].keys()), keys)
    np.testing.assert_array_equal(
        piped.model.tables["emb"].pull(keys, create=False),
        plain.model.tables["emb"].pull(keys, create=False),
    )


def test_alternating_fit_matches_the_train_step_loop_bit_for_bit():
    train, _, _ = micro_batches("micro", 3, 0)
    torch.manual_seed(0)  # as run_one: the dense layer's and the table's start
    fitted = TnrecImpl("micro")
    torch.manual_seed(0)
    stepped = TnrecImpl("micro")
    alternating_fit(fitted.model, CountingDense(), train)
    alternating(stepped, CountingDense(), train)
    keys = stepped.model.tables["emb"].keys()
    np.testing.assert_array_equal(np.sort(fitted.model.tables["emb"].keys()), np.sort(keys))
    np.testing.assert_array_equal(
        fitted.model.tables["emb"].pull(keys, create=False),
        stepped.model.tables["emb"].pull(keys, create=False),
    )
