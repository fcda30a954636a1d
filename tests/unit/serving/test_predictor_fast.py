"""The Predictor's fast path (one plain value per column) equals the general path bit for bit.

Rows whose every categorical value is a str/int (or None) and every numeric
value a number (or None) are read by the fast path; anything else falls back to
the general path (the readers' code), which also names bad values. The general
path is reached here by a copy of the Predictor without its fast plan.
"""

import copy
import math

import numpy as np
import pyarrow as pa
import pytest

import tnrec as tn
from tests.unit.export.export_common import tiny_rows
from tnrec.data import to_batch
from tnrec.errors import DataError
from tnrec.export.dictionary import key_index, read_rows
from tnrec.models import DeepFM
from tnrec.serving import Predictor, _fast_inputs

fc = tn.feature_column
I64 = (-(2**63), 2**63 - 1)

# u (int, sum), s (str, mean), t (str, sqrtn, keys shared with s), four numeric
# columns: two log1p (apart, so one transform group is not a slice), standardize, raw.
U = fc.category_column("u", dtype="int")
S = fc.category_column("s", dtype="str")
T = fc.category_column("t", dtype="str", embedding_share="s")
A = fc.numeric_column("a", default=1.0, transform=fc.log1p())
Bn = fc.numeric_column("b", default=-2.0, transform=fc.standardize(2.0, 3.0))
C = fc.numeric_column("c", default=0.0, transform=fc.log1p())
D = fc.numeric_column("d", default=0.5)
COLUMNS = [
    fc.embedding_column(U, 4),
    A,
    fc.embedding_column(S, 4, combiner="mean"),
    Bn,
    fc.embedding_column(T, 4, combiner="sqrtn"),
    C,
    D,
]
FEATURES = ["u", "a", "s", "b", "t", "c", "d"]


def wide_rows(n, seed, unseen=False):
    """Rows of single values, None and NaN included; ``unseen`` adds ids never trained."""
    rng = np.random.default_rng(seed)
    extra = 1000 if unseen else 0

    def maybe(v):
        return None if rng.random() < 0.15 else v

    rows = []
    for _ in range(n):
        rows.append(
            {
                "u": maybe(int(rng.integers(-5, 30 + extra))),
                "s": maybe(f"s{rng.integers(0, 12 + extra)}"),
                "t": maybe(["", "é", "s3", f"t{rng.integers(0, 9 + extra)}"][rng.integers(0, 4)]),
                "a": maybe(float(rng.exponential(5.0))),
                "b": maybe(int(rng.integers(-100, 100))),  # ints in a numeric column
                "c": maybe(float("nan") if rng.random() < 0.1 else float(rng.normal())),
                "d": maybe(float(rng.normal()) * 10),
                "y": float(rng.random() < 0.3),
            }
        )
    return rows


@pytest.fixture(scope="module")
def wide_export(tmp_path_factory):
    import torch

    torch.manual_seed(0)
    model = DeepFM(COLUMNS, embedding_dim=4, hidden_units=[8])
    model.compile()
    table = pa.Table.from_pylist(wide_rows(256, 0))
    batches = [to_batch(table.slice(i, 64), COLUMNS, label="y") for i in range(0, 256, 64)]
    model.fit(batches, verbose=0)
    return model.export(str(tmp_path_factory.mktemp("wide") / "exp"))


@pytest.fixture(scope="module")
def fast(wide_export):
    return Predictor(wide_export)


@pytest.fixture(scope="module")
def tiny_fast(tiny_export):
    return Predictor(tiny_export)


def general(p):
    """The same Predictor with the fast path off."""
    q = copy.copy(p)
    q._fast = None
    return q


def features(rows):
    return [{k: v for k, v in r.items() if k != "y"} for r in rows]


def assert_fast_equals_general(p, rows):
    assert _fast_inputs(p._fast, rows) is not None, "the fast path did not take the rows"
    got = p.predict(rows)
    want = general(p).predict(rows)
    assert got.dtype == np.float32 and got.shape == (len(rows),)
    np.testing.assert_array_equal(got, want)
    return got


