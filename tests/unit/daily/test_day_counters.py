"""Per-day admission and eviction counters of the daily cycle (day line, run-log record), and
the memory reports of 2 workers under torchrun, one of them out of data."""

import json
import os

import numpy as np
import pytest

from tests.multiprocess.conftest import torchrun
from tests.unit.daily import memory_common as mc
from tnrec.cli.inspection import inspect, inspect_summary
from tnrec.cli.train import _day_record
from tnrec.daily import train_days

COUNTERS = ("keys_admitted", "keys_refused", "keys_evicted_cap")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_common.py")


def test_a_days_counters_are_its_differences_of_the_tables_counters(tmp_path, capsys):
    mc.write_data(str(tmp_path))
    model = mc.build()
    rec = mc.Recorder()
    reports = train_days(
        model, mc.days(str(tmp_path)), str(tmp_path / "m"), callbacks=[rec], verbose=1
    )
    table = model.tables["emb"]
    for day, seen in zip(reports, rec.counters, strict=True):
        t = day.tables["emb"]
        for k in COUNTERS:
            assert t[k] == seen["end"][k] - seen["start"][k] == getattr(day, k), k
        assert t["keys_evicted"] == day.keys_evicted
        assert t["rows"] == day.table_sizes["emb"]
    for k in COUNTERS:  # a fresh model: the days add up to the table's counters
        assert sum(day.tables["emb"][k] for day in reports) == table.counters[k], k
    first, last = reports
    assert first.keys_admitted > 0 and first.keys_refused > 0
    assert first.keys_evicted_cap + last.keys_evicted_cap > 0  # 1,024 rows: one per bucket
    assert last.keys_evicted > 0  # the first day's keys unseen on the second
    mem = table.memory()
    assert last.tables["emb"]["rows"] == mem["rows"] == len(table)
    assert last.tables["emb"]["bytes"] == mem["bytes"]
    assert mem["sketch_fill"] > 0
    assert last.tables["emb"]["sketch_fill"] == pytest.approx(mem["sketch_fill"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("day ")]
    t = last.tables["emb"]
    assert lines[1].startswith(
        f"day 2024-05-11: rows 240 - keys created {last.keys_created} - evicted {last.keys_evicted}"
    )
    assert (
        f"emb={t['rows']} (admitted {t['keys_admitted']}, refused {t['keys_refused']}, "
        f"evicted {t['keys_evicted']}"
    ) in lines[1]
    assert f"sketch fill {t['sketch_fill']:.3f})" in lines[1]
    record = json.loads(json.dumps(_day_record(last)))  # what runlog.jsonl holds
    assert record["tables"]["emb"] == pytest.approx(t)
    for k in (*COUNTERS, "keys_evicted"):
        assert record[k] == getattr(last, k), k


def _load(out_dir):
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory2")
    data = out / "data"
    data.mkdir()
    mc.write_data(str(data))
    res = torchrun(2, [str(out), str(data)], timeout_s=300.0, target=[SCRIPT])
    assert res.returncode == 0, res.stdout + res.stderr
    return _load(out), data / "m"


def test_a_worker_out_of_data_takes_part_in_every_memory_report(two_workers):
    (r0, r1), _ = two_workers
    # rank 0 has 5 batches, rank 1 one: steps 2 and 4 (log_every=2) and the epoch's end, 5
    assert [x["step"] for x in r0["uneven"]] == [x["step"] for x in r1["uneven"]] == [2, 4, 5]
    for a, b in zip(r0["uneven"], r1["uneven"], strict=True):
        assert a["report"] == b["report"]  # one all_gather: the same report on every worker
        _check_against_each_worker(a["report"], a["mine"], b["mine"])


def test_the_daily_reports_and_counters_sum_the_workers(two_workers):
    (r0, r1), _ = two_workers
    assert [x["step"] for x in r0["daily_reports"]] == [x["step"] for x in r1["daily_reports"]]
    for a, b in zip(r0["daily_reports"], r1["daily_reports"], strict=True):
        assert a["report"] == b["report"]
        _check_against_each_worker(a["report"], a["mine"], b["mine"])
    assert r0["days"] == r1["days"]
    for d, day in enumerate(r0["days"]):
        for k in COUNTERS:
            mine = [r["counters"][d]["end"][k] - r["counters"][d]["start"][k] for r in (r0, r1)]
            assert day["tables"]["emb"][k] == sum(mine) == day[k], (d, k)
    assert r0["days"][0]["keys_admitted"] > 0 and r0["days"][0]["keys_refused"] > 0


def test_inspect_shows_each_workers_part_and_the_skew(two_workers):
    (r0, _), model_dir = two_workers
    emb = inspect_summary(str(model_dir))["tables"]["emb"]
    rows = [p["rows"] for p in emb["parts"]]
    assert [p["rank"] for p in emb["parts"]] == [0, 1]
    assert sum(rows) == emb["keys"] == r0["days"][-1]["table_sizes"]["emb"]
    assert emb["skew"] == pytest.approx(max(rows) / np.mean(rows))
    assert sum(p["bytes"] for p in emb["parts"]) == emb["bytes"]
    assert all(0 < p["sketch_bytes"] < p["bytes"] for p in emb["parts"])
    text = inspect(str(model_dir))
    assert ["emb", "1", f"{rows[1]:,}"] in [ln.split()[:3] for ln in text.splitlines()]
    assert f"{emb['skew']:.2f}" in text and "cap 1,024 rows" in text


def _check_against_each_worker(report, mine0, mine1):
    """The gathered report against each worker's own ``memory()`` at that step."""
    assert report["world_size"] == 2 and len(report["peak_rss_bytes_per_worker"]) == 2
    assert report["peak_rss_bytes"] == max(report["peak_rss_bytes_per_worker"]) > 0
    t = report["tables"]["emb"]
    for f in ("rows", "bytes", "index_bytes", "row_bytes", "state_bytes", "sketch_bytes"):
        assert t["per_worker"][f] == [mine0[f], mine1[f]], f
        assert t[f] == mine0[f] + mine1[f], f
    for f in COUNTERS:
        assert t[f] == mine0[f] + mine1[f], f
    rows = np.array(t["per_worker"]["rows"], np.float64)
    assert t["skew"] == pytest.approx(rows.max() / rows.mean() if rows.sum() else 1.0)
