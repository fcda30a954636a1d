"""The daily cycle (tnrec.daily.train_days): skip, resume, decay, evict, save."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec as tn
from tnrec import checkpoint
from tnrec.daily import train_days
from tnrec.errors import EmptyInputError


def test_daily_cycle_skips_complete_days_and_keeps_tables_bounded(common, tmp_path):
    days = [
        (f"2024-05-{10 + d}", lambda d=d: common.reader(common.write_day(str(tmp_path), d)))
        for d in range(3)
    ]
    model = common.build()
    reports = train_days(model, days, str(tmp_path / "m"))
    assert [r.rows_trained for r in reports] == [240, 240, 240]
    assert reports[0].keys_created > 0 and reports[2].keys_evicted > 0
    assert all(not r.skipped for r in reports)
    again = common.build()
    second = train_days(again, days, str(tmp_path / "m"), eval_next_day=True)
    assert [r.skipped for r in second] == [True, True, True]
    common.assert_same(common.snapshot(again), common.snapshot(model), skip=())
    # ids churn 40 a day and unseen keys are evicted after a day: the table stays bounded
    assert reports[2].table_sizes["emb"] < reports[0].table_sizes["emb"] + reports[1].keys_created


def test_resume_from_a_position_past_the_epoch_trains_nothing_twice(common, tmp_path):
    # A worker whose part ran out before a mid-day save records a position in the
    # next epoch; resuming must not train its part again.
    path = common.write_day(str(tmp_path), 0)
    model = common.build()
    data = common.reader(path)
    model.fit(data, verbose=0)  # the whole day: the reader now stands at epoch 1
    model.save_weights(
        str(tmp_path / "m"),
        "d0",
        resume={"dt": "d0", "day_complete": False},
        position=data.position(),
    )
    again = common.build()
    reports = train_days(again, [("d0", lambda: common.reader(path))], str(tmp_path / "m"))
    assert reports[0].resumed and reports[0].rows_trained == 0
    assert checkpoint.read_manifest(checkpoint.latest(str(tmp_path / "m")))["resume"][
        "day_complete"
    ]


def test_a_day_whose_rows_were_all_skipped_is_not_marked_complete(common, tmp_path):
    path = common.write_day(str(tmp_path), 0, rows=20)
    table = pq.read_table(path)
    bad = table.set_column(table.schema.get_field_index("d0"), "d0", pa.array(np.full(20, np.inf)))
    pq.write_table(bad, path)  # d0 = inf: every row is a bad value

    def skipping():
        cols = [*common.COLS, *common.NUMERIC]
        return tn.data.read_parquet([path], cols, batch_size=16, prefetch=0, on_bad_row="skip")

    model_dir = tmp_path / "m"
    with pytest.raises(
        EmptyInputError, match=r"day d0: no row was trained: all 20 rows .* skipped"
    ):
        train_days(common.build(), [("d0", skipping)], str(model_dir))
    assert checkpoint.latest(str(model_dir)) is None  # nothing marked complete
    empty = tmp_path / "empty.parquet"
    pq.write_table(table.slice(0, 0), empty)  # a really empty day is complete, with 0 rows
    reports = train_days(
        common.build(), [("d1", lambda: common.reader(str(empty)))], str(model_dir)
    )
    assert reports[0].rows_trained == 0
    assert checkpoint.read_manifest(checkpoint.latest(str(model_dir)))["resume"]["day_complete"]
