"""Values at the edges of float32 and int64: bad rows named by file, row and column,
or skipped and counted; never a raw Arrow/NumPy/Python exception."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec.data as td
import tnrec.feature_column as fc
from tests.unit.data.data_common import read_all
from tnrec.errors import DataError

F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize(
    ("value", "what"),
    [
        pytest.param("1e308", r"is not finite as float32 \(the model's dtype\)", id="1e308"),
        pytest.param("-1e308", r"is not finite as float32", id="-1e308"),
        pytest.param("3.5e38", r"is not finite as float32", id="3.5e38"),
        pytest.param("inf", r"is not a finite number", id="inf"),
        pytest.param("-Infinity", r"is not a finite number", id="-inf"),
        pytest.param("nan", r"is not a finite number", id="nan"),
        pytest.param("-NaN", r"is not a finite number", id="-nan"),
        pytest.param("nan(1)", r"is not a finite number", id="nan-payload"),
    ],
)
def test_csv_numeric_beyond_float32_is_a_bad_row(tmp_path: Path, value: str, what: str):
    p = tmp_path / "a.csv"
    p.write_text(f"n,label\n1,0\n{value},1\n2.5,0\n")
    cols = [fc.numeric_column("n")]
    quoted = re.escape(repr(value))
    with pytest.raises(DataError, match=rf'file ".*a.csv", line 3: column "n": value {quoted} '):
        list(td.read_csv(p, cols))
    with pytest.raises(DataError, match=what):
        list(td.read_csv(p, cols))
    r = td.read_csv(p, cols, on_bad_row="skip")
    b = read_all(r)
    assert b.dense[:, 0].tolist() == [1.0, 2.5]
    assert b.row_ids.tolist() == [0, 2] and r.stats.bad_rows == 1
    assert r.stats.missing["n"] == 0


def test_float32_edges_that_stay_finite(tmp_path: Path):
    # 3.4028235e38 is float32's max; 1e-50 underflows to 0; 1e308 under log1p is 709.2.
    p = tmp_path / "a.csv"
    p.write_text("n,m,label\n3.4028235e38,1e308,0\n-3.4028235e38,1,0\n1e-50,,1\n")
    cols = [fc.numeric_column("n"), fc.numeric_column("m", -1.0, fc.log1p())]
    b = read_all(td.read_csv(p, cols))
    assert b.dense[:, 0].tolist() == [F32_MAX, -F32_MAX, 0.0]
    assert b.dense[:, 1].tolist() == [
        float(np.float32(np.log1p(1e308))),
        float(np.float32(np.log1p(1.0))),
        float(np.float32(-np.log1p(1.0))),
    ]


def test_transform_overflow_names_the_transform(tmp_path: Path):
    p = tmp_path / "a.csv"
    p.write_text("n,label\n1e30,0\n")
    cols = [fc.numeric_column("n", transform=fc.standardize(0.0, 1e-10))]
    with pytest.raises(
        DataError,
        match=r"line 2: column \"n\": value '1e30' is not finite as float32 "
        r"\(the model's dtype\) after the column's transforms",
    ):
        list(td.read_csv(p, cols))


def test_label_and_weight_beyond_float32(tmp_path: Path):
    p = tmp_path / "a.csv"
    p.write_text("u,y,w\n1,1e39,1\n2,1,1e308\n3,0,2\n")
    cols = [fc.category_column("u")]
    with pytest.raises(DataError, match=r"line 2: column \"y\": value '1e39' is not finite as"):
        list(td.read_csv(p, cols, label="y", weight="w"))
    r = td.read_csv(p, cols, label="y", weight="w", on_bad_row="skip")
    b = read_all(r)
    assert b.row_ids.tolist() == [2] and b.weights is not None and b.weights.tolist() == [2.0]
    assert r.stats.bad_rows == 2


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        pytest.param("9223372036854775807", True, id="max"),
        pytest.param("-9223372036854775808", True, id="min"),
        pytest.param("9223372036854775808", False, id="max+1"),
        pytest.param("-9223372036854775809", False, id="min-1"),
        pytest.param("99999999999999999999999", False, id="huge"),
    ],
)
def test_int64_edges_in_an_int_column(tmp_path: Path, value: str, ok: bool):
    p = tmp_path / "a.csv"
    p.write_text(f"u,label\n{value},0\n")
    col = fc.category_column("u")
    r = td.read_csv(p, [col], on_bad_row="skip")
    b = read_all(r)
    if ok:
        assert b.keys("u").tolist() == fc.hash_values(col, [int(value)]).tolist()
        return
    assert b.size == 0 and r.stats.bad_rows == 1
    with pytest.raises(
        DataError, match=rf"line 2: column \"u\": value '{value}' is not a valid int value"
    ):
        list(td.read_csv(p, [col]))


def test_int_beyond_float_precision_in_a_numeric_column(tmp_path: Path):
    # int64 2**60 and uint64 2**64-1 are finite floats: read as the nearest float32.
    q = tmp_path / "a.parquet"
    pq.write_table(
        pa.table(
            {
                "n": pa.array([2**60, 1], pa.int64()),
                "m": pa.array([2**64 - 1, 7], pa.uint64()),
                "label": [0, 1],
            }
        ),
        q,
    )
    b = read_all(td.read_parquet(q, [fc.numeric_column("n"), fc.numeric_column("m")]))
    assert b.dense.tolist() == [[2.0**60, float(np.float32(2.0**64))], [1.0, 7.0]]


def test_parquet_values_beyond_float32_and_int64_name_the_row(tmp_path: Path):
    q = tmp_path / "a.parquet"
    pq.write_table(
        pa.table(
            {
                "u": pa.array([1, 2**63, 3], pa.uint64()),
                "n": [1.0, 2.0, 1e308],
                "label": [0, 1, 0],
            }
        ),
        q,
    )
    with pytest.raises(
        DataError,
        match=r'file ".*a.parquet", row 1: column "u": value 9223372036854775808 is not an '
        r'int64 \(unsigned 64-bit ids need dtype="str"\)',
    ):
        list(td.read_parquet(q, [fc.category_column("u")]))
    with pytest.raises(
        DataError, match=r'file ".*a.parquet", row 2: column "n": value 1e\+308 is not finite'
    ):
        list(td.read_parquet(q, [fc.numeric_column("n")]))
    r = td.read_parquet(q, [fc.category_column("u"), fc.numeric_column("n")], on_bad_row="skip")
    b = read_all(r)
    assert b.row_ids.tolist() == [0] and r.stats.bad_rows == 2
    # Declared dtype="str", an unsigned id hashes as its decimal text.
    s = read_all(td.read_parquet(q, [fc.category_column("u", dtype="str")]))
    want = fc.hash_values(fc.category_column("u", dtype="str"), ["1", str(2**63), "3"])
    assert s.keys("u").tolist() == want.tolist()


@pytest.mark.parametrize("dtype", [pa.float32(), pa.float64()])
def test_parquet_float_labels_and_weights(tmp_path: Path, dtype: pa.DataType):
    y = [0.1, 1.0, 3.4e-39, -2.5]  # 3.4e-39: a float32 subnormal
    w = [1.0, 0.3, 2.0, 1e-7]
    q = tmp_path / "good.parquet"
    pq.write_table(
        pa.table({"u": [1, 2, 3, 4], "y": pa.array(y, dtype), "w": pa.array(w, dtype)}), q
    )
    b = read_all(td.read_parquet(q, [fc.category_column("u")], label="y", weight="w"))
    assert b.labels[:, 0].tolist() == np.array(y, np.float32).tolist()
    assert b.weights is not None and b.weights.tolist() == np.array(w, np.float32).tolist()
    # Not finite in the file or as float32, missing (NaN, null): bad rows, named.
    for value, what in (
        (1e39, "finite as float32") if dtype == pa.float64() else (float("inf"), "a finite number"),
        (float("nan"), "present"),
        (None, "present"),
    ):
        bad = tmp_path / "bad.parquet"
        labels = pa.array([0.5, value, 1.0], dtype)
        pq.write_table(pa.table({"u": [1, 2, 3], "y": labels}), bad)
        with pytest.raises(DataError, match=rf'row 1: column "y": value .* is not {what}'):
            list(td.read_parquet(bad, [fc.category_column("u")], label="y"))
        r = td.read_parquet(bad, [fc.category_column("u")], label="y", on_bad_row="skip")
        got = read_all(r)
        assert got.labels[:, 0].tolist() == [0.5, 1.0] and r.stats.bad_rows == 1


def test_parquet_uint64_list_values_beyond_int64(tmp_path: Path):
    # row 0: [1, 2]   row 1: [3, 2**64-1] (bad)   row 2: []
    q = tmp_path / "a.parquet"
    tags = pa.array([[1, 2], [3, 2**64 - 1], []], pa.list_(pa.uint64()))
    pq.write_table(pa.table({"t": tags, "label": [0, 1, 0]}), q)
    col = fc.category_column("t")
    r = td.read_parquet(q, [col], on_bad_row="skip")
    b = read_all(r)
    assert b.row_ids.tolist() == [0, 2] and r.stats.bad_rows == 1
    assert b.keys("t").tolist() == fc.hash_values(col, [1, 2]).tolist()
    assert b.offsets("t").tolist() == [0, 2, 2]
    with pytest.raises(DataError, match=r"row 1: column \"t\": value \[3, 18446744073709551615\]"):
        list(td.read_parquet(q, [col]))


def test_parquet_float_nan_is_missing_but_nan_text_is_bad(tmp_path: Path):
    q = tmp_path / "a.parquet"
    pq.write_table(pa.table({"n": [float("nan"), 2.0], "s": ["1", "nan"], "label": [0, 1]}), q)
    r = td.read_parquet(q, [fc.numeric_column("n", -1.0)], on_bad_row="skip")
    assert read_all(r).dense[:, 0].tolist() == [-1.0, 2.0] and r.stats.missing["n"] == 1
    with pytest.raises(DataError, match=r"row 1: column \"s\": value 'nan' is not a finite number"):
        list(td.read_parquet(q, [fc.numeric_column("s")]))


def test_bucketized_nan_text_is_bad(tmp_path: Path):
    p = tmp_path / "a.csv"
    p.write_text("age,label\n20,0\nNaN,1\n")
    col = fc.numeric_column("age", transform=fc.bucketize([18, 25]))
    with pytest.raises(DataError, match=r"line 3: column \"age\": value 'NaN' is not a number"):
        list(td.read_csv(p, [col]))


def test_to_batch_names_the_column_python_ints_overflow():
    with pytest.raises(
        DataError, match=r'column "u": values cannot form one Arrow column \(.*\); expected numbers'
    ):
        td.to_batch({"u": [1, 2**64]}, [fc.category_column("u")])
    with pytest.raises(DataError, match=r"row 1: column \"n\": value 1e\+300 is not finite"):
        td.to_batch({"n": [1.0, 1e300]}, [fc.numeric_column("n")])


def test_huge_values_are_cut_in_messages(tmp_path: Path):
    p = tmp_path / "a.csv"
    p.write_text("n,label\n" + "9" * 5000 + ",0\n")
    with pytest.raises(
        DataError, match=r"value '9{59}\.\.\. \(5000 characters\) is not a finite number\.$"
    ):
        list(td.read_csv(p, [fc.numeric_column("n")]))