def test_fast_path_equals_general_path_on_many_rows(fast):
    rows = features(wide_rows(700, 1, unseen=True))
    rows[0].update(u=I64[0], d=0)  # int64 extremes
    rows[1].update(u=I64[1], b=-(2**53), c=None, s="", t=None)
    got = assert_fast_equals_general(fast, rows)
    np.testing.assert_array_equal(got, fast.predict(pa.Table.from_pylist(rows)))
    columns = {k: [r[k] for r in rows] for k in FEATURES}
    assert _fast_inputs(fast._fast, columns) is not None
    np.testing.assert_array_equal(fast.predict(columns), got)
    for n in (1, 2, 17):  # the graph may round differently at another batch size: compare paths
        assert_fast_equals_general(fast, rows[:n])


def test_ints_beyond_2_53_in_numeric_columns_round_as_the_readers_round_them(fast):
    rows = features(wide_rows(8, 6))
    for i, r in enumerate(rows):
        r.update(a=2**60 + 2 * i + 1, b=-(2**62) - 1, c=None, d=I64[i % 2])  # ints only
    assert_fast_equals_general(fast, rows)
    rows[0]["d"] = 0.5  # with a float, Arrow refuses the ints beyond 2**53: the general path
    assert _fast_inputs(fast._fast, rows) is None


def test_fast_path_on_one_column_of_each_kind(tiny_fast):
    rows = features(tiny_rows(64, 5))
    rows[3]["u"] = 10**6  # an unseen key
    assert_fast_equals_general(tiny_fast, rows)


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("u", [None] * 5),
        ("s", [None] * 5),
        ("a", [None] * 5),
        ("a", [3] * 5),
        ("d", [1.5, 2, None, math.nan, -0.0]),
    ],
    ids=["int-all-none", "str-all-none", "num-all-none", "num-all-int", "num-mixed"],
)
def test_whole_columns_of_one_kind(fast, column, values):
    rows = features(wide_rows(5, 2))
    for r, v in zip(rows, values, strict=True):
        r[column] = v
    assert_fast_equals_general(fast, rows)


FALLBACK = [
    pytest.param("u", [[1], [2, 3]], id="multi-valued-int"),
    pytest.param("s", [["a", "s1"], []], id="multi-valued-str"),
    pytest.param("u", ["7", "8"], id="int-as-text"),
    pytest.param("u", [7.0, 8.0], id="int-as-float"),
    pytest.param("s", [5, 6], id="ints-in-str-column"),
    pytest.param("s", [b"s1", b"s2"], id="bytes"),
    pytest.param("a", ["1.5", "2"], id="numeric-text"),
    pytest.param("a", [True, False], id="bools"),
    pytest.param("u", [np.int64(3), np.int64(4)], id="numpy-ints"),
]


@pytest.mark.parametrize(("column", "values"), FALLBACK)
def test_other_values_fall_back_to_the_general_path(fast, column, values):
    rows = features(wide_rows(2, 3))
    for r, v in zip(rows, values, strict=True):
        r[column] = v
    got = fast.predict(rows)
    np.testing.assert_array_equal(got, general(fast).predict(rows))


def test_absent_keys_and_other_mappings_fall_back(fast):
    rows = features(wide_rows(6, 4))
    want = fast.predict(rows)
    del rows[2]["s"]  # absent reads as missing, like None
    assert _fast_inputs(fast._fast, rows) is None
    rows[2]["s"] = None
    np.testing.assert_array_equal(fast.predict(rows), general(fast).predict(rows))
    np.testing.assert_array_equal(fast.predict(tuple(features(wide_rows(6, 4)))), want)
    columns = {k: np.array([r[k] for r in features(wide_rows(6, 4))]) for k in ("u", "b")}
    columns.update(
        {k: [r[k] for r in features(wide_rows(6, 4))] for k in ("s", "t", "a", "c", "d")}
    )
    assert _fast_inputs(fast._fast, columns) is None  # numpy columns: the general path
    np.testing.assert_array_equal(fast.predict(columns), want)


