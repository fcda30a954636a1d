"""ShardedPS.push checks that it pushes the keys of the pull it follows.

One worker over a loopback comm (every all_to_all returns what it sends), so
the sharded code path runs in one process; the multi-process tests run it on
real process groups.
"""

import numpy as np
import pytest

from tests.unit.ps.loopback import LoopbackComm
from tnrec.errors import ArgumentError
from tnrec.ps import LocalPS, ShardedPS
from tnrec.table import SGD, SparseTable


def make_tables():
    return {
        "user": SparseTable(2, SGD(0.5), name="user"),
        "item": SparseTable(3, SGD(0.5), name="item"),
    }


KEYS = {"user": np.array([7, 3, 11], np.int64), "item": np.array([5], np.int64)}


def step(keys):
    """Gradients of ones and show 1 / click 0 for every key of ``keys``."""
    grads = {n: np.ones((k.shape[0], 3 if n == "item" else 2), np.float32) for n, k in keys.items()}
    show = {n: np.ones(k.shape[0], np.float32) for n, k in keys.items()}
    click = {n: np.zeros(k.shape[0], np.float32) for n, k in keys.items()}
    return grads, show, click


@pytest.fixture
def ps():
    return ShardedPS(make_tables(), LoopbackComm())


@pytest.mark.parametrize(
    "same", [pytest.param(True, id="the-pulled-arrays"), pytest.param(False, id="equal-copies")]
)
def test_push_of_the_pulled_keys_updates_like_the_local_ps(ps, same):
    local = LocalPS(make_tables())
    rows = ps.pull(KEYS, create=True)
    np.testing.assert_array_equal(rows["user"], local.pull(KEYS, create=True)["user"])
    keys = KEYS if same else {n: k.copy() for n, k in KEYS.items()}
    ps.push(keys, *step(KEYS))
    local.push(KEYS, *step(KEYS))
    for name in KEYS:
        np.testing.assert_array_equal(
            ps.tables[name].pull(KEYS[name], create=False),
            local.tables[name].pull(KEYS[name], create=False),
        )
        np.testing.assert_allclose(
            ps.tables[name].pull(KEYS[name], create=False), rows[name] - 0.5, rtol=1e-6
        )


@pytest.mark.parametrize(
    ("user_keys", "got"),
    [
        pytest.param([3, 7, 11], 3, id="reordered"),
        pytest.param([7, 3], 2, id="fewer"),
        pytest.param([7, 3, 11, 12], 4, id="more"),
        pytest.param([7, 3, 12], 3, id="another-key"),
    ],
)
def test_push_of_other_keys_than_the_pull_names_the_table_and_changes_nothing(ps, user_keys, got):
    ps.pull(KEYS, create=True)
    before = {n: t.records()[1].copy() for n, t in ps.tables.items()}
    keys = {"user": np.array(user_keys, np.int64), "item": KEYS["item"]}
    with pytest.raises(
        ArgumentError,
        match=rf'Table "user" \(rank 0\): push got {got} key\(s\) that are not the 3 key\(s\) '
        "of the preceding pull, in its order",
    ):
        ps.push(keys, *step(keys))
    for n, t in ps.tables.items():
        np.testing.assert_array_equal(t.records()[1], before[n])


def test_a_table_left_out_of_the_push_is_not_pushed_and_an_unknown_table_raises(ps):
    ps.pull(KEYS, create=True)
    before = ps.tables["item"].records()[1].copy()
    only_user = {"user": KEYS["user"]}
    ps.push(only_user, *step(only_user))
    np.testing.assert_array_equal(ps.tables["item"].records()[1], before)
    ps.pull(KEYS, create=True)
    extra = {**KEYS, "ad": np.array([1], np.int64)}
    with pytest.raises(ArgumentError, match=r"tables that were not pulled: \['ad'\]"):
        ps.push(extra, *step(extra))


def test_a_table_left_out_of_both_pull_and_push_is_fine(ps):
    keys = {"user": KEYS["user"]}
    ps.pull(keys, create=True)
    ps.push(keys, *step(keys))
    assert len(ps.tables["item"]) == 0
    np.testing.assert_allclose(
        ps.tables["user"].pull(KEYS["user"], create=False)
        - SparseTable(2, SGD(0.5), name="user").pull(KEYS["user"]),
        -0.5,
        rtol=1e-6,
    )


def test_push_before_any_pull(ps):
    with pytest.raises(ArgumentError, match=r"ShardedPS.push \(rank 0\): no pull came before"):
        ps.push(KEYS, *step(KEYS))


@pytest.mark.parametrize("kind", ["sharded", "local"])
def test_pull_with_stats_returns_show_and_click_and_push_applies_only_active_keys(kind):
    ps = ShardedPS(make_tables(), LoopbackComm()) if kind == "sharded" else LocalPS(make_tables())
    rows = ps.pull(KEYS, create=True)
    grads, show, click = step(KEYS)
    click["user"] = np.float32([1, 0, 2])
    on = {"user": np.array([True, False, True])}
    ps.push(KEYS, grads, show, click, on)
    got = ps.pull({**KEYS, "user": np.array([7, 3, 11, 99], np.int64)}, False, ["user"])
    assert got["user"].shape == (4, 4) and got["item"].shape == (1, 3)
    # key 3 was not marked: its row and statistics are unchanged; 99 is unknown: zeros
    np.testing.assert_allclose(got["user"][:3, :2], rows["user"] - [[0.5], [0], [0.5]], rtol=1e-6)
    np.testing.assert_array_equal(got["user"][:, 2:], [[1, 1], [0, 0], [1, 2], [0, 0]])
    np.testing.assert_array_equal(got["user"][3], 0.0)
    np.testing.assert_allclose(got["item"], rows["item"] - 0.5, rtol=1e-6)  # no mask: pushed
    assert ps.tables["user"].rows(np.array([3], np.int64))["marker"][0] == 0
