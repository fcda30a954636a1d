"""Routing, de-duplication, the local PS and the launcher environment."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.keys import INT64_MAX, INT64_MIN
from tnrec.distribute import PsStrategy, launch_env
from tnrec.errors import ArgumentError, NonFiniteError
from tnrec.ps import LocalPS, owner_of, unique_inverse
from tnrec.table import SGD, SparseTable, bucket_of, threads

KEYS = np.array([0, 1, -1, INT64_MIN, INT64_MAX], dtype=np.int64)  # buckets 431 193 32 987 679


@pytest.fixture(autouse=True, scope="module")
def _unique_kernel_compiled():
    """Compile (or load) unique_inverse's kernel before hypothesis times its first example."""
    unique_inverse(np.arange(3, dtype=np.int64))


@pytest.mark.parametrize(
    ("world", "owners"),
    [
        pytest.param(1, [0, 0, 0, 0, 0], id="W1"),
        pytest.param(2, [1, 1, 0, 1, 1], id="W2"),
        pytest.param(3, [2, 1, 2, 0, 1], id="W3"),
        pytest.param(4, [3, 1, 0, 3, 3], id="W4"),
        pytest.param(5, [1, 3, 2, 2, 4], id="W5"),
    ],
)
def test_owner_is_pinned(world, owners):
    assert owner_of(KEYS, world).tolist() == owners


@given(st.lists(st.integers(INT64_MIN, INT64_MAX), max_size=40), st.integers(1, 64))
def test_owner_is_bucket_mod_world(values, world):
    keys = np.array(values, dtype=np.int64)
    np.testing.assert_array_equal(owner_of(keys, world), bucket_of(keys) % world)


@given(st.lists(st.integers(-5, 5) | st.sampled_from([INT64_MIN, INT64_MAX]), max_size=60))
def test_unique_inverse_round_trip_keeps_first_occurrence_order(values):
    keys = np.array(values, dtype=np.int64)
    uniq, inverse = unique_inverse(keys)
    np.testing.assert_array_equal(uniq[inverse], keys)
    assert len(set(uniq.tolist())) == uniq.shape[0] == len(set(values))
    first = list(dict.fromkeys(values))
    assert uniq.tolist() == first


def test_unique_inverse_of_a_big_batch_matches_numpy():
    rng = np.random.default_rng(8)
    keys = rng.integers(-(1 << 62), 1 << 62, 30_000)[rng.integers(0, 30_000, 200_000)]
    keys[:3] = [0, -1, 0]  # 0 and -1 are ordinary keys
    uniq, inverse = unique_inverse(keys)
    np.testing.assert_array_equal(uniq[inverse], keys)
    vals, first = np.unique(keys, return_index=True)
    np.testing.assert_array_equal(uniq, keys[np.sort(first)])  # first-occurrence order
    assert uniq.shape[0] == vals.shape[0]


@pytest.mark.parametrize("n", [1, 15, 16, 17, 63, 64, 65, 130])
def test_unique_inverse_around_its_prefetch_distance_and_ring(n):
    """Key i + 16 is hashed ahead into a ring of 64 homes: every length near those edges."""
    keys = np.random.default_rng(n).integers(0, max(n // 3, 1), n) * 7919  # repeats, runs
    uniq, inverse = unique_inverse(keys)
    np.testing.assert_array_equal(uniq[inverse], keys)
    assert uniq.tolist() == list(dict.fromkeys(keys.tolist()))


def test_local_ps_refuses_non_finite_gradients_before_any_table_changes():
    a, b = SparseTable(2, SGD(), name="a"), SparseTable(2, SGD(), name="b")
    ps = LocalPS({"a": a, "b": b})
    k = {"a": np.array([1], np.int64), "b": np.array([2], np.int64)}
    ps.pull(k, create=True)
    before = a.rows()["weights"].copy()
    one = np.ones(1, np.float32)
    grads = {"a": np.ones((1, 2), np.float32), "b": np.full((1, 2), np.nan, np.float32)}
    with pytest.raises(NonFiniteError, match='Table "b": the step produced a NaN'):
        ps.push(k, grads, {"a": one, "b": one}, {"a": one, "b": one})
    np.testing.assert_array_equal(a.rows()["weights"], before)


def test_launch_env_reads_the_launcher_variables():
    env = launch_env(
        {
            "RANK": "2",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.master_port) == (2, 4, 0, "29500")
    assert env.local_world_size == 2
    assert (launch_env({}).world_size, launch_env({}).local_world_size) == (1, 1)
    with pytest.raises(ArgumentError, match="Environment variable LOCAL_WORLD_SIZE must be an int"):
        launch_env({"LOCAL_WORLD_SIZE": "2x"})
    with pytest.raises(ArgumentError, match="LOCAL_WORLD_SIZE must be >= 1. Received: 0"):
        launch_env({"LOCAL_WORLD_SIZE": "0"})
    with pytest.raises(ArgumentError, match="Environment variable WORLD_SIZE must be an int"):
        launch_env({"WORLD_SIZE": "two"})
    with pytest.raises(ArgumentError, match=r"RANK must be in \[0, WORLD_SIZE\)"):
        launch_env({"RANK": "4", "WORLD_SIZE": "4"})


def test_the_strategy_tells_the_tables_how_many_workers_share_the_machine(monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert threads.get_local_workers() == 1  # no strategy: alone on the machine
    strategy = PsStrategy()
    try:
        assert threads.get_local_workers() == 3
    finally:
        strategy.shutdown()
    assert threads.get_local_workers() == 1
