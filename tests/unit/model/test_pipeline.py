"""fit's input pipeline: bit-identical to the unpipelined loop; errors, stops and threads.

The pipelined ``fit`` reads and prepares batch i + 1 in a thread while step i
runs; every test trains the same model both ways and compares the bits.
"""

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

import tnrec as tn
from tests.unit.checkpoint import ckpt_common as cc
from tests.unit.ps.loopback import LoopbackComm
from tnrec import pipeline as tp
from tnrec import prepare
from tnrec.callbacks import Callback
from tnrec.errors import ArgumentError, DataError, NonFiniteError
from tnrec.pipeline import InputPipeline
from tnrec.ps import ShardedPS
from tnrec.table import threads

fc = tn.feature_column


def input_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "tnrec-input"]


class Record(Callback):
    """Every step's loss and the data's position after it, as a checkpoint would save it."""

    def __init__(self, stop_at: int | None = None):
        self.losses, self.positions, self.stop_at = [], [], stop_at

    def on_train_batch_end(self, step, logs=None):
        self.losses.append(logs.get("loss", 0.0))
        data = self.model.fit_data
        self.positions.append(data.position() if hasattr(data, "position") else None)
        if step == self.stop_at:
            self.model.stop_training = True  # honoured at the end of the epoch, as unpipelined


def fit_both(data_for, stop_at=None, **fit_kw):
    """Train ``Net`` on ``data_for()`` unpipelined, then pipelined; return (model, record) each."""
    out = []
    for pipeline in (False, True):
        model, rec = cc.build(), Record(stop_at)
        model.fit(data_for(), callbacks=[rec], verbose=0, pipeline=pipeline, **fit_kw)
        out.append((model, rec))
    return out


def assert_bit_identical(a, b):
    (ma, ra), (mb, rb) = a, b
    assert ra.losses == rb.losses and len(ra.losses) > 0
    assert ra.positions == rb.positions
    cc.assert_same(cc.snapshot(ma), cc.snapshot(mb), skip=())


@pytest.fixture
def day(tmp_path):
    return cc.write_day(str(tmp_path), 0, rows=200)  # 13 batches of 16 (the last one of 8)


@pytest.mark.parametrize(
    ("fit_kw", "reader_kw"),
    [
        pytest.param({"epochs": 2}, {}, id="two-epochs"),
        pytest.param({"epochs": 3, "steps_per_epoch": 5}, {}, id="steps-per-epoch"),
        pytest.param({"epochs": 2}, {"prefetch": 2, "shuffle": True, "seed": 3}, id="prefetch"),
        pytest.param({"epochs": 2, "stop_at": 4}, {}, id="stop-training-mid-epoch"),
    ],
)
def test_pipelined_fit_is_bit_identical_to_the_unpipelined_loop(day, fit_kw, reader_kw):
    """Losses, positions after every step, every table row and dense tensor: the same bits."""

    def make():
        kw = {"batch_size": 16, "prefetch": 0, **reader_kw}
        return tn.data.read_parquet([day], [*cc.COLS, *cc.NUMERIC], **kw)

    readers = []

    def data_for():
        readers.append(make())
        return readers[-1]

    a, b = fit_both(data_for, **fit_kw)
    assert_bit_identical(a, b)
    steps = len(a[1].losses)
    if "steps_per_epoch" in fit_kw:
        assert steps == 5 + 5 + 3  # each epoch continues where the last stopped (13 batches)
    elif "stop_at" in fit_kw:
        assert steps == 13  # the epoch ends, then fit stops
    assert readers[0].position() == readers[1].position()  # the reader is left where it was
    assert input_threads() == []


def test_a_list_with_an_empty_batch_and_two_tables_over_the_same_columns(make_batch):
    rng = np.random.default_rng(0)

    def batch(B, start):
        sparse = {
            "user": [[int(u)] for u in rng.integers(0, 30, B)],
            "item": [[int(i)] for i in rng.integers(0, 20, B)],
            "tags": [[int(t) for t in rng.integers(0, 9, rng.integers(0, 3))] for _ in range(B)],
        }
        return make_batch(sparse, rng.integers(0, 2, B), dense=rng.normal(size=(B, 1)), start=start)

    batches = [batch(12, 0), batch(0, 12), batch(9, 12), batch(1, 21)]  # an empty batch
    a, b = fit_both(lambda: batches, epochs=2)
    assert len(a[1].losses) == 8 and a[1].losses[1] == 0.0  # the empty step did nothing
    assert_bit_identical(a, b)