def test_no_rows(fast):
    for rows in ([], {k: [] for k in FEATURES}):
        got = fast.predict(rows)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (0,)


BAD = [
    pytest.param("x", math.inf, r'row 1: column "x": value inf is not a finite number', id="inf"),
    pytest.param(
        "x", 1e308, r'row 1: column "x": value 1e\+308 is not finite as float32', id="f32"
    ),
    pytest.param("x", 2**63, r'row 1, column "x": expected an int in the int64 range', id="big-x"),
    pytest.param("u", 2**63, r'row 1, column "u": expected an int in the int64 range', id="big-u"),
    pytest.param("u", -(2**63) - 1, r'row 1, column "u": expected an int in the int64', id="neg"),
    pytest.param("x", "abc", r'row 1, column "x": expected a number like row 0', id="text"),
    pytest.param("s", 5, r'row 1, column "s": expected text like row 0', id="int-for-str"),
    pytest.param("u", 1.5, r'row 1: column "u": value 1\.5 is not a valid int', id="float-int"),
    pytest.param("u", {"a": 1}, r'row 1, column "u": expected an int \(or its text\)', id="dict"),
]


@pytest.mark.parametrize(("column", "value", "match"), BAD)
def test_bad_values_raise_the_general_paths_message(tiny_fast, column, value, match):
    rows = [{"u": 1, "s": "a", "x": 0.5}, {"u": 2, "s": "b", "x": 1.5}, {"u": 3, "s": None, "x": 2}]
    rows[1][column] = value
    with pytest.raises(DataError, match=r"^Predictor\.predict: " + match) as got:
        tiny_fast.predict(rows)
    with pytest.raises(DataError) as want:
        general(tiny_fast).predict(rows)
    assert str(got.value) == str(want.value)
    columns = {k: [r[k] for r in rows] for k in ("u", "s", "x")}
    with pytest.raises(DataError) as by_columns:
        tiny_fast.predict(columns)
    assert str(by_columns.value) == str(want.value)


def test_missing_column_and_row_not_a_dict(tiny_fast):
    with pytest.raises(DataError, match=r"the rows lack feature columns \['x'\]"):
        tiny_fast.predict([{"u": 1, "s": "a"}])
    with pytest.raises(DataError, match=r"row 1 must be a dict"):
        tiny_fast.predict([{"u": 1, "s": "a", "x": 1.0}, None])


# ---------------------------------------------------------------- Arrow input


def _arrow(rows, chunks=1):
    """``rows`` as a pyarrow Table in ``chunks`` record batches, columns in reverse order
    beside a column the model does not read."""
    table = pa.Table.from_pylist([{"extra": 1, **r} for r in rows])
    table = table.select(list(reversed(table.column_names)))
    size = -(-len(rows) // chunks)
    return pa.concat_tables(table.slice(i, size) for i in range(0, len(rows), size))


def test_arrow_tables_and_record_batches_take_the_fast_path(fast):
    rows = features(wide_rows(500, 11, unseen=True))
    rows[0].update(u=I64[0], d=0)
    rows[1].update(u=I64[1], b=-(2**53), c=None, s="", t=None)
    want = general(fast).predict(rows)
    np.testing.assert_array_equal(fast.predict(rows), want)
    one = _arrow(rows)
    several = _arrow(rows, chunks=3)  # chunked columns
    assert several.column("s").num_chunks == 3
    sliced = _arrow(features(wide_rows(40, 12)) + rows).slice(40)  # buffers at an offset
    batch = one.to_batches()[0]
    for table in (one, several, sliced, batch):
        assert _fast_inputs(fast._fast, table) is not None, "the fast path did not take it"
        np.testing.assert_array_equal(fast.predict(table), want)
        np.testing.assert_array_equal(general(fast).predict(table), want)


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("u", pa.nulls(3)),
        ("s", pa.nulls(3)),
        ("a", pa.nulls(3)),
        ("a", pa.array([3, None, -7])),
        ("d", pa.array([1.5, math.nan, -0.0])),
    ],
    ids=["int-null-type", "str-null-type", "num-null-type", "num-int64", "num-double-nan"],
)
def test_arrow_columns_of_each_kind_equal_the_general_path(fast, column, values):
    table = _arrow(features(wide_rows(3, 13)))
    table = table.set_column(table.schema.get_field_index(column), column, values)
    assert _fast_inputs(fast._fast, table) is not None
    np.testing.assert_array_equal(fast.predict(table), general(fast).predict(table))


