"""The step's pull and push on torch's OpenMP team: the same table as on Python threads.

``MIN_SLICE`` (the Python threads' and the team's) is lowered so that batches
of a few hundred keys (the calls of ``test_threads``) run in two slices;
``TNREC_TABLE_TEAM=1`` runs them on the
team, ``0`` on the Python threads, and the tables must come out the same bit
for bit.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from tests.unit.table.test_region_insert import _mixed_pulls, _occupied, _small_thresholds
from tests.unit.table.test_threads import _run
from tnrec.errors import TableKeyError
from tnrec.table import SGD, AdaGrad, Adam, Ftrl, SparseTable, team, threads

openmp = "ATen parallel backend: OpenMP" in torch.__config__.parallel_info()
needs_team = pytest.mark.skipif(
    not (openmp and sys.platform.startswith("linux")),
    reason="the team is torch's OpenMP runtime, found through /proc/self/maps (Linux)",
)


@pytest.fixture
def two_slices(monkeypatch):
    monkeypatch.setattr(threads, "MIN_SLICE", 16)
    monkeypatch.setattr(team, "MIN_SLICE", 16)
    before = threads.get_num_threads()
    threads.set_num_threads(2)
    yield
    threads.set_num_threads(before)


def _train(opt, mode, monkeypatch):
    """test_threads' pulls and pushes in two slices, then a pull of present and unseen keys."""
    monkeypatch.setenv("TNREC_TABLE_TEAM", mode)
    assert (team.slices(300, np.zeros(300, np.int64)) is not None) == (mode == "1")
    t = _run(opt, 2)
    keys, _ = t.records()
    unseen = np.arange(1000, 1300, dtype=np.int64)  # never created: zeros, nothing made
    return t, [t.pull(np.concatenate([keys[:50], unseen]), create=False)]


@needs_team
def test_the_runtime_is_torchs_openmp():
    assert team._get_team() is not None


