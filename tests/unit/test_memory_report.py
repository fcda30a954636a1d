"""tnrec.memory: the report against the tables' own memory(), its skew and sums over workers,
peak RSS, and how fit / the progress line / the run log / TensorBoard carry it."""

import numpy as np
import pytest
import torch

import tnrec as tn
from tnrec import memory
from tnrec.callbacks import Callback
from tnrec.memory import FIELDS, format_memory, memory_report, memory_scalars, peak_rss_bytes
from tnrec.ps import LocalPS
from tnrec.runlog import RunLog, read_runlog
from tnrec.table import AdaGrad, AdmissionPolicy, SparseTable

fc = tn.feature_column
PER_WORKER = [f for f in FIELDS if f not in memory.COUNTERS]


def trained_table(name, keys, admission=None):
    """A dim-4 AdaGrad table after a training pull and push of ``keys`` (three with
    admission ``min_show=2``: two pulls refused (shows 0 and 1), the third admits)."""
    t = SparseTable(4, AdaGrad(0.1), name=name, admission=admission)
    k = np.array(keys, np.int64)
    ones = np.ones(k.shape[0], np.float32)
    for _ in range(3 if admission is not None else 1):
        t.pull(k)
        t.push(k, np.ones((k.shape[0], 4), np.float32), ones, ones)
    return t


@pytest.fixture
def tables():
    adm = AdmissionPolicy(min_show=2, sketch_bytes=1 << 16)
    return {"user": trained_table("user", [1, 2, 3]), "item": trained_table("item", [7, 8], adm)}


def test_one_worker_report_is_each_tables_memory(tables):
    report = memory_report(LocalPS(tables))
    assert report["world_size"] == 1
    assert sorted(report["tables"]) == ["item", "user"]
    for name, t in tables.items():
        mem, got = t.memory(), report["tables"][name]
        for f in FIELDS:
            assert got[f] == pytest.approx(mem[f]), (name, f)
        for f in PER_WORKER:
            assert got["per_worker"][f] == [pytest.approx(mem[f])], (name, f)
        assert got["skew"] == 1.0
    item = report["tables"]["item"]
    # two keys refused at two pulls, then admitted at the third
    assert (item["keys_refused"], item["keys_admitted"], item["rows"]) == (4, 2, 2)
    assert item["sketch_bytes"] == 1 << 16 and item["sketch_fill"] > 0
    assert report["tables"]["user"]["keys_admitted"] == 0  # no admission: not counted
    assert 0 < report["peak_rss_bytes"] <= peak_rss_bytes()
    assert report["peak_rss_bytes_per_worker"] == [report["peak_rss_bytes"]]


class TwoWorkers:
    """Worker 0 of two: its own tables; ``all_gather`` appends worker 1's figures."""

    world_size = 2

    def __init__(self, tables, other_tables, other_rss):
        self.tables = tables
        self.other = memory._local_figures(other_tables, sorted(other_tables))
        self.other[0] = other_rss

    def all_gather(self, values):
        return np.concatenate([values, self.other])


def test_two_workers_sum_rows_bytes_counters_and_take_max_rss_and_skew():
    adm = AdmissionPolicy(min_show=2, sketch_bytes=1 << 16)
    mine = {"t": trained_table("t", [1, 2, 3], adm)}  # 3 rows
    theirs = {"t": trained_table("t", [9], adm)}  # 1 row
    report = memory_report(TwoWorkers(mine, theirs, other_rss=5e12))
    t = report["tables"]["t"]
    a, b = mine["t"].memory(), theirs["t"].memory()
    assert t["per_worker"]["rows"] == [3, 1] and t["rows"] == 4
    assert t["skew"] == 1.5  # max 3 / mean 2
    for f in ("bytes", "index_bytes", "row_bytes", "weight_bytes", "state_bytes", "sketch_bytes"):
        assert t[f] == a[f] + b[f] and t["per_worker"][f] == [a[f], b[f]], f
    assert (t["keys_admitted"], t["keys_refused"]) == (3 + 1, 6 + 2)
    assert t["sketch_fill"] == pytest.approx((a["sketch_fill"] + b["sketch_fill"]) / 2)
    assert report["peak_rss_bytes"] == 5 * 10**12
    assert report["peak_rss_bytes_per_worker"][1] == 5 * 10**12
    assert "skew 1.50" in format_memory(report)


@pytest.mark.parametrize(
    ("rows", "skew"),
    [([0, 0], 1.0), ([5, 5], 1.0), ([6, 2], 1.5), ([4, 0], 2.0)],
    ids=["empty", "even", "6-2", "all-on-one"],
)
def test_skew_is_max_over_mean_rows(rows, skew):
    assert memory._skew(np.array(rows, np.float64)) == skew