@pytest.mark.parametrize(
    ("column", "values"),
    [
        pytest.param("s", pa.array(["s1", None, "é"], pa.large_string()), id="large-string"),
        pytest.param("s", pa.array(["s1", "s2", "s1"]).dictionary_encode(), id="dictionary"),
        pytest.param("u", pa.array([1, None, 3], pa.int32()), id="int32"),
        pytest.param("a", pa.array([1.5, None, 2.0], pa.float32()), id="float32"),
        pytest.param("u", pa.array([[1], [2, 3], []]), id="lists"),
    ],
)
def test_arrow_columns_of_other_types_fall_back_to_the_general_path(fast, column, values):
    table = _arrow(features(wide_rows(3, 14)))
    table = table.set_column(table.schema.get_field_index(column), column, values)
    assert _fast_inputs(fast._fast, table) is None
    np.testing.assert_array_equal(fast.predict(table), general(fast).predict(table))


def test_arrow_edges_no_rows_missing_column_bad_value(tiny_fast):
    rows = [{"u": 1, "s": "a", "x": 0.5}, {"u": 2, "s": "b", "x": 1.5}, {"u": 3, "s": None, "x": 2}]
    table = pa.Table.from_pylist(rows)
    sliced = table.slice(1)  # one column of each kind, at an offset
    assert _fast_inputs(tiny_fast._fast, sliced) is not None
    np.testing.assert_array_equal(tiny_fast.predict(sliced), general(tiny_fast).predict(sliced))
    got = tiny_fast.predict(table.slice(0, 0))
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (0,)
    with pytest.raises(DataError, match=r"the rows lack feature columns \['x'\]"):
        tiny_fast.predict(table.drop_columns(["x"]))
    twice = pa.table([table.column("u"), table.column("s"), table.column("x"), table.column("x")],
                     names=["u", "s", "x", "x"])  # fmt: skip
    assert _fast_inputs(tiny_fast._fast, twice) is None
    with pytest.raises(DataError, match=r"feature columns \['x'\] more than once"):
        tiny_fast.predict(twice)
    bad = table.set_column(2, "x", pa.array([0.5, math.inf, 2.0]))
    assert _fast_inputs(tiny_fast._fast, bad) is None
    with pytest.raises(DataError, match=r"^Predictor\.predict: .*value inf is not a finite number"):
        tiny_fast.predict(bad)


# ---------------------------------------------------------------- the key index


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1000, 5000], ids=lambda n: f"{n}-keys")
def test_read_rows_equals_searchsorted(n):
    rng = np.random.default_rng(n)
    ends = np.array([I64[0], I64[1], -1, 0, 1], np.int64)
    dict_keys = np.unique(
        np.concatenate([rng.integers(*I64, n, dtype=np.int64), ends[: min(n, 5)]])
    )
    weights = rng.normal(size=(dict_keys.shape[0], 3)).astype(np.float32)  # [n, 3]
    queries = np.concatenate(
        [dict_keys, rng.integers(*I64, 500, dtype=np.int64), ends, dict_keys[::-1] + 1]
    )
    out = np.full((queries.shape[0], 3), np.nan, np.float32)
    read_rows(dict_keys, weights, key_index(dict_keys), queries, np.arange(queries.shape[0]), out)
    pos = np.minimum(np.searchsorted(dict_keys, queries), max(dict_keys.shape[0] - 1, 0))
    want = np.zeros_like(out)
    if n:
        hit = dict_keys[pos] == queries
        want[hit] = weights[pos[hit]]
    np.testing.assert_array_equal(out, want)