def test_a_one_shot_iterator_with_steps_per_epoch_loses_no_batch(day):
    """The thread never reads past ``steps_per_epoch``: a plain iterator has no seek to undo it."""
    batches = list(cc.reader(day))  # 13
    a, b = fit_both(lambda: iter(batches), epochs=3, steps_per_epoch=4)
    assert len(a[1].losses) == 12  # 4 + 4 + 4 of the 13 batches, none skipped
    assert_bit_identical(a, b)


def test_the_steps_use_the_batches_the_input_thread_prepared(day, monkeypatch):
    """Preparing happens in the input thread, not in the step (and the test can tell)."""
    where = []
    real = prepare.prepare_batch

    def spy(table_layers, batch):
        where.append(threading.current_thread().name)
        return real(table_layers, batch)

    monkeypatch.setattr("tnrec.pipeline.prepare_batch", spy)
    monkeypatch.setattr("tnrec.prepare.prepare_batch", spy)
    for pipeline, want in ((False, {"MainThread"}), (True, {"tnrec-input"})):
        where.clear()
        model = cc.build()
        model.fit(cc.reader(day), verbose=0, pipeline=pipeline)
        assert len(where) == 13 and set(where) == want
        assert model.input_seconds["wait"] >= 0 and model.fit_pipelined is pipeline


def _spy_threads(monkeypatch, where, target):
    """Record the thread of every call of ``target`` ("module.function"), then call it."""
    module, name = target.rsplit(".", 1)
    real = getattr(__import__(module, fromlist=[name]), name)

    def spy(*args, **kwargs):
        where.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, spy)


def test_show_click_and_one_key_bags_are_computed_ahead_in_the_input_thread(day, monkeypatch):
    """With the pipeline the step's push and pooling find them done; without, the step does them."""
    counted, bagged = [], []
    for target in ("tnrec.prepare.show_click", "tnrec.model.show_click"):
        _spy_threads(monkeypatch, counted, target)
    _spy_threads(monkeypatch, bagged, "tnrec.layers.embedding.one_key_bags")
    for pipeline, want in ((False, {"MainThread"}), (True, {"tnrec-input"})):
        counted.clear()
        bagged.clear()
        cc.build().fit(cc.reader(day), verbose=0, pipeline=pipeline)
        # 13 steps: emb and wide share their columns' arrays (one count), and their bags
        assert len(counted) == 13 and set(counted) == want
        assert len(bagged) == 13 and set(bagged) == want


class RelabelNet(cc.Net):
    """Flips the batch's labels in place at the start of every step."""

    def train_step(self, batch):
        batch.labels[:] = 1.0 - batch.labels
        return super().train_step(batch)


def test_a_step_that_changes_its_labels_in_place_counts_show_and_click_again(day):
    """The counts taken ahead are from the old values: the push counts again, same bits."""
    out = []
    for pipeline in (False, True):
        torch.manual_seed(0)
        model, rec = RelabelNet(), Record()
        model.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
        model.fit(cc.reader(day), callbacks=[rec], verbose=0, pipeline=pipeline)
        out.append((model, rec))
    assert_bit_identical(*out)
    assert out[1][0].tables["emb"].rows()["click"].sum() > 0


def test_an_error_computing_ahead_leaves_the_step_to_compute_it(day, monkeypatch):
    """Whatever fails ahead in the input thread is computed, and would raise, in the step."""
    where = []
    real = prepare.show_click

    def failing(*args, **kwargs):
        where.append(threading.current_thread().name)
        if threading.current_thread().name == "tnrec-input":
            raise RuntimeError("ahead failed")
        return real(*args, **kwargs)

    monkeypatch.setattr("tnrec.prepare.show_click", failing)
    monkeypatch.setattr("tnrec.model.show_click", failing)
    a, b = fit_both(lambda: cc.reader(day))
    assert_bit_identical(a, b)
    assert where.count("tnrec-input") == 13 and where.count("MainThread") == 26


