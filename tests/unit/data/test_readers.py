"""Tests of the readers: one row gives identical keys through Parquet, CSV and Criteo;
missing values, multi-valued columns, bad rows, empty input, file listing."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec.data as td
import tnrec.feature_column as fc
from tests.unit.data.criteo_rows import make_rows, write_csv, write_parquet, write_tsv
from tests.unit.data.data_common import read_all
from tnrec.errors import ArgumentError, DataError, SpecError


@pytest.fixture
def rows():
    return make_rows(37, seed=3)


def test_same_rows_same_keys_through_every_reader(tmp_path: Path, rows):
    cols = td.criteo_columns()
    tsv = td.read_criteo(write_tsv(tmp_path / "d.tsv", rows), cols, batch_size=10)
    csv = td.read_csv(write_csv(tmp_path / "d.csv", rows), cols, batch_size=7)
    pqt = td.read_parquet(write_parquet(tmp_path / "d.parquet", rows), cols, batch_size=64)
    a, b, c = read_all(tsv), read_all(csv), read_all(pqt)
    assert a.size == b.size == c.size == 37
    for k in td.CRITEO_CATEGORICAL:
        for other in (b, c):
            np.testing.assert_array_equal(a.keys(k), other.keys(k))
            np.testing.assert_array_equal(a.offsets(k), other.offsets(k))
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.dense, c.dense)
    np.testing.assert_array_equal(a.labels, c.labels)
    np.testing.assert_array_equal(a.row_ids, np.arange(37))
    # The keys are the feature columns' keys of the raw values.
    c1 = fc.hash_values(fc.category_column("C1", dtype="str"), rows["C1"])
    np.testing.assert_array_equal(a.keys("C1"), c1)


def test_batch_contents_and_missing_counts(tmp_path: Path, rows):
    r = td.read_criteo(write_tsv(tmp_path / "d.tsv", rows), batch_size=37)
    (b,) = list(r)
    assert b.labels.shape == (37, 1) and b.labels.dtype == np.float32
    assert b.label().tolist() == [float(v) for v in rows["label"]]
    assert b.dense.shape == (37, 13) and b.dense.dtype == np.float32
    assert b.dense_names == td.CRITEO_NUMERIC
    i2 = np.array([0.0 if v is None else v for v in rows["I2"]])
    np.testing.assert_allclose(b.dense[:, 1], np.sign(i2) * np.log1p(np.abs(i2)), rtol=1e-6)
    for k in (*td.CRITEO_NUMERIC, *td.CRITEO_CATEGORICAL):
        assert r.stats.missing[k] == sum(v is None for v in rows[k]), k
    assert np.diff(b.offsets("C3")).tolist() == [int(v is not None) for v in rows["C3"]]
    assert b.weights is None
    assert r.stats.rows == 37 and r.stats.batches == 1 and r.stats.bad_rows == 0


def test_int_text_forms_and_weights(tmp_path: Path):
    p = tmp_path / "a.csv"
    p.write_text("uid,n,y,w\n123,1.5,1,2\n123.0,,0,0.5\n,3,1,1\n")
    cols = [fc.category_column("uid"), fc.numeric_column("n", default=-1.0)]
    (b,) = list(td.read_csv(p, cols, label="y", weight="w"))
    k = fc.hash_values(fc.category_column("uid"), [123])[0]
    assert b.keys("uid").tolist() == [k, k] and b.offsets("uid").tolist() == [0, 1, 2, 2]
    assert b.dense[:, 0].tolist() == [1.5, -1.0, 3.0]
    assert b.weights is not None and b.weights.tolist() == [2.0, 0.5, 1.0]


def test_multi_valued_and_sequence_columns(tmp_path: Path):
    # rows   tags (multi)    hist (sequence, max 2)
    #   0    [x, y, x]       [1, 2, 3]   -> [2, 3]
    #   1    []              null        -> []
    #   2    [z]             [4]
    #
    #   tags keys    [kx ky kx | kz]      offsets [0, 3, 3, 4]
    #   hist keys    [h2 h3 | h4]         offsets [0, 2, 2, 3]
    cols = [
        fc.category_column("tags", dtype="str"),
        fc.sequence_category_column("hist", "int", 2),
    ]
    table = pa.table(
        {
            "tags": [["x", "y", "x"], [], ["z"]],
            "hist": pa.array([[1, 2, 3], None, [4]], pa.list_(pa.int64())),
            "label": [1, 0, 1],
        }
    )
    pq.write_table(table, tmp_path / "m.parquet")
    (pb,) = list(td.read_parquet(tmp_path / "m.parquet", cols))
    tk = fc.hash_values(cols[0], list("xyz"))
    hk = fc.hash_values(cols[1], [2, 3, 4])
    assert pb.keys("tags").tolist() == [tk[0], tk[1], tk[0], tk[2]]
    assert pb.offsets("tags").tolist() == [0, 3, 3, 4]
    assert pb.keys("hist").tolist() == hk.tolist() and pb.offsets("hist").tolist() == [0, 2, 2, 3]
    (tmp_path / "m.csv").write_text("tags,hist,label\nx|y|x,1|2|3,1\n,,0\nz,4,1\n")
    (cb,) = list(td.read_csv(tmp_path / "m.csv", cols, value_sep="|"))
    for k in ("tags", "hist"):
        assert cb.keys(k).tolist() == pb.keys(k).tolist()
        assert cb.offsets(k).tolist() == pb.offsets(k).tolist()
    with pytest.raises(
        ArgumentError, match=r'column "hist" is a sequence column; pass `value_sep`'
    ):
        td.read_csv(tmp_path / "m.csv", cols)


def test_embedding_columns_are_unwrapped_and_bucketized_are_sparse(tmp_path: Path):
    p = tmp_path / "a.csv"
    p.write_text("u,age,label\n1,20,0\n2,,1\n")
    u = fc.category_column("u")
    age = fc.numeric_column("age", default=50, transform=fc.bucketize([30]))
    cols = [fc.embedding_column(u, 8), fc.embedding_column(u, 4), fc.embedding_column(age, 2)]
    (b,) = list(td.read_csv(p, cols))
    assert list(b.sparse) == ["u", "age"] and b.dense.shape == (2, 0)
    assert b.keys("age").tolist() == fc.hash_values(age, [20, 50]).tolist()
    with pytest.raises(SpecError, match=r'Column "u" is declared twice with different settings'):
        td.read_csv(p, [u, fc.category_column("u", dtype="str")])
    with pytest.raises(ArgumentError, match=r'Field "u" is both a feature column and a label'):
        td.read_csv(p, [u], label="u")


@pytest.mark.parametrize(
    ("line", "match"),
    [
        pytest.param(
            "1\t2", r'file ".*bad.tsv", line 3: expected 40 fields, got 2', id="field-count"
        ),
        pytest.param(
            "1" + "\tx" * 39,
            r'file ".*bad.tsv", line 3: column "I1": value \'x\' is not a finite number',
            id="number",
        ),
        pytest.param(
            "" + "\t1" * 13 + "\ta" * 26,
            r"line 3: column \"label\": value '' is not present",
            id="missing-label",
        ),
        pytest.param("", r"line 3: column \"label\"", id="blank-line"),
    ],
)
def test_bad_rows_raise_naming_file_and_line(tmp_path: Path, line: str, match: str):
    rows = make_rows(4, seed=1)
    good = write_tsv(tmp_path / "g.tsv", rows).read_text().splitlines()
    p = tmp_path / "bad.tsv"
    p.write_text("\n".join([*good[:2], line, *good[2:]]) + "\n")
    with pytest.raises(DataError, match=match):
        list(td.read_criteo(p, prefetch=0))
    with pytest.raises(DataError, match=match):
        list(td.read_criteo(p, prefetch=2))  # raised in the consumer, not lost in the thread
    skip = td.read_criteo(p, on_bad_row="skip")
    b = read_all(skip)
    assert b.size == 4 and skip.stats.bad_rows == 1
    assert b.row_ids.tolist() == [0, 1, 3, 4]  # the bad line keeps its row id


def test_bad_int_value_in_csv_and_parquet(tmp_path: Path):
    p = tmp_path / "a.csv"
    p.write_text("u,label\n1,0\n2.5,1\n3,0\n")
    with pytest.raises(
        DataError, match=r'file ".*a.csv", line 3: column "u": value \'2.5\' is not a valid int'
    ):
        list(td.read_csv(p, [fc.category_column("u")]))
    r = td.read_csv(p, [fc.category_column("u")], on_bad_row="skip")
    assert read_all(r).size == 2 and r.stats.bad_rows == 1
    q = tmp_path / "a.parquet"
    pq.write_table(pa.table({"u": ["1", "x", "3"], "label": [0, 1, 0]}), q)
    with pytest.raises(DataError, match=r'file ".*a.parquet", row 1: column "u": value \'x\''):
        list(td.read_parquet(q, [fc.category_column("u")]))
    pq.write_table(pa.table({"u": [1.5], "label": [0]}), q)
    with pytest.raises(DataError, match=r'declared dtype="str" but its data has type double'):
        list(td.read_parquet(q, [fc.category_column("u", dtype="str")]))


def test_absent_field_is_an_error(tmp_path: Path, rows):
    p = write_parquet(tmp_path / "d.parquet", rows)
    with pytest.raises(DataError, match=r'file ".*d.parquet": has no field "nope"'):
        list(td.read_parquet(p, [fc.category_column("nope")]))
    c = write_csv(tmp_path / "d.csv", rows)
    with pytest.raises(DataError, match=r'file ".*d.csv": has no field "nope"'):
        list(td.read_csv(c, [fc.category_column("nope")]))


def test_empty_files_give_no_rows(tmp_path: Path):
    (tmp_path / "e.tsv").write_text("")
    (tmp_path / "h.csv").write_text("u,label\n")
    pq.write_table(
        pa.table({"u": pa.array([], pa.int64()), "label": pa.array([], pa.int64())}),
        tmp_path / "e.parquet",
    )
    cols = [fc.category_column("u")]
    for r in (
        td.read_criteo(tmp_path / "e.tsv"),
        td.read_csv(tmp_path / "h.csv", cols),
        td.read_parquet(tmp_path / "e.parquet", cols),
    ):
        assert list(r) == []
        assert r.position()["epoch"] == 1
    empty = td.read_criteo(tmp_path / "e.tsv").empty_batch()
    assert empty.size == 0 and empty.dense.shape == (0, 13) and empty.keys("C1").shape == (0,)
    assert empty.offsets("C1").tolist() == [0]


def test_to_batch_hashes_in_memory_rows():
    b = td.to_batch(
        {"u": ["1", "2"], "n": [1.0, None]}, [fc.category_column("u"), fc.numeric_column("n")]
    )
    assert b.keys("u").tolist() == fc.hash_values(fc.category_column("u"), [1, 2]).tolist()
    assert b.labels.shape == (2, 0) and b.dense[:, 0].tolist() == [1.0, 0.0]
    with pytest.raises(DataError, match=r"row 1: column \"u\": value 'y'"):
        td.to_batch({"u": ["1", "y"]}, [fc.category_column("u")])


def test_list_files_and_globs(tmp_path: Path, rows):
    for day in ("2024-05-10", "2024-05-11"):
        (tmp_path / day).mkdir()
        for i in (1, 0):
            write_parquet(tmp_path / day / f"part-{i}.parquet", rows)
    files = td.list_files(tmp_path, ["2024-05-11", "2024-05-10"])
    assert [Path(f).relative_to(tmp_path).as_posix() for f in files] == [
        "2024-05-11/part-0.parquet",
        "2024-05-11/part-1.parquet",
        "2024-05-10/part-0.parquet",
        "2024-05-10/part-1.parquet",
    ]
    assert len(td.list_files(tmp_path)) == 4
    with pytest.raises(DataError, match=r"Day '2024-05-12' not found"):
        td.list_files(tmp_path, "2024-05-12")
    with pytest.raises(DataError, match=r"No files matched pattern: .*2024-05-10/\*.csv"):
        td.list_files(tmp_path, "2024-05-10", "*.csv")
    with pytest.raises(DataError, match=r"Data directory not found"):
        td.list_files(tmp_path / "nope")
    with pytest.raises(DataError, match=r"No files matched pattern: .*\*.orc"):
        td.read_parquet(str(tmp_path / "*" / "*.orc"), td.criteo_columns())
    with pytest.raises(DataError, match=r"Input file not found"):
        td.read_parquet(tmp_path / "missing.parquet", td.criteo_columns())
    r = td.read_parquet(
        str(tmp_path / "2024-05-1*" / "*.parquet"), td.criteo_columns(), batch_size=100
    )
    assert len(r.files) == 4 and read_all(r).size == 4 * 37


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param(
            {"batch_size": 0},
            r"`batch_size` must be an int >= 1. Received: batch_size=0.",
            id="batch_size",
        ),
        pytest.param({"prefetch": -1}, r"`prefetch` must be an int >= 0 or None", id="prefetch"),
        pytest.param({"prefetch": 1.5}, r"`prefetch` must be an int >= 0 or None", id="prefetch-f"),
        pytest.param(
            {"shuffle_buffer_rows": 0}, r"`shuffle_buffer_rows` must be an int >= 1", id="buffer"
        ),
        pytest.param(
            {"on_bad_row": "ignore"}, r'`on_bad_row` must be "raise" or "skip"', id="on_bad_row"
        ),
    ],
)
def test_reader_argument_errors(tmp_path: Path, rows, kwargs, match):
    p = write_tsv(tmp_path / "d.tsv", rows)
    with pytest.raises(ArgumentError, match=match):
        td.read_criteo(p, **kwargs)


def test_csv_argument_errors(tmp_path: Path, rows):
    p = write_csv(tmp_path / "d.csv", rows)
    with pytest.raises(ArgumentError, match=r"`delimiter` must be one character"):
        td.read_csv(p, td.criteo_columns(), delimiter="||")
    with pytest.raises(ArgumentError, match=r"`field_names` is required when header=False"):
        td.read_csv(p, td.criteo_columns(), header=False)
    with pytest.raises(ArgumentError, match=r"`columns` must be a list of feature columns"):
        td.read_csv(p, "C1")  # type: ignore[arg-type]


def test_prefetch_reports_input_wait(tmp_path: Path, rows):
    p = write_tsv(tmp_path / "d.tsv", rows)
    r = td.read_criteo(p, batch_size=5, prefetch=3)
    n = sum(b.size for b in r)
    assert n == 37 and r.stats.batches == 8 and r.stats.input_wait_s > 0
    assert set(r.stats.as_dict()) == {"rows", "batches", "bad_rows", "missing", "input_wait_s"}


def _reads_in_a_thread(reader: td.Reader) -> bool:
    """Whether an iteration of ``reader`` starts a prefetch thread (seen after its first
    batch; a thread another test left running does not count)."""
    before = set(threading.enumerate())
    it = iter(reader)
    next(it)
    started = set(threading.enumerate()) - before
    reader.close()
    return any(t.name == "tnrec-prefetch" for t in started)


def test_the_default_prefetch_reads_in_a_thread_only_when_torch_leaves_a_core(tmp_path: Path, rows):
    import torch

    from tnrec.table.threads import cpus_per_worker

    p = write_tsv(tmp_path / "d.tsv", rows)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(cpus_per_worker())  # torch's threads take every core: inline
        assert td.prefetch_depth(None) == 0
        assert not _reads_in_a_thread(td.read_criteo(p, batch_size=5))
        assert _reads_in_a_thread(td.read_criteo(p, batch_size=5, prefetch=1))  # as asked
        if cpus_per_worker() > 1:  # a core left: the thread, PREFETCH_BATCHES ahead
            torch.set_num_threads(cpus_per_worker() - 1)
            assert td.prefetch_depth(None) == td.PREFETCH_BATCHES == 2
            assert _reads_in_a_thread(td.read_criteo(p, batch_size=5))
            assert not _reads_in_a_thread(td.read_criteo(p, batch_size=5, prefetch=0))
        # Either way the same batches, in order.
        ref = read_all(td.read_criteo(p, batch_size=5, prefetch=0))
        got = read_all(td.read_criteo(p, batch_size=5))
        assert got.row_ids.tolist() == ref.row_ids.tolist() == list(range(37))
        assert np.array_equal(got.labels, ref.labels)
    finally:
        torch.set_num_threads(before)