def test_key_index_is_bounded():
    starts, shift = key_index(np.arange(5_000_000, dtype=np.int64))
    assert starts.shape == (2**20 + 1,) and shift == 44


def test_tables_with_the_same_keys_share_them_and_read_their_own_rows(fast, wide_export):
    emb, wide = fast.dictionaries["emb"][0], fast.dictionaries["wide"][0]
    assert emb[0] is wide[0]  # DeepFM's deep and wide tables hold the same keys: one array
    for table in ("emb", "wide"):
        keys, weights = tn.export.load_dictionary(wide_export, table)
        queries = np.concatenate([np.asarray(keys)[::-1], np.arange(-5, 5, dtype=np.int64)])
        want = np.zeros((queries.shape[0], weights.shape[1]), np.float32)
        want[: keys.shape[0]] = np.asarray(weights)[::-1]
        assert not np.isin(queries[keys.shape[0] :], keys).any()  # unknown keys read as zeros
        np.testing.assert_array_equal(fast.lookup(table, queries), want)


def test_single_valued_rows_of_one_shard_read_each_key_straight_into_the_input(fast, monkeypatch):
    """The fast path pools no temporary matrix: it neither de-duplicates nor pools keys."""
    import tnrec.serving as serving

    rows = features(wide_rows(300, 9, unseen=True))
    want = general(fast).predict(rows)

    def refuse(*args):
        raise AssertionError("the fast path de-duplicated and pooled its keys")

    monkeypatch.setattr(serving, "_virtual_ids", refuse)
    monkeypatch.setattr(serving, "pool_rows", refuse)
    np.testing.assert_array_equal(fast.predict(rows), want)
    with pytest.raises(AssertionError, match="de-duplicated"):
        general(fast).predict(rows)  # the general path pools


@pytest.mark.parametrize("n", [0, 1, 37, 5000], ids=lambda n: f"dict-{n}")
def test_grid_rows_read_each_key_as_the_dictionary_lookup_does(n):
    """grid_rows: each present key's row in the inputs' order, zeros for no key or no value."""
    from tnrec.serving.fast import grid_rows

    rng = np.random.default_rng(n)
    dict_keys = np.unique(
        np.concatenate([rng.integers(*I64, n, dtype=np.int64, endpoint=True), I64[:n]])
    )[:n]
    weights = rng.standard_normal((dict_keys.shape[0], 3)).astype(np.float32)
    S, B = 4, 50
    known = rng.choice(dict_keys, S * B) if dict_keys.shape[0] else np.zeros(S * B, np.int64)
    unseen = rng.integers(*I64, S * B, dtype=np.int64)
    grid = np.where(rng.random(S * B) < 0.7, known, unseen).reshape(S, B)
    present = rng.random((S, B)) < 0.8
    rows = np.array([2, 0, 3], np.int64)
    found = {}
    got = grid_rows((dict_keys, weights), key_index(dict_keys), (grid, present), rows, found)
    keys, given = grid[rows].reshape(-1), present[rows].reshape(-1)
    at = np.minimum(np.searchsorted(dict_keys, keys), max(dict_keys.shape[0] - 1, 0))
    hit = given & (dict_keys[at] == keys) if n else np.zeros(keys.shape[0], np.bool_)
    want = np.zeros((keys.shape[0], 3), np.float32)
    want[hit] = weights[at[hit]]
    np.testing.assert_array_equal(got, want)
    assert found, "the positions are kept for a table sharing these keys"
    again = grid_rows((dict_keys, weights), key_index(dict_keys), (grid, present), rows, found)
    np.testing.assert_array_equal(again, want)