def test_a_bad_row_raises_in_the_main_thread_at_its_step_with_its_message(tmp_path, day):
    lines = ["user,item,tags,d0,label"] + [f"{i},{i % 7},{i % 3},0.5,{i % 2}" for i in range(40)]
    lines[35] = "x,1,1,0.5,0"
    path = tmp_path / "a.csv"
    path.write_text("\n".join(lines) + "\n")
    cols = [fc.category_column("user", dtype="int"), *cc.COLS[1:], *cc.NUMERIC]
    good = list(cc.reader(day))[:4]

    def stream():  # a data source that fails after 4 batches, naming its file and row
        yield from good
        raise DataError('file "events.bin", row 65: truncated record')

    cases = [
        (lambda: tn.data.read_csv(path, cols, batch_size=8, prefetch=0), 'a.csv", line 36', 0),
        (stream, r'file "events.bin", row 65: truncated record', 4),
    ]
    for make, match, steps in cases:
        messages = []
        for pipeline in (False, True):
            model, rec = cc.build(), Record()
            with pytest.raises(DataError, match=match) as e:
                model.fit(make(), callbacks=[rec], verbose=0, pipeline=pipeline)
            messages.append((str(e.value), len(rec.losses)))
            assert input_threads() == []
        assert messages[0] == messages[1] and messages[0][1] == steps


def test_a_batch_without_a_layers_column_raises_from_the_step_that_pulls_it(day):
    good = list(cc.reader(day))[:3]
    bad = replace(good[2], sparse={k: v for k, v in good[2].sparse.items() if k != "tags"})
    seen = []
    for pipeline in (False, True):
        model, rec = cc.build(), Record()
        with pytest.raises(ArgumentError, match=r"the batch has no categorical column 'tags'"):
            model.fit([*good[:2], bad, good[0]], callbacks=[rec], verbose=0, pipeline=pipeline)
        seen.append(len(rec.losses))
        assert input_threads() == []
    assert seen == [2, 2]


def test_an_error_in_a_step_stops_the_thread_and_gives_back_the_batch_read_ahead(day):
    class FailsAtStep3(cc.Net):
        def train_step(self, batch):
            if self.global_step == 2:
                raise NonFiniteError("step 3 failed")
            return super().train_step(batch)

    positions = []
    for pipeline in (False, True):
        model = FailsAtStep3()
        model.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
        data = cc.reader(day)
        with pytest.raises(NonFiniteError, match="step 3 failed"):
            model.fit(data, verbose=0, pipeline=pipeline)
        assert input_threads() == []
        positions.append(data.position())
    assert positions[0] == positions[1] and positions[0]["offset"] == 3 * 16


def test_closing_the_pipeline_mid_epoch_leaves_no_thread(day):
    model = cc.build()
    pipe = InputPipeline(cc.reader(day), model._table_layers)
    batch = pipe.take()
    assert pipe.pending() is not None and pipe.pending().batch is batch
    pipe.request()  # the thread reads the next batch; nobody takes it
    pipe.close()
    assert input_threads() == []


@pytest.mark.parametrize("waiting", ["to-be-asked", "to-hand-over"])
def test_close_wakes_the_thread_instead_of_waiting_for_its_poll(day, monkeypatch, waiting):
    monkeypatch.setattr(tp, "_POLL_S", 20.0)  # a close that waited for the poll would take 20 s
    model = cc.build()
    data = cc.reader(day)
    start = data.position()
    pipe = InputPipeline(data, model._table_layers)
    if waiting == "to-be-asked":
        assert pipe.take() is not None  # the thread now waits for the next request
    else:
        pipe.request()  # a second batch while the first is not taken: the thread waits to put it
        deadline = time.monotonic() + 10.0
        while pipe._read < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert pipe._read == 2
    t0 = time.monotonic()
    pipe.close()
    assert time.monotonic() - t0 < 10.0
    assert input_threads() == []
    if waiting == "to-hand-over":  # nothing was taken: both batches read ahead are given back
        assert data.position() == start