@needs_team
@pytest.mark.parametrize(
    "opt", [SGD(0.1), AdaGrad(0.05), Adam(0.01), Ftrl(0.1, l1=0.01)], ids=lambda o: type(o).__name__
)
def test_the_team_gives_the_table_the_python_threads_give(two_slices, monkeypatch, opt):
    on, pulled_on = _train(opt, "1", monkeypatch)
    off, pulled_off = _train(opt, "0", monkeypatch)
    for a, b in zip(pulled_on, pulled_off, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(on) == len(off)
    k_on, r_on = on.records()
    k_off, r_off = off.records()
    np.testing.assert_array_equal(k_on, k_off)
    np.testing.assert_array_equal(r_on, r_off)
    assert not pulled_on[0][50:].any()  # the unseen keys read as zeros


@needs_team
def test_a_repeated_key_is_refused_on_the_team_too(two_slices, monkeypatch):
    monkeypatch.setenv("TNREC_TABLE_TEAM", "1")
    t = SparseTable(4, AdaGrad(), name="t")
    keys = np.arange(100, dtype=np.int64)
    t.pull(keys)
    repeated = np.concatenate([keys, keys[:3]])
    with pytest.raises(TableKeyError, match="3 duplicate"):
        t.pull(repeated)
    assert len(t) == 100


@needs_team
def test_when_a_call_runs_on_the_team(monkeypatch):
    parts = [(0, 10), (10, 20)]
    a = np.zeros(20, np.int64)
    monkeypatch.delenv("TNREC_TABLE_TEAM", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert team.usable(parts, a)
        assert not team.usable(parts[:1], a)  # one slice: this thread alone
        assert not team.usable(parts, a[::2])  # not contiguous
        torch.set_num_threads(1)  # torch's team is smaller than the call
        assert not team.usable(parts, a)
        torch.set_num_threads(2)
        got = []
        side = threading.Thread(target=lambda: got.append(team.usable(parts, a)))
        side.start()
        side.join()
        assert got == [False]  # another thread's OpenMP team is not torch's
        monkeypatch.setenv("TNREC_TABLE_TEAM", "0")
        assert not team.usable(parts, a)
        monkeypatch.setenv("TNREC_TABLE_TEAM", "1")
        torch.set_num_threads(1)
        assert team.usable(parts, a)
    finally:
        torch.set_num_threads(before)


@needs_team
def test_the_team_takes_calls_too_small_for_the_python_threads(monkeypatch):
    monkeypatch.delenv("TNREC_TABLE_TEAM", raising=False)
    torch_before, table_before = torch.get_num_threads(), threads.get_num_threads()
    try:
        torch.set_num_threads(2)
        threads.set_num_threads(2)
        n = 2 * team.MIN_SLICE
        assert n < 2 * threads.MIN_SLICE
        a = np.zeros(n, np.int64)
        assert threads.slices(n) == [(0, n)]  # the Python threads: one slice
        assert team.slices(n, a) == [(0, n // 2), (n // 2, n)]
        assert team.slices(n - 1, a[1:]) is None  # under two team slices
        assert team.slices(n, a.reshape(2, -1)[:, 0]) is None  # not contiguous
        torch.set_num_threads(1)
        assert team.slices(n, a) is None  # torch's team is smaller than the call
        # A pull and a push of n keys on the team (two slices) and in this thread alone
        # (TNREC_TABLE_TEAM=0, one slice) leave the same table.
        torch.set_num_threads(2)
        keys = np.arange(1, n + 1, dtype=np.int64) * 7919
        grads = np.linspace(-1, 1, n * 4, dtype=np.float32).reshape(n, 4)
        ones = np.ones(n, np.float32)
        got = []
        for mode in ("", "0"):
            monkeypatch.setenv("TNREC_TABLE_TEAM", mode)
            t = SparseTable(4, AdaGrad(0.1), name="t")
            t.pull(keys)
            t.push(keys, grads, ones, ones)
            got.append((t.pull(keys, create=False), t.records()[1]))
        np.testing.assert_array_equal(got[0][0], got[1][0])
        np.testing.assert_array_equal(got[0][1], got[1][1])
    finally:
        torch.set_num_threads(torch_before)
        threads.set_num_threads(table_before)


@needs_team
def test_a_misshapen_array_is_an_internal_error():
    with pytest.raises(RuntimeError, match="expected C-contiguous float32"):
        team.address(np.zeros((4, 2), np.float64), np.float32, 2)


def test_a_process_without_torch_never_imports_it_for_the_team():
    # tnrec's tables do not import torch; a large pull there keeps to the Python threads
    code = (
        "import sys, numpy as np\n"
        "from tnrec.table import AdaGrad, SparseTable, team, threads\n"
        "threads.set_num_threads(2)\n"
        "t = SparseTable(4, AdaGrad(), name='t')\n"
        "keys = np.arange(40000, dtype=np.int64)\n"
        "t.pull(keys)\n"
        "t.push(keys, np.zeros((40000, 4), np.float32), np.ones(40000, np.float32),"
        " np.ones(40000, np.float32))\n"
        "assert len(threads.slices(40000)) == 2\n"
        "assert not team.usable(threads.slices(40000), keys)\n"
        "assert 'torch' not in sys.modules, 'the team imported torch'\n"
        "print('ok')\n"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "ok"


@needs_team
def test_misfitting_arrays_and_slices_are_internal_errors():
    loc = (np.zeros(1, np.int64), 8, 10, 1023)
    slots = np.zeros((4, 3), np.int32)
    keys, found = np.zeros(10, np.int64), np.zeros(10, np.int32)
    with pytest.raises(RuntimeError, match=r"\[10, 10, 9\] rows"):
        team.lookup_gather([(0, 5), (5, 10)], slots, loc, keys, found, np.zeros((9, 2), np.float32))
    hp = np.zeros(1, np.float64)
    out = np.zeros((10, 2), np.float32)
    with pytest.raises(RuntimeError, match="got 9 output rows for 10 keys"):
        team.create_rows(
            [(0, 5), (5, 10)], loc, keys, found, np.uint64(1), (0, 0.1), 0, hp, 2, 0, 0, out,
            np.zeros(9, np.int64),
        )  # fmt: skip
    with pytest.raises(RuntimeError, match="must follow each other"):
        team.run(team._LOOKUP_GATHER, [(0, 4), (5, 10)], [])


def _counting(monkeypatch, *names):
    """Count the calls of ``team.<name>`` for each name."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(team, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(team, name, counted)
    return calls


@needs_team
@pytest.mark.parametrize("miss_rate", [2.0, 0.0], ids=["lookup-then-insert", "find-or-insert"])
def test_region_inserts_and_growth_on_the_team_leave_the_python_threads_table(
    two_slices, monkeypatch, miss_rate
):
    # Pulls of present and new keys that grow the index several times: the new keys
    # inserted by region (after a lookup, or found or inserted in one pass) and the
    # index rebuilt by region, on the team and then on the Python threads.
    calls = _counting(monkeypatch, "insert_regions", "rehash_regions")
    monkeypatch.setenv("TNREC_TABLE_TEAM", "1")
    on, pulled_on = _mixed_pulls(monkeypatch, miss_rate)
    assert calls["insert_regions"] >= 4 and calls["rehash_regions"] >= 2
    made_on_team = dict(calls)
    monkeypatch.setenv("TNREC_TABLE_TEAM", "0")
    off, pulled_off = _mixed_pulls(monkeypatch, miss_rate)
    assert calls == made_on_team  # the second run kept to the Python threads
    for a, b in zip(pulled_on, pulled_off, strict=True):
        np.testing.assert_array_equal(a, b)
    k_on, r_on = on.records()
    k_off, r_off = off.records()
    np.testing.assert_array_equal(k_on, k_off)
    np.testing.assert_array_equal(r_on, r_off)
    np.testing.assert_array_equal(on.rows_for(k_on), off.rows_for(k_on))
    np.testing.assert_array_equal(on.bucket_rows(), off.bucket_rows())
    np.testing.assert_array_equal(_occupied(on), _occupied(off))  # the same index


@needs_team
def test_a_repeated_new_key_creates_nothing_on_the_team(two_slices, monkeypatch):
    # The one-pass pull finds the repeat on the team and hands over to the lookup and
    # the insert by region, which finds it on the team again and refuses the pull.
    _small_thresholds(monkeypatch, 0.0)
    calls = _counting(monkeypatch, "insert_regions")
    monkeypatch.setenv("TNREC_TABLE_TEAM", "1")
    t = SparseTable(2, AdaGrad(), name="t")
    old = np.arange(500, dtype=np.int64) * 3
    t.pull(old)
    t.reserve(5_000)
    before, rows_before = _occupied(t), t._store.next_row
    weights = t.pull(old, create=False)
    calls["insert_regions"] = 0
    new = np.arange(2_000, dtype=np.int64) * 3 + 1
    with pytest.raises(TableKeyError, match=r"pull got 2 duplicate key\(s\) among 2002"):
        t.pull(np.concatenate([new, new[[0, 1_999]]]))
    assert calls["insert_regions"] == 2
    assert len(t) == 500 and t._store.next_row == rows_before
    np.testing.assert_array_equal(_occupied(t), before)
    np.testing.assert_array_equal(t.pull(old, create=False), weights)
    np.testing.assert_array_equal(t.pull(new), t.initial_vectors(new))
    assert calls["insert_regions"] == 3 and len(t) == 2_500
