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
from compare_impls import DenseImpl, TnrecImpl  # noqa: E402
from compare_report import _fmt_parts  # noqa: E402
from compare_run import PARTS, alternating, alternating_fit, alternating_parts  # noqa: E402


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


def _twins() -> tuple[TnrecImpl, TnrecImpl]:
    """Two micro models seeded alike, as run_one seeds them: the same dense layer and table."""
    torch.manual_seed(0)
    a = TnrecImpl("micro")
    torch.manual_seed(0)
    return a, TnrecImpl("micro")


def _same_table(a: TnrecImpl, b: TnrecImpl) -> None:
    """The two models' tables hold the same keys with the same rows, bit for bit."""
    keys = b.model.tables["emb"].keys()
    np.testing.assert_array_equal(np.sort(a.model.tables["emb"].keys()), np.sort(keys))
    np.testing.assert_array_equal(
        a.model.tables["emb"].pull(keys, create=False),
        b.model.tables["emb"].pull(keys, create=False),
    )


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
    piped, plain = _twins()
    dense = CountingDense()
    _check(alternating_fit(piped.model, CountingDense(), train, pipeline=True))
    _check(alternating_fit(plain.model, dense, train, pipeline=False))
    assert (piped.model.fit_pipelined, plain.model.fit_pipelined) == (True, False)
    assert dense.seen == [id(b) for b in train]
    _same_table(piped, plain)


def test_alternating_fit_matches_the_train_step_loop_bit_for_bit():
    train, _, _ = micro_batches("micro", 3, 0)
    fitted, stepped = _twins()
    alternating_fit(fitted.model, CountingDense(), train)
    alternating(stepped, CountingDense(), train)
    _same_table(fitted, stepped)


class TimedDense(CountingDense):
    """A dense-only runner whose parts take known times: forward 1 ms, backward 2, optimizer 3."""

    def timed_step(self, batch: object) -> dict[str, float]:
        self.seen.append(id(batch))
        return {"forward": 1e-3, "backward": 2e-3, "dense_opt": 3e-3}


def test_alternating_parts_times_each_part_beside_the_dense_step_and_trains_the_same_bits():
    train, _, _ = micro_batches("micro", 4, 0)
    parted, stepped = _twins()
    dense = TimedDense()
    out = alternating_parts(parted, dense, train)
    alternating(stepped, CountingDense(), train)
    assert dense.seen == [id(b) for b in train]
    assert set(out) == {"tnrec", "dense", "excess"}
    for side in out.values():
        assert list(side) == [*PARTS, "step"]
    assert out["dense"] == {"pull": 0.0, "forward": 1.0, "backward": 2.0, "push": 0.0,
                            "dense_opt": 3.0, "step": 6.0}  # fmt: skip
    assert all(out["tnrec"][k] > 0 for k in PARTS)
    for k in (*PARTS, "step"):
        assert np.isclose(out["excess"][k], out["tnrec"][k] - out["dense"][k])
    # the parts are the calls of train_step: the table ends as a train_step loop leaves it
    _same_table(parted, stepped)
    line = _fmt_parts([out])
    assert "pull " in line and " / - (+" in line and "forward " in line


def test_dense_only_timed_step_returns_its_three_parts_and_steps_the_optimizer():
    train, _, _ = micro_batches("micro", 2, 0)
    dense = DenseImpl("micro", train[0])
    before = [p.detach().clone() for p in dense.head.parameters()]
    parts = dense.timed_step(train[0])
    assert list(parts) == ["forward", "backward", "dense_opt"]
    assert all(v > 0 for v in parts.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, dense.head.parameters(), strict=True))