class Gated:
    """Batches of ``day`` handed out only while ``gate`` is set (the reader is read in full)."""

    def __init__(self, day):
        self.batches = list(cc.reader(day))
        self.gate = threading.Event()

    def __iter__(self):
        for batch in self.batches:
            assert self.gate.wait(10.0)
            yield batch


def test_wait_answered_waits_for_the_batch_asked_for_without_taking_it(day):
    model = cc.build()
    data = Gated(day)
    data.gate.set()
    pipe = InputPipeline(data, model._table_layers)
    try:
        assert pipe.wait_answered(10.0)
        first = pipe.take()
        assert first is data.batches[0]
        assert pipe.wait_answered(0.0)  # nothing asked since: answered at once
        data.gate.clear()
        pipe.request()
        assert not pipe.wait_answered(0.05)  # the thread waits in the data's iterator
        data.gate.set()
        assert pipe.wait_answered(10.0)
        assert pipe._read == 2 and not pipe._items.empty()  # read and handed over, not taken
        assert pipe.take() is data.batches[1]
        assert pipe.pending() is not None and pipe.pending().batch is data.batches[1]
    finally:
        pipe.close()
    assert pipe.wait_answered(0.0)  # the two batches asked for were answered and taken
    assert input_threads() == []


def test_wait_answered_returns_when_the_thread_stops_first(day):
    model = cc.build()
    data = Gated(day)
    pipe = InputPipeline(data, model._table_layers)  # the thread waits for the gate
    assert not pipe.wait_answered(0.05)
    threading.Timer(0.1, data.gate.set).start()  # the read returns while close() waits
    pipe.close()  # the thread finds the pipeline stopped and ends without answering
    assert input_threads() == []
    t0 = time.monotonic()
    assert pipe.wait_answered(10.0) is False
    assert time.monotonic() - t0 < 5.0


