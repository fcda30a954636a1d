"""Closing a day: the Checkpoint callback decays and evicts like train_days (once), and
train_days(save_every_days=N) saves some days only and resumes exactly between saves."""

import os

import pytest
import torch

import tnrec as tn
from tnrec import checkpoint
from tnrec.callbacks import Callback, Checkpoint
from tnrec.daily import DayReport, format_day, train_days
from tnrec.errors import ArgumentError
from tnrec.table import SGD, EvictionPolicy, zeros

fc = tn.feature_column


class Counted(tn.Model):
    """One SGD table with show decay 0.5 a day and no eviction: shows are easy to follow."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(fc.category_column("k"), 1)],
            SGD(0.1),
            output="concat",
            initializer=zeros(),
            policy=EvictionPolicy(show_decay_rate=0.5),
        )
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def forward_dense(self, pooled, dense):
        return pooled["emb"].sum(1) + self.bias


def _counted() -> Counted:
    m = Counted()
    m.compile(tn.optimizer.SGD(0.1), loss="mse")
    return m


def _show(model, key):
    rows = model.tables["emb"].rows()
    return float(rows["show"][rows["keys"].tolist().index(key)])


def test_checkpoint_decays_by_the_days_elapsed_before_its_save_and_never_twice(
    make_batch, tmp_path
):
    d = str(tmp_path / "m")
    day1 = [make_batch({"k": [[7], [7], [7], [8]]}, [1.0, 0.0, 1.0, 0.0])]  # key 7 shown 3 times
    day2 = [make_batch({"k": [[7], [7]]}, [1.0, 0.0])]  # twice, three days later
    model = _counted()
    model.fit(day1, callbacks=[Checkpoint(d, dt="2024-05-10")], verbose=0)
    assert _show(model, 7) == 3 * 0.5  # the first day decays by one day
    model.fit(day2, callbacks=[Checkpoint(d, dt="2024-05-13")], verbose=0)
    assert _show(model, 7) == (1.5 + 2) * 0.5**3  # 0.4375: three days elapsed
    assert _show(model, 8) == 0.5**4
    manifest = checkpoint.read_manifest(checkpoint.latest(d))
    assert manifest["resume"]["last_decayed_day"] == "2024-05-13"
    assert manifest["resume"]["day_complete"] is True
    # the save holds the decayed tables; training the same day again decays by 0 days
    again = _counted()
    again.fit(day2, callbacks=[Checkpoint(d, dt="2024-05-13")], verbose=0)
    assert _show(again, 7) == 0.4375 + 2


def test_a_fit_loop_with_checkpoint_leaves_the_tables_train_days_leaves(common, tmp_path):
    # dated days with a gap: the decay runs by elapsed days; the policy evicts unseen keys
    dts = ["2024-05-10", "2024-05-11", "2024-05-14"]
    days = [
        (dt, lambda i=i: common.reader(common.write_day(str(tmp_path), i)))
        for i, dt in enumerate(dts)
    ]
    daily = common.build()
    reports = train_days(daily, days, str(tmp_path / "daily"))
    assert sum(r.keys_evicted for r in reports) > 0
    loop = common.build()
    for dt, make in days:
        loop.fit(make(), callbacks=[Checkpoint(str(tmp_path / "loop"), dt=dt)], verbose=0)
    common.assert_same(common.snapshot(loop), common.snapshot(daily), skip=())
    assert loop.last_decayed_day == daily.last_decayed_day == "2024-05-14"


class Stop(Callback):
    """Raises after global step ``at`` (a crash)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, step, logs=None):
        if self.model.global_step == self.at:
            raise RuntimeError(f"stopped at step {self.at}")


def _five_days(common, tmp_path):
    return [
        (f"d{i}", lambda i=i: common.reader(common.write_day(str(tmp_path), i))) for i in range(5)
    ]


def test_save_every_days_saves_every_nth_day_and_the_last(common, tmp_path):
    model_dir = tmp_path / "m"
    reports = train_days(
        common.build(), _five_days(common, tmp_path), str(model_dir), save_every_days=2
    )
    assert [r.saved for r in reports] == [False, True, False, True, True]
    assert sorted(p for p in os.listdir(model_dir) if p.startswith("d")) == ["d1", "d3", "d4"]
    assert format_day(reports[0]).endswith(" (not saved)")
    assert not format_day(reports[1]).endswith(" (not saved)")


def test_a_run_stopped_between_saves_retrains_from_the_last_saved_day_exactly(common, tmp_path):
    days = _five_days(common, tmp_path)  # 15 steps a day; saves at the ends of d1, d3, d4
    whole = common.build()
    train_days(whole, days, str(tmp_path / "whole"), save_every_days=2)
    with pytest.raises(RuntimeError, match="stopped at step 50"):  # inside d3, d2 unsaved
        train_days(
            common.build(), days, str(tmp_path / "stopped"), save_every_days=2, callbacks=[Stop(50)]
        )
    assert checkpoint.read_manifest(checkpoint.latest(str(tmp_path / "stopped")))["dt"] == "d1"
    resumed = common.build()
    reports = train_days(resumed, days, str(tmp_path / "stopped"), save_every_days=2)
    assert [r.skipped for r in reports] == [True, True, False, False, False]
    assert [r.saved for r in reports[2:]] == [False, True, True]
    assert resumed.global_step == whole.global_step == 75
    common.assert_same(common.snapshot(resumed), common.snapshot(whole), skip=())


@pytest.mark.parametrize("bad", [0, 1.5, True], ids=["zero", "float", "bool"])
def test_save_every_days_must_be_a_positive_int(common, tmp_path, bad):
    with pytest.raises(
        ArgumentError,
        match=rf"`save_every_days` must be an int >= 1\. Received: save_every_days={bad}",
    ):
        train_days(
            common.build(), _five_days(common, tmp_path), str(tmp_path / "m"), save_every_days=bad
        )


def test_a_day_report_defaults_to_saved():
    assert DayReport("d0").saved and "(not saved)" not in format_day(DayReport("d0"))
