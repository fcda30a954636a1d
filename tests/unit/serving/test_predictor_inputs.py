"""Predictor.predict on bad rows: a DataError naming the row, the column and what was expected."""

import math
import os

import numpy as np
import pyarrow as pa
import pytest

from tests.unit.export.export_common import tiny_batches, tiny_rows
from tnrec.errors import ArgumentError, CheckpointError, DataError
from tnrec.serving import Predictor


@pytest.fixture(scope="module")
def predictor(tiny_export):
    return Predictor(tiny_export)


def rows4():
    """Four rows of the tiny model: u int, s str (or None), x float (or None)."""
    return [{k: v for k, v in r.items() if k != "y"} for r in tiny_rows(4, 1)]


def test_predictor_equals_model_predict(tiny, predictor):
    rows = tiny_rows(40, 3)
    want = tiny.predict(tiny_batches(rows))["prediction"]
    got = predictor.predict(rows)
    assert got.dtype == np.float32 and got.shape == (40,)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _set(row, col, value):
    def edit(rows):
        rows[row][col] = value
        return rows

    return edit


BAD_ROWS = [
    pytest.param(
        lambda r: [None],
        r"row 0 must be a dict \(column -> value\)\. "
        r"Received: None \(NoneType\)\.",
        id="row-is-none",
    ),
    pytest.param(
        lambda r: [*r[:2], [1, 2]],
        r"row 2 must be a dict .* Received: \[1, 2\] "
        r"\(list\)",
        id="row-is-a-list",
    ),
    pytest.param(
        _set(1, "x", 2**63),
        r'row 1, column "x": expected an int in the '
        r"int64 range \[-2\*\*63, 2\*\*63\) or a float\. Received: 9223372036854775808 \(int\)",
        id="int-2**63-in-numeric",
    ),
    pytest.param(
        _set(1, "u", 2**63),
        r'row 1, column "u": expected an int in '
        r"the int64 range",
        id="int-2**63-in-int-column",
    ),
    pytest.param(
        _set(2, "u", -(2**63) - 1),
        r'row 2, column "u": expected an int in '
        r"the int64 range .* Received: -9223372036854775809",
        id="int-below-int64",
    ),
    pytest.param(
        _set(1, "x", 1e308),
        r'row 1: column "x": value 1e\+308 is not finite as '
        r"float32",
        id="1e308",
    ),
    pytest.param(
        _set(3, "x", -1e308),
        r'row 3: column "x": value -1e\+308 is not finite as float32',
        id="-1e308",
    ),
    pytest.param(
        _set(1, "x", math.inf), r'row 1: column "x": value inf is not a finite number', id="inf"
    ),
    pytest.param(
        _set(0, "x", -math.inf), r'row 0: column "x": value -inf is not a finite number', id="-inf"
    ),
    pytest.param(
        _set(1, "x", [1.0]),
        r'row 1, column "x": expected a number \(int or '
        r"float\), numeric text, or None; not a list\. Received: \[1\.0\] \(list\)",
        id="list-for-number",
    ),
    pytest.param(
        _set(1, "x", {"a": 1}),
        r'row 1, column "x": expected a number \(int '
        r"or float\), numeric text, or None\. Received: \{'a': 1\} \(dict\)",
        id="dict-for-number",
    ),
    pytest.param(
        _set(2, "u", {"a": 1}),
        r'row 2, column "u": expected an int \(or its '
        r"text\), a list of them, or None\. Received: \{'a': 1\} \(dict\)",
        id="dict-for-int",
    ),
    pytest.param(
        _set(2, "s", {"a": 1}),
        r'row 2, column "s": expected a str \(or an int\)',
        id="dict-for-str",
    ),
    pytest.param(
        _set(1, "u", [1, 2]),
        r'row 1, column "u": expected a single value '
        r"like row 0 \(a column holds lists or single values\)\. Received: \[1, 2\] \(list\)",
        id="list-among-scalars",
    ),
    pytest.param(
        _set(1, "x", "abc"),
        r'row 1, column "x": expected a number like row 2 '
        r"\(a column holds one kind of value\)\. Received: 'abc' \(str\)",
        id="text-for-number",
    ),
    pytest.param(
        _set(1, "u", "x"), r'row 1, column "u": expected a number like row 0', id="text-for-int"
    ),
    pytest.param(_set(3, "s", 5), r'row 3, column "s": expected text like row 0', id="int-for-str"),
    pytest.param(
        _set(1, "u", True),
        r'row 1, column "u": expected a number like row 0 .* '
        r"Received: True \(bool\)",
        id="bool-for-int",
    ),
    pytest.param(
        _set(1, "u", 1.5), r'row 1: column "u": value 1\.5 is not a valid int', id="float-for-int"
    ),
    pytest.param(
        _set(1, "x", object()), r'row 1, column "x": expected a number .* \(object\)', id="object"
    ),
    pytest.param(
        lambda r: [{**x, "x": "abc"} for x in r],
        r"row 0: column \"x\": value 'abc' is not a finite number",
        id="all-text-not-numbers",
    ),
    pytest.param(
        lambda r: [{k: v for k, v in x.items() if k != "x"} for x in r],
        r"the rows lack feature columns \['x'\] \(the model reads \['u', 's', 'x'\]\)",
        id="column-missing",
    ),
    pytest.param(lambda r: 42, r"`rows` must be a list of dicts, .* Received: int", id="not-rows"),
    pytest.param(
        lambda r: "u=1", r"`rows` must be a list of dicts, .* Received: str", id="a-string"
    ),
    pytest.param(
        lambda r: {"u": [1, 2], "s": ["a", "b"], "x": [1.0]},
        r"one value per row; their lengths differ: \{'u': 2, 's': 2, 'x': 1\}",
        id="columns-of-unequal-length",
    ),
    pytest.param(
        lambda r: {"u": [1], "s": ["a"], "x": 1.0},
        r'column "x" must be a list of values, one per row\. Received: 1\.0 \(float\)',
        id="column-is-a-scalar",
    ),
    pytest.param(
        lambda r: {}, r"the rows lack feature columns \['u', 's', 'x'\]", id="dict-columns-missing"
    ),
]