class Answered(Callback):
    """At each step: the model's running pipeline and whether it answered the next batch."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, step, logs=None):
        pipe = self.model.input_pipeline
        self.seen.append(None if pipe is None else (type(pipe), pipe.wait_answered(10.0)))


@pytest.mark.parametrize("pipeline", [False, True])
def test_fit_exposes_the_running_epochs_pipeline(day, pipeline):
    model = cc.build()
    assert model.input_pipeline is None
    cb = Answered()
    model.fit(cc.reader(day), callbacks=[cb], verbose=0, pipeline=pipeline, epochs=2)
    assert len(cb.seen) == 26
    want = (InputPipeline, True) if pipeline else None
    assert cb.seen == [want] * 26
    assert model.input_pipeline is None


def test_pipeline_must_be_a_bool_or_none(day):
    with pytest.raises(
        ArgumentError, match=r"`pipeline` must be True, False or None .*Received: pipeline=1"
    ):
        cc.build().fit(cc.reader(day), verbose=0, pipeline=1)


@pytest.fixture
def two_cpus(monkeypatch):
    """This worker may run on 2 CPUs; torch's thread count is restored after the test."""
    monkeypatch.setattr(threads, "cpus_per_worker", lambda: 2)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("values", "world_size", "asynchronous", "torch_threads", "want"),
    [
        pytest.param(tp.PIPELINE_MIN_DENSE, 1, False, 1, True, id="large-dense-core-free"),
        pytest.param(tp.PIPELINE_MIN_DENSE, 1, False, 2, True, id="large-dense-every-core"),
        pytest.param(tp.PIPELINE_MIN_DENSE - 1, 1, False, 1, False, id="small-dense"),
        pytest.param(tp.PIPELINE_MIN_DENSE - 1, 1, False, 2, False, id="small-dense-every-core"),
        pytest.param(tp.PIPELINE_MIN_DENSE, 2, False, 1, False, id="two-workers"),
        pytest.param(tp.PIPELINE_MIN_DENSE, 1, True, 1, False, id="async"),
    ],
)
def test_the_default_pipeline_rule(two_cpus, values, world_size, asynchronous, torch_threads, want):
    torch.set_num_threads(torch_threads)
    params = [torch.zeros(values - values // 3), torch.zeros(values // 3)]  # counted together
    assert tp.pipeline_by_default(params, world_size, asynchronous) is want


def test_fit_without_pipeline_runs_it_where_it_pays_with_the_same_bits(day, monkeypatch, two_cpus):
    dense = sum(p.numel() for p in cc.build().parameters())
    monkeypatch.setattr(tp, "PIPELINE_MIN_DENSE", dense)  # cc.Net's dense part is large enough
    started = []
    real_init = InputPipeline.__init__

    def counting_init(self, *a, **k):
        started.append(1)
        real_init(self, *a, **k)

    monkeypatch.setattr(InputPipeline, "__init__", counting_init)
    runs = []
    for pipeline in (None, False):
        model, rec = cc.build(), Record()
        model.fit(cc.reader(day), callbacks=[rec], epochs=2, verbose=0, pipeline=pipeline)
        runs.append((model, rec, model.fit_pipelined, len(started)))
        started.clear()
    (_, _, on, pipes), (_, _, off, none) = runs
    assert (on, pipes) == (True, 2) and (off, none) == (False, 0)  # one pipeline an epoch
    assert_bit_identical(runs[0][:2], runs[1][:2])
    # one dense value short of the threshold: the default runs no pipeline
    monkeypatch.setattr(tp, "PIPELINE_MIN_DENSE", dense + 1)
    model = cc.build()
    model.fit(cc.reader(day), verbose=0)
    assert model.fit_pipelined is False and started == []


def sharded(make=cc.Net):
    torch.manual_seed(0)
    model = make()
    model.build_tables(lambda tables: ShardedPS(tables, LoopbackComm()))
    model.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
    return model


def test_a_sharded_ps_routes_the_keys_in_the_input_thread_bit_identically(day, monkeypatch):
    where = []
    real = ShardedPS.route

    def spy(self, keys, comm=None):
        where.append((threading.current_thread().name, comm in (None, self.comm)))
        return real(self, keys, comm)

    monkeypatch.setattr(ShardedPS, "route", spy)
    runs = []
    for pipeline in (False, True):
        where.clear()
        model, rec = sharded(), Record()
        model.fit(cc.reader(day), epochs=2, callbacks=[rec], verbose=0, pipeline=pipeline)
        runs.append((model, rec))
        # 13 batches an epoch; the thread also routes the end of the input (no keys)
        want = [("MainThread", True)] * 26 if not pipeline else [("tnrec-input", False)] * 28
        assert where == want
    assert_bit_identical(*runs)
    assert runs[1][0].input_seconds["route"] > 0


class Relabel(cc.Net):
    """A train_step that hands the step another batch: new labels, or (keys) without "tags"."""

    drop_tags = False

    def train_step(self, batch):
        labels = 1.0 - batch.labels
        sparse = batch.sparse
        if self.drop_tags:
            sparse = {k: v for k, v in sparse.items() if k != "tags"}
            sparse["tags"] = batch.sparse["user"]
        return super().train_step(replace(batch, labels=labels, sparse=sparse))


def test_a_routed_step_takes_a_batch_with_the_same_keys_and_names_one_without(day):
    runs = []
    for pipeline in (False, True):
        model, rec = sharded(Relabel), Record()
        model.fit(cc.reader(day), callbacks=[rec], verbose=0, pipeline=pipeline)
        runs.append((model, rec))
    assert_bit_identical(*runs)  # other labels, the same keys: the route ahead is used
    model = sharded(Relabel)
    model.drop_tags = True
    with pytest.raises(
        ArgumentError, match=r'Model.pull: table "emb" gets \d+ key\(s\) that are not'
    ):
        model.fit(cc.reader(day), verbose=0, pipeline=True)
    assert input_threads() == []
    model.fit(cc.reader(day), verbose=0)  # unpipelined, the default: what the message offers