def test_a_worker_sending_other_tables_is_an_internal_error(tables):
    class Odd(TwoWorkers):
        def all_gather(self, values):
            return np.concatenate([values, values[:-1]])

    with pytest.raises(RuntimeError, match=r"internal error: memory_report gathered \d+ figures"):
        memory_report(Odd(tables, tables, 0.0))


def test_peak_rss_falls_back_to_getrusage_without_proc(monkeypatch):
    import resource

    def no_proc(*a, **k):
        raise OSError("no /proc here")

    monkeypatch.setattr(memory, "open", no_proc, raising=False)
    expected = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert peak_rss_bytes() >= expected > 0


def test_scalars_and_line_of_a_report():
    report = {
        "world_size": 1,
        "peak_rss_bytes": 3 << 30,
        "tables": {
            "emb": {
                "rows": 10,
                "bytes": 2048,
                "skew": 1.0,
                "sketch_fill": 0.25,
                "keys_admitted": 4,
                "keys_refused": 6,
                "keys_evicted_cap": 1,
            }
        },
    }
    assert memory_scalars(report) == {
        "memory/peak_rss": float(3 << 30),
        "memory/emb/rows": 10.0,
        "memory/emb/bytes": 2048.0,
        "memory/emb/skew": 1.0,
        "memory/emb/sketch_fill": 0.25,
        "memory/emb/keys_admitted": 4.0,
        "memory/emb/keys_refused": 6.0,
        "memory/emb/keys_evicted_cap": 1.0,
    }
    assert format_memory(report) == "rows 10, tables 2.0 KB, peak RSS 3.0 GB"  # no skew for W=1


# ------------------------------------------------------------------ fit, progress line, run log


class Small(tn.Model):
    def __init__(self):
        super().__init__()
        cols = [fc.embedding_column(fc.category_column(k), 4) for k in ("user", "item")]
        self.emb = tn.layers.EmbeddingFeatures(cols, AdaGrad(0.05), output="concat")
        self.out = torch.nn.Linear(10, 1)

    def forward_dense(self, pooled, dense):
        return torch.sigmoid(self.out(torch.cat([pooled["emb"], dense], 1)))


def small():
    torch.manual_seed(0)
    m = Small()
    m.compile(tn.optimizer.Adam(learning_rate=0.02))
    return m


class Reports(Callback):
    def __init__(self):
        self.got = []

    def on_memory_report(self, step, report):
        self.got.append((step, report, self.model.tables["emb"].memory()))


@pytest.mark.parametrize(
    ("n_batches", "steps"), [(5, [2, 4, 5]), (4, [2, 4])], ids=["epoch-end-report", "last-step"]
)
def test_fit_reports_every_log_every_steps_and_at_the_epoch_end(batches, n_batches, steps):
    m = small()
    rec = Reports()
    m.fit(batches(n_batches, 32), callbacks=[rec], verbose=0, log_every=2)
    assert [s for s, _, _ in rec.got] == steps
    for _, report, mem in rec.got:  # the report of that moment, not a later one
        assert report["tables"]["emb"]["rows"] == mem["rows"]
        assert report["tables"]["emb"]["bytes"] == mem["bytes"]
    rows = [r["tables"]["emb"]["rows"] for _, r, _ in rec.got]
    assert rows == sorted(rows) and rows[-1] == len(m.tables["emb"])


def test_progress_lines_end_with_the_memory_line(batches, capsys):
    small().fit(batches(4, 32), verbose=1, log_every=2)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" - ")[0] for ln in lines] == ["step 2", "step 4", "epoch 1"]
    for ln in lines:
        assert " - memory: rows " in ln and ", peak RSS " in ln, ln


class FakeWriter:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def close(self):
        pass


def test_run_log_writes_memory_records_and_tensorboard_scalars(batches, tmp_path):
    m = small()
    log = RunLog(tmp_path, every=2)
    writer = FakeWriter()
    log._open_tensorboard = lambda: setattr(log, "_writer", writer)  # tensorboard not needed
    m.fit(log.wrap(batches(3, 32)), callbacks=[log], verbose=0, log_every=2)
    records = read_runlog(tmp_path)
    assert [(r["event"], r.get("step")) for r in records] == [
        ("step", 2),
        ("memory", 2),
        ("memory", 3),
        ("epoch", None),
    ]
    last = records[2]
    assert last["global_step"] == 3 and last["world_size"] == 1
    assert last["tables"]["emb"]["rows"] == len(m.tables["emb"])
    assert last["tables"]["emb"]["per_worker"]["rows"] == [len(m.tables["emb"])]
    tags = {(tag, step) for tag, _, step in writer.scalars}
    for tag in ("memory/emb/rows", "memory/emb/bytes", "memory/emb/skew", "memory/peak_rss"):
        assert (tag, 2) in tags and (tag, 3) in tags, tag
    rows = [v for tag, v, step in writer.scalars if tag == "memory/emb/rows" and step == 3]
    assert rows == [float(len(m.tables["emb"]))]