@pytest.mark.parametrize(("edit", "match"), BAD_ROWS)
def test_bad_rows_raise_a_data_error_naming_row_and_column(predictor, edit, match):
    with pytest.raises(DataError, match=r"^Predictor\.predict: .*" + match):
        predictor.predict(edit(rows4()))


def test_nested_list_in_a_multi_valued_column(predictor):
    rows = [{**r, "u": [r["u"]]} for r in rows4()]
    predictor.predict(rows)  # a list per row: several keys (here one)
    rows[2]["u"] = [[1]]
    with pytest.raises(DataError, match=r'row 2, column "u": expected a single value, not a nes'):
        predictor.predict(rows)


def test_nan_absent_and_none_read_as_missing_like_the_readers(predictor):
    rows = rows4()
    rows[1]["x"], rows[2]["s"] = None, None
    want = predictor.predict(rows)
    rows[1]["x"] = math.nan
    del rows[2]["s"]
    np.testing.assert_array_equal(predictor.predict(rows), want)


def test_numeric_text_reads_as_numbers(predictor):
    rows = [{**r, "x": 0.25 * i} for i, r in enumerate(rows4())]
    text = [{**r, "x": repr(r["x"])} for r in rows]
    np.testing.assert_array_equal(predictor.predict(text), predictor.predict(rows))


def test_no_rows_give_empty_predictions_of_the_same_structure(predictor, tiny_export):
    for rows in ([], {"u": [], "s": [], "x": []}, pa.table({"u": [1], "s": ["a"], "x": [0.0]})[:0]):
        got = predictor.predict(rows)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (0,)


def test_input_forms_agree(predictor):
    rows = rows4()
    want = predictor.predict(rows)
    columns = {k: [r[k] for r in rows] for k in ("u", "s", "x")}
    np.testing.assert_array_equal(predictor.predict(columns), want)
    np.testing.assert_array_equal(predictor.predict(pa.Table.from_pylist(rows)), want)
    arrays = {"u": np.array(columns["u"]), "s": pa.array(columns["s"]), "x": columns["x"]}
    np.testing.assert_array_equal(predictor.predict(arrays), want)


def test_pandas_dataframe(predictor):
    import pandas as pd  # a test dependency: the Predictor takes DataFrames

    rows = rows4()
    np.testing.assert_array_equal(predictor.predict(pd.DataFrame(rows)), predictor.predict(rows))


def test_predictor_on_a_path_that_is_no_export(tmp_path):
    with pytest.raises(CheckpointError, match=r"No export at .*nope: no such directory"):
        Predictor(str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match=r"No export at .*file: it is not a directory"):
        Predictor(str(tmp_path / "file"))
    with pytest.raises(CheckpointError, match=r"No export at .*: .*manifest\.json does not exist"):
        Predictor(str(tmp_path))
    with pytest.raises(ArgumentError, match=r"`path` must be a directory\. Received: 42"):
        Predictor(42)
    assert os.path.isdir(str(tmp_path))
