"""Property test: a SparseTable against a pure-Python dict model.

Hypothesis drives random sequences of pull (create or not), push, show_decay,
evict, generation and learning-rate changes, failing calls (unknown, duplicate
keys, non-finite gradients) and save/load round trips on a small table whose
keys come from a pool that includes 0, -1, INT64_MIN and INT64_MAX. After every
step every row (weights, optimizer state, show, click, unseen days, marker),
``len()`` and ``keys()`` must match the model.

The model holds float32 values computed the way the contract says (float64
arithmetic on the stored float32 values, rounded to float32 after each step);
initial vectors come from a second table with the same (seed, name,
initializer), which also checks that a key's initial vector does not depend on
creation order, deletion or reuse of rows.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.unit.keys import INT64_MAX, INT64_MIN
from tests.unit.table.table_common import ATOL, RTOL
from tnrec.errors import NonFiniteError, TableKeyError
from tnrec.table import (
    NUM_BUCKETS,
    SGD,
    AdaGrad,
    EvictionPolicy,
    SparseTable,
    bucket_of,
    normal,
    uniform,
    zeros,
)

KEY_POOL = [0, -1, 1, INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1, 2**32, -(2**40) + 3, 977]

EPSILON = 1e-8  # AdaGrad's
NAME, SEED = "prop", 3

INITIALIZERS = {"zeros": zeros, "normal": lambda: normal(0.5), "uniform": lambda: uniform(0.1)}

policies = st.one_of(
    st.builds(
        EvictionPolicy,
        show_decay_rate=st.sampled_from([0.5, 0.9, 0.98, 1.0]),
        show_threshold=st.sampled_from([None, 0.5, 1.0, 2.0]),
        max_unseen_days=st.sampled_from([None, 0, 1, 3]),
        combine=st.just("any"),
    ),
    st.builds(
        EvictionPolicy,
        show_decay_rate=st.sampled_from([0.5, 0.9]),
        show_threshold=st.sampled_from([0.5, 1.0, 2.0]),
        max_unseen_days=st.sampled_from([0, 1, 3]),
        combine=st.just("all"),
    ),
)
key_lists = st.lists(st.sampled_from(KEY_POOL), unique=True, max_size=6)
grad_values = st.floats(-4.0, 4.0, width=32)
# values on the policy's thresholds are frequent, so `<` vs `<=` in evict() shows up
stat_values = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.floats(0.0, 3.0, width=32))


@dataclass
class Row:
    w: np.ndarray  # float32[D]
    g2sum: np.float32
    show: np.float32
    click: np.float32
    unseen_days: int
    marker: int


def _f32(x: float | np.ndarray) -> np.float32 | np.ndarray:
    return np.float32(x) if np.ndim(x) == 0 else np.asarray(x, dtype=np.float32)


def _snapshot(table: SparseTable) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in table.rows().items()}


def _assert_rows_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


class TableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="tnrec-prop-"))
        self.table: SparseTable | None = None
        self.model: dict[int, Row] = {}
        self.generation = 0
        self.saves = 0

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ setup

    @initialize(
        dim=st.integers(2, 4),
        opt=st.sampled_from(["sgd", "adagrad"]),
        init=st.sampled_from(sorted(INITIALIZERS)),
        lr=st.sampled_from([0.01, 0.1, 0.5]),
        g2sum0=st.sampled_from([0.0, 0.25]),
        policy=policies,
        first_keys=st.lists(st.sampled_from(KEY_POOL), unique=True, min_size=1, max_size=8),
    )
    def setup(
        self,
        dim: int,
        opt: str,
        init: str,
        lr: float,
        g2sum0: float,
        policy: EvictionPolicy,
        first_keys: list[int],
    ) -> None:
        self.dim, self.opt, self.init, self.policy = dim, opt, init, policy
        self.g2sum0 = g2sum0
        self.lr = lr
        self.table = self._new_table()
        # Same (seed, name, initializer): the initial vector of every key, created once
        # in the order keys are first asked for, never deleted.
        self.oracle = SparseTable(
            dim, SGD(), name=NAME, initializer=INITIALIZERS[init](), seed=SEED
        )
        self.pull(first_keys, create=True)

    def _new_table(self) -> SparseTable:
        if self.opt == "sgd":
            optimizer: SGD | AdaGrad = SGD(learning_rate=self.lr)
        else:
            optimizer = AdaGrad(learning_rate=self.lr, initial_g2sum=self.g2sum0, epsilon=EPSILON)
        return SparseTable(
            self.dim,
            optimizer,
            name=NAME,
            initializer=INITIALIZERS[self.init](),
            seed=SEED,
            policy=self.policy,
        )

    def _initial_vector(self, key: int) -> np.ndarray:
        return self.oracle.pull(np.array([key], np.int64))[0]

    def _absent(self) -> list[int]:
        return [k for k in KEY_POOL if k not in self.model]

    # ------------------------------------------------------------------ pull

    @precondition(lambda self: self.table is not None)
    @rule(keys=key_lists, create=st.booleans())
    def pull(self, keys: list[int], create: bool) -> None:
        got = self.table.pull(np.array(keys, dtype=np.int64), create=create)
        assert got.dtype == np.float32
        assert got.shape == (len(keys), self.dim)
        for i, k in enumerate(keys):
            if k not in self.model and create:
                self.model[k] = Row(
                    w=self._initial_vector(k).copy(),
                    g2sum=_f32(self.g2sum0),
                    show=_f32(0.0),
                    click=_f32(0.0),
                    unseen_days=0,
                    marker=self.generation,
                )
            expected = self.model[k].w if k in self.model else np.zeros(self.dim, np.float32)
            np.testing.assert_allclose(got[i], expected, rtol=RTOL, atol=ATOL, err_msg=str(k))

    @precondition(lambda self: self.table is not None)
    @rule(keys=key_lists)
    def pull_and_create(self, keys: list[int]) -> None:
        # a second creating rule, so that tables are rarely empty
        self.pull(keys, create=True)

    # ------------------------------------------------------------------ push

    def _draw_present(self, data: st.DataObject) -> list[int]:
        return data.draw(
            st.lists(st.sampled_from(sorted(self.model)), unique=True, min_size=1, max_size=6),
            label="keys",
        )

    def _draw_grads(self, data: st.DataObject, n: int) -> np.ndarray:
        return data.draw(hnp.arrays(np.float32, (n, self.dim), elements=grad_values), label="g")

    @precondition(lambda self: self.table is not None and len(self.model) > 0)
    @rule(data=st.data())
    def push(self, data: st.DataObject) -> None:
        keys = self._draw_present(data)
        n = len(keys)
        grads = self._draw_grads(data, n)
        show = data.draw(hnp.arrays(np.float32, n, elements=stat_values), label="show")
        click = data.draw(hnp.arrays(np.float32, n, elements=stat_values), label="click")
        self.table.push(np.array(keys, dtype=np.int64), grads, show, click)
        lr = float(self.lr)
        for i, k in enumerate(keys):
            row = self.model[k]
            g = grads[i].astype(np.float64)  # [D]
            w = row.w.astype(np.float64)
            if self.opt == "sgd":
                w = w - lr * g
            else:
                g2sum = np.float64(row.g2sum) + float(np.sum(g * g)) / self.dim
                w = w - lr * g / (EPSILON + np.sqrt(g2sum))
                row.g2sum = _f32(g2sum)
            row.w = _f32(w)
            row.show = _f32(np.float64(row.show) + np.float64(show[i]))
            row.click = _f32(np.float64(row.click) + np.float64(click[i]))
            row.unseen_days = 0
            row.marker = self.generation

    @precondition(lambda self: self.table is not None)
    @rule(
        data=st.data(),
        kind=st.sampled_from(
            ["pull-duplicate", "push-duplicate", "push-unknown", "push-nan", "push-inf"]
        ),
    )
    def failing_call_changes_nothing(self, data: st.DataObject, kind: str) -> None:
        """Every refused call raises the documented error, naming the table, and changes nothing."""
        before = _snapshot(self.table)
        if kind == "pull-duplicate":
            keys = data.draw(st.lists(st.sampled_from(KEY_POOL), min_size=1, max_size=4))
            with pytest.raises(TableKeyError, match=NAME):
                self.table.pull(
                    np.array(keys + keys[:1], np.int64), create=data.draw(st.booleans())
                )
        else:
            present = sorted(self.model)
            if kind == "push-unknown" or not present:
                # 123_456_789 is outside KEY_POOL, hence never present
                unknown = data.draw(st.sampled_from([*self._absent(), 123_456_789]))
                keys = (
                    data.draw(st.lists(st.sampled_from(present), unique=True, max_size=3))
                    if present
                    else []
                )
                keys.insert(data.draw(st.integers(0, len(keys))), unknown)
                error: type[Exception] = TableKeyError
            else:
                keys = self._draw_present(data)
                if kind == "push-duplicate":
                    keys = keys + keys[-1:]
                    error = TableKeyError
                else:
                    error = NonFiniteError
            n = len(keys)
            grads = self._draw_grads(data, n)
            if kind in ("push-nan", "push-inf") and present:
                bad = np.nan if kind == "push-nan" else -np.inf
                grads[data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, self.dim - 1))] = (
                    bad
                )
            ones = np.ones(n, np.float32)
            with pytest.raises(error, match=NAME):
                self.table.push(np.array(keys, np.int64), grads, ones, ones)
        _assert_rows_identical(_snapshot(self.table), before)

    # ------------------------------------------------------------------ lifecycle

    @precondition(lambda self: self.table is not None)
    @rule(generation=st.integers(0, 5))
    def set_generation(self, generation: int) -> None:
        self.table.generation = generation
        self.generation = generation

    @precondition(lambda self: self.table is not None)
    @rule(lr=st.sampled_from([0.01, 0.1, 0.5, 2.0]))
    def set_learning_rate(self, lr: float) -> None:
        self.table.optimizer.learning_rate = lr
        self.lr = lr

    @precondition(lambda self: self.table is not None)
    @rule(days=st.integers(0, 3))
    def show_decay(self, days: int) -> None:
        self.table.show_decay(days)
        factor = float(self.policy.show_decay_rate) ** days
        for row in self.model.values():
            row.show = _f32(np.float64(row.show) * factor)
            row.click = _f32(np.float64(row.click) * factor)
            row.unseen_days += days

    def _is_evicted(self, row: Row) -> bool:
        p = self.policy
        tests = []
        if p.show_threshold is not None:
            tests.append(float(row.show) < p.show_threshold)
        if p.max_unseen_days is not None:
            tests.append(row.unseen_days > p.max_unseen_days)
        if not tests:
            return False
        return all(tests) if p.combine == "all" else any(tests)

    @precondition(lambda self: self.table is not None)
    @rule()
    def evict(self) -> None:
        victims = [k for k, row in self.model.items() if self._is_evicted(row)]
        assert self.table.evict() == len(victims)
        for k in victims:
            del self.model[k]

    # ------------------------------------------------------------------ files

    @precondition(lambda self: self.table is not None)
    @rule(fmt=st.sampled_from(["npy", "txt"]), same_dir=st.booleans())
    def save_and_load(self, fmt: str, same_dir: bool) -> None:
        if not same_dir:
            self.saves += 1
        path = str(self.tmp / f"save{self.saves}")  # same_dir: overwrite the last save
        self.table.save(path, storage=fmt)
        before = _snapshot(self.table)

        loaded = SparseTable.load(path)
        assert len(loaded) == len(self.model)
        np.testing.assert_array_equal(loaded.keys(), np.array(sorted(self.model), np.int64))
        _assert_rows_identical(loaded.rows(), before)

        # a subset by key predicate: the same rows, fewer of them
        part = SparseTable.load(path, key_filter=lambda k: k >= 0)
        expect = np.array(sorted(k for k in self.model if k >= 0), np.int64)
        np.testing.assert_array_equal(part.keys(), expect)
        _assert_rows_identical(part.rows(), self.table.rows(expect))

        # continue the sequence on a fresh table built with the same arguments
        fresh = self._new_table()
        assert fresh.load_rows(path) == len(self.model)
        fresh.generation = self.generation
        _assert_rows_identical(fresh.rows(), before)
        self.table = fresh

    @precondition(lambda self: self.table is not None)
    @rule(lo=st.integers(0, NUM_BUCKETS - 1), width=st.integers(1, NUM_BUCKETS))
    def save_range_and_load(self, lo: int, width: int) -> None:
        hi = min(NUM_BUCKETS, lo + width)
        self.saves += 1
        path = str(self.tmp / f"range{self.saves}")
        self.table.save_range(path, lo, hi)
        keys = np.array(sorted(self.model), np.int64)
        buckets = bucket_of(keys)
        expect = keys[(buckets >= lo) & (buckets < hi)]
        loaded = SparseTable.load(path)
        np.testing.assert_array_equal(loaded.keys(), expect)
        _assert_rows_identical(loaded.rows(), self.table.rows(expect))

    # ------------------------------------------------------------------ check

    @invariant()
    def table_matches_model(self) -> None:
        if self.table is None:
            return
        t, model = self.table, self.model
        keys = sorted(model)
        assert len(t) == len(model)
        got_keys = t.keys()
        assert got_keys.dtype == np.int64
        np.testing.assert_array_equal(got_keys, np.array(keys, np.int64))
        rows = t.rows()
        expected_names = {"keys", "weights", "show", "click", "unseen_days", "marker"}
        if self.opt == "adagrad":
            expected_names.add("g2sum")
        assert set(rows) == expected_names
        np.testing.assert_array_equal(rows["keys"], np.array(keys, np.int64))
        w = np.array([model[k].w for k in keys], np.float32).reshape(len(keys), self.dim)
        np.testing.assert_allclose(rows["weights"], w, rtol=RTOL, atol=ATOL, err_msg="weights")
        for name in ("show", "click") + (("g2sum",) if self.opt == "adagrad" else ()):
            expected = np.array([getattr(model[k], name) for k in keys], np.float32)
            assert rows[name].dtype == np.float32, name
            np.testing.assert_allclose(rows[name], expected, rtol=RTOL, err_msg=name)
        for name in ("unseen_days", "marker"):
            expected = np.array([getattr(model[k], name) for k in keys], np.int32)
            assert rows[name].dtype == np.int32, name
            np.testing.assert_array_equal(rows[name], expected, err_msg=name)
        # pull(create=False) reads every present key and creates nothing
        if keys:
            np.testing.assert_array_equal(
                t.pull(np.array(keys, np.int64), create=False), rows["weights"]
            )
        assert len(t) == len(model)


def test_table_matches_dict_model() -> None:
    run_state_machine_as_test(
        TableMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
