"""LocalPS pulls some tables in a second thread while it pulls the others: the same bits."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from tests.unit.checkpoint import ckpt_common as cc
from tnrec.ps import LocalPS
from tnrec.ps import local as lps
from tnrec.table import SGD, AdaGrad, MemoryBudget, SparseTable
from tnrec.table import threads as table_threads


def make_ps() -> LocalPS:
    return LocalPS(
        {
            "a": SparseTable(8, AdaGrad(0.1), name="a", seed=1),
            "b": SparseTable(1, SGD(0.5), name="b", seed=2),
            "c": SparseTable(4, AdaGrad(0.2), name="c", seed=3),
        }
    )


def steps(seed: int = 0):
    """Three steps of unique keys per table: new keys, seen ones, and a table left empty."""
    rng = np.random.default_rng(seed)
    for i in range(3):
        keys = {
            "a": np.unique(rng.integers(0, 300, 200)),
            "b": np.unique(rng.integers(0, 50, 40)),
            "c": np.zeros(0, np.int64) if i == 1 else np.unique(rng.integers(0, 90, 70)),
        }
        yield {n: k.astype(np.int64) for n, k in keys.items()}


def run(monkeypatch, beside: bool):
    monkeypatch.setattr(lps, "PULL_TABLES_BESIDE", beside)
    ps, pulled = make_ps(), []
    for keys in steps():
        rows = ps.pull(keys, create=True, stats=("b",))
        assert list(rows) == list(keys)  # the tables in the caller's order
        pulled.append(rows)
        grads = {n: np.full_like(r[:, : ps.tables[n].dim], 0.25) for n, r in rows.items()}
        ones = {n: np.ones(k.shape[0], np.float32) for n, k in keys.items()}
        ps.push(keys, grads, ones, ones)
    return ps, pulled


def test_pulling_tables_beside_gives_the_same_rows_and_tables(monkeypatch):
    (ps1, one), (ps2, two) = run(monkeypatch, False), run(monkeypatch, True)
    for r1, r2 in zip(one, two, strict=True):
        for name in r1:
            np.testing.assert_array_equal(r1[name], r2[name])
    assert one[0]["b"].shape[1] == 1 + 2  # the stats columns came with the side table's rows
    for name, t in ps1.tables.items():
        a, b = t.rows(), ps2.tables[name].rows()
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_the_side_share_balances_keys_and_keeps_the_largest_table_here(monkeypatch):
    monkeypatch.setattr(lps, "PULL_TABLES_BESIDE", True)
    ps = LocalPS({n: SparseTable(2, SGD(), name=n) for n in "abcd"})
    keys = {n: np.arange(k, dtype=np.int64) for n, k in zip("abcd", (100, 70, 40, 0), strict=True)}
    assert ps._side_share(keys) == ["b", "c"]  # here: a (100); there: b, c (110); d empty
    keys["d"] = np.arange(35, dtype=np.int64)
    assert ps._side_share(keys) == ["b", "c"]  # d joins a here: 135 against 110
    assert ps._side_share({"a": keys["a"], "d": keys["d"][:0]}) == []  # one table with keys
    monkeypatch.setattr(lps, "PULL_TABLES_BESIDE", False)
    assert ps._side_share(keys) == []


def test_a_memory_budget_keeps_every_pull_in_this_thread(monkeypatch):
    monkeypatch.setattr(lps, "PULL_TABLES_BESIDE", True)
    ps = make_ps()
    MemoryBudget(1 << 30).attach(ps.tables["c"])  # its check sums every table it covers
    keys = next(steps())
    assert ps._side_share(keys) == []


@pytest.mark.parametrize(
    ("cpus", "side_keys", "want"),
    [
        pytest.param(2, lps.BESIDE_MIN_KEYS, ["b"], id="core-free-enough-keys"),
        pytest.param(2, lps.BESIDE_MIN_KEYS - 1, [], id="too-few-keys"),
        pytest.param(1, lps.BESIDE_MIN_KEYS, [], id="no-core-free"),
    ],
)
def test_the_default_rule(monkeypatch, cpus, side_keys, want):
    monkeypatch.setattr(lps, "PULL_TABLES_BESIDE", None)
    monkeypatch.setattr(table_threads, "cpus_per_worker", lambda: cpus)
    monkeypatch.setattr(table_threads, "get_num_threads", lambda: 1)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ps = LocalPS({n: SparseTable(2, SGD(), name=n) for n in "ab"})
        keys = {"a": np.arange(side_keys + 5), "b": np.arange(side_keys)}
        assert ps._side_share(keys) == want
    finally:
        torch.set_num_threads(before)


def test_an_error_in_either_thread_is_raised_after_both_pulls_ended(monkeypatch):
    monkeypatch.setattr(lps, "PULL_TABLES_BESIDE", True)
    ps = make_ps()
    keys = next(steps())
    side = ps._side_share(keys)
    here = next(n for n in keys if n not in side and keys[n].shape[0])
    finished = threading.Event()

    def failing(k, create=True):
        raise RuntimeError("pull failed")

    def slow_ok(k, create=True, _real=ps.tables[side[0]].pull_unchecked):
        out = _real(k, create)
        finished.wait(0.2)  # still pulling when this thread's table has failed
        finished.set()
        return out

    monkeypatch.setattr(ps.tables[here], "pull_unchecked", failing)
    monkeypatch.setattr(ps.tables[side[0]], "pull_unchecked", slow_ok)
    with pytest.raises(RuntimeError, match="pull failed"):
        ps.pull(keys, create=True)
    assert finished.is_set()  # the side pull had ended when the error reached the caller
    monkeypatch.undo()
    monkeypatch.setattr(lps, "PULL_TABLES_BESIDE", True)
    monkeypatch.setattr(ps.tables[side[0]], "pull_unchecked", failing)
    with pytest.raises(RuntimeError, match="pull failed"):  # raised by the side thread
        ps.pull(keys, create=True)


def test_a_model_trains_to_the_same_bits_with_its_tables_pulled_beside(tmp_path, monkeypatch):
    day = cc.write_day(str(tmp_path), 0, rows=200)
    snaps = []
    for beside in (False, True):
        monkeypatch.setattr(lps, "PULL_TABLES_BESIDE", beside)
        model = cc.build()
        model.fit(cc.reader(day), epochs=2, verbose=0)
        snaps.append(cc.snapshot(model))
    cc.assert_same(snaps[0], snaps[1], skip=())
