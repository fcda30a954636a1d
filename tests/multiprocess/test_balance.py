"""fit(balance=True) on W workers under torchrun: every row once, fewer steps, exact resume."""

import numpy as np
import pytest

import tnrec as tn
from tests.multiprocess import mp_balance
from tests.multiprocess.conftest import HERE
from tests.multiprocess.test_distributed import load

SCRIPT = [f"{HERE}/mp_balance.py"]


def run(launch, world, scenario, out_dir, data_dir, *args):
    res = launch(world, [scenario, str(out_dir), str(data_dir), *map(str, args)], target=SCRIPT)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def all_rows(data_dir):
    return np.sort(np.concatenate([b.row_ids for b in mp_balance.reader(str(data_dir))]))


@pytest.mark.parametrize(
    ("world", "sizes", "static", "balanced"),
    [
        # static: rank 0 reads files 0, 2 (240 rows), rank 1 files 1, 3 (80 rows)
        (2, [240, 40, 0, 40], 60, 42),
        # static: rank 0 240 rows, rank 1 80, rank 2 40; 30 steps if every step were full
        (3, [240, 40, 40, 0, 40, 0], 60, 32),
    ],
    ids=["W2", "W3"],
)
def test_uneven_files_every_row_once_in_fewer_steps(
    launch, tmp_path, world, sizes, static, balanced
):
    data = tmp_path / "data"
    data.mkdir()
    mp_balance.write_files(str(data), sizes)
    run(launch, world, "rows", tmp_path, data)
    parts = load(tmp_path, "rows", world)
    want = all_rows(data)
    for name in ("static", "balanced"):
        got = np.sort(np.concatenate([p[f"{name}/rows"] for p in parts]))
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert [int(p["static/steps"]) for p in parts] == [static] * world
    assert [int(p["balanced/steps"]) for p in parts] == [balanced] * world
    two_epochs = np.sort(np.concatenate([p["shuffled/rows"] for p in parts]))
    np.testing.assert_array_equal(two_epochs, np.sort(np.concatenate([want, want])))


def test_empty_files_and_more_workers_than_units(launch, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    mp_balance.write_files(str(data), [0, 7, 0], group=10)  # one unit, 2 batches, 3 workers
    run(launch, 3, "rows", tmp_path, data)
    parts = load(tmp_path, "rows", 3)
    got = np.sort(np.concatenate([p["balanced/rows"] for p in parts]))
    np.testing.assert_array_equal(got, all_rows(data))
    assert [int(p["balanced/steps"]) for p in parts] == [2, 2, 2]
    assert sorted(p["balanced/rows"].size for p in parts) == [0, 0, 7]


def test_a_resume_from_a_mid_epoch_checkpoint_trains_every_row_once(launch, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    mp_balance.write_files(str(data), [120, 40, 0, 40, 8])
    ckpt = tmp_path / "ckpt"
    # a checkpoint at step 5 (mid-window: 8-row windows, 4-row batches); all die at step 7
    run(launch, 2, "resume", tmp_path, data, 1, 5, 7, ckpt)
    before = load(tmp_path, "resume", 2)
    assert [int(p["steps"]) for p in before] == [5, 5]
    run(launch, 2, "resume", tmp_path, data, 2, 5, 7, ckpt)
    after = load(tmp_path, "resume", 2)
    got = np.sort(np.concatenate([p["rows"] for p in (*before, *after)]))
    np.testing.assert_array_equal(got, all_rows(data))
    assert int(after[0]["steps"]) == int(after[1]["steps"]) > 0


def test_bad_input_is_refused_on_every_worker(launch, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    mp_balance.write_files(str(data), [8, 8])
    out = run(launch, 2, "errors", tmp_path, data).stdout
    assert "no error" not in out
    assert "list: ArgumentError: `balance=True` hands out the units" in out
    assert "Received: data=list." in out
    assert "Received: data=part 0 of 2 of a split reader." in out
    assert "pipeline: ArgumentError: `balance=True` cannot run with `pipeline=True`" in out


def test_async_mode_refuses_balance(launch, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    mp_balance.write_files(str(data), [8, 8])
    out = run(launch, 2, "async", tmp_path, data).stdout
    assert out.count("async: ArgumentError: `balance=True` is for sync mode") == 2


def test_in_one_process_balance_changes_nothing_and_checks_its_input(tmp_path):
    mp_balance.write_files(str(tmp_path), [30, 10])
    rows = {}
    for balance in (False, True):
        m = mp_balance.model()
        m.fit(mp_balance.reader(str(tmp_path)), verbose=0, balance=balance)
        rows[balance] = np.concatenate(m.steps_rows)
    np.testing.assert_array_equal(rows[False], rows[True])
    m = mp_balance.model()
    with pytest.raises(tn.errors.ArgumentError, match=r"`data` must be a reader.*data=list\."):
        m.fit([mp_balance.reader(str(tmp_path)).empty_batch()], verbose=0, balance=True)
    with pytest.raises(tn.errors.ArgumentError, match="`balance` must be True or False"):
        m.fit(mp_balance.reader(str(tmp_path)), verbose=0, balance=1)
