"""Tests of tnrec.feature_column: pinned keys, canonical forms, columns, the spec."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tnrec.feature_column as fc
from tnrec.errors import DataError, SpecError

MASK = (1 << 64) - 1


# ----------------------------------------------------------------- a pure-Python reference


def ref_mix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def ref_fnv(b: bytes) -> int:
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & MASK
    return h


def signed(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


def ref_int_key(identity: str, v: int) -> int:
    return signed(ref_mix64(ref_mix64(v & MASK) ^ ref_fnv(identity.encode())))


def ref_str_key(identity: str, s: str) -> int:
    return signed(ref_mix64(ref_fnv(s.encode()) ^ ref_fnv(identity.encode())))


# ----------------------------------------------------------------- pinned values


def test_fnv1a64_standard_vectors():
    assert fc.fnv1a64(b"") == 0xCBF29CE484222325
    assert fc.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fc.fnv1a64(b"foobar") == 0x85944171F73967E8


def test_int_keys_are_pinned():
    keys = fc.hash_values(fc.category_column("user_id"), [0, 1, 42, -7, 2**63 - 1])
    assert keys.dtype == np.int64
    assert keys.tolist() == [
        8233407312289914754,
        -3683426646721054315,
        8837641390516011126,
        3003126013020702352,
        -2565247920832581375,
    ]


def test_str_keys_are_pinned():
    keys = fc.hash_values(fc.category_column("item", dtype="str"), ["a", "hello", "é", "68fd1e64"])
    assert keys.tolist() == [
        -1433017679479366740,
        -8584190181792437941,
        1318764609667117593,
        -8732117669631031383,
    ]


def test_bucketized_keys_are_pinned():
    col = fc.numeric_column("age", transform=fc.bucketize([18, 30]))
    assert fc.hash_values(col, [10, 18, 40]).tolist() == [
        8370320545691315834,
        6587421455086185048,
        -3181271792292183427,
    ]


def test_mixer_is_the_table_mixer():
    from tnrec.table import mix64

    v = np.array([0, 1, -1, 123456789], dtype=np.int64)
    assert [int(x) for x in mix64(v)] == [ref_mix64(int(x) & MASK) for x in v]


@settings(max_examples=50, deadline=None)
@given(
    st.text(min_size=1, max_size=12),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20),
    st.lists(st.text(min_size=1, max_size=10), max_size=20),
)
def test_keys_match_the_reference(identity, ints, strs):
    got_i = fc.hash_values(
        fc.category_column("k", embedding_share=identity), pa.array(ints, pa.int64())
    )
    assert got_i.tolist() == [ref_int_key(identity, v) for v in ints]
    got_s = fc.hash_values(fc.category_column("k", dtype="str", embedding_share=identity), strs)
    assert got_s.tolist() == [ref_str_key(identity, s) for s in strs]


@pytest.mark.parametrize("raw", [False, True])
def test_bags_int_gives_a_scalar_column_the_keys_of_the_general_walk(raw):
    """One value a row, all present, starting inside ``values``: the one-pass path's keys
    and offsets are those of the same rows with one missing value elsewhere."""
    from tnrec.feature_column import _hash

    rng = np.random.default_rng(3)
    vals = rng.integers(-(2**63), 2**63 - 1, 12, dtype=np.int64).view(np.uint64)
    h = np.uint64(_hash.name_hash("c"))
    rows = np.arange(2, 11, dtype=np.int64)  # rows of values[2:10], one value each
    keys, offs = _hash.bags_int(rows, vals, np.ones(12, np.bool_), h, 0, raw)
    assert offs.tolist() == list(range(9))
    ref = vals[2:10] if raw else [ref_int_key("c", int(v)) & MASK for v in vals[2:10]]
    assert keys.tolist() == [int(v) for v in ref]
    present = np.ones(12, np.bool_)
    present[11] = False  # a row past these, missing: the general walk
    wide = np.arange(2, 13, dtype=np.int64)
    keys2, offs2 = _hash.bags_int(wide, vals, present, h, 0, raw)
    assert keys2.tolist() == keys.tolist() + [
        int(v if raw else ref_int_key("c", int(v)) & MASK) for v in vals[10:11]
    ]
    assert offs2.tolist() == list(range(10)) + [9]


def test_bags_int_of_rows_with_empty_and_longer_bags_takes_the_general_walk():
    """As many values as rows, but one row empty and one with two: not a scalar column."""
    from tnrec.feature_column import _hash

    vals = np.array([5, 6, 7], np.uint64)
    rows = np.array([0, 2, 2, 3], np.int64)  # [5, 6], [], [7]
    keys, offs = _hash.bags_int(rows, vals, np.ones(3, np.bool_), np.uint64(9), 0, True)
    assert keys.tolist() == [5, 6, 7] and offs.tolist() == [0, 2, 2, 3]


# ----------------------------------------------------------------- canonical forms, identity


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(pa.array([123, -5], pa.int64()), id="int64"),
        pytest.param(pa.array([7, 123, -5], pa.int64()).slice(1), id="int64-slice"),
        pytest.param(pa.chunked_array([[123], [-5]], pa.int64()), id="int64-chunked"),
        pytest.param(pa.array([123, -5], pa.int32()), id="int32"),
        pytest.param(pa.array([123.0, -5.0]), id="float"),
        pytest.param(pa.array(["123", "-5"]), id="text"),
        pytest.param(pa.array(["123.0", "-5.000"]), id="text-dot-zero"),
        pytest.param(pa.array(["+123", "-5."]), id="text-sign"),
        pytest.param(pa.array(["123", "-5"], pa.large_string()), id="large-text"),
        pytest.param(pa.array(["123", "-5"]).dictionary_encode(), id="dict"),
    ],
)
def test_int_canonical_forms_give_one_key(raw):
    col = fc.category_column("c")
    assert fc.hash_values(col, raw).tolist() == [ref_int_key("c", 123), ref_int_key("c", -5)]


def test_str_column_reads_ints_as_decimal_text():
    col = fc.category_column("c", dtype="str")
    assert fc.hash_values(col, [7, 10]).tolist() == fc.hash_values(col, ["7", "10"]).tolist()


def test_columns_differ_unless_shared():
    a = fc.category_column("a")
    b = fc.category_column("b")
    sa = fc.category_column("a", embedding_share="g")
    sb = fc.category_column("b", embedding_share="g")
    assert fc.hash_values(a, [1])[0] != fc.hash_values(b, [1])[0]
    assert fc.hash_values(sa, [1])[0] == fc.hash_values(sb, [1])[0]


@pytest.mark.parametrize(
    "text", ["12.5", "abc", "1e3", " 1", "-", "", "9223372036854775808", "99999999999999999999"]
)
def test_unparsable_int_text_is_bad_or_missing(text):
    bags = fc.categorical_bags(fc.category_column("c"), pa.array([text, "1"]))
    assert bags.offsets.tolist() == [0, 0, 1]
    if text == "":
        assert bags.bad is None and bags.missing == 1
    else:
        assert bags.bad is not None and bags.bad.tolist() == [True, False]


def test_int64_extremes_parse():
    col = fc.category_column("c")
    got = fc.hash_values(col, ["-9223372036854775808", "9223372036854775807"])
    assert got.tolist() == [ref_int_key("c", -(2**63)), ref_int_key("c", 2**63 - 1)]


def test_hash_values_names_a_bad_value():
    with pytest.raises(DataError, match=r"value 'x1' at index 1 is not a valid int"):
        fc.hash_values(fc.category_column("c"), ["1", "x1"])


def test_wrong_arrow_type_is_refused():
    with pytest.raises(
        DataError, match=r'column "c" is declared dtype="str" but its data has type double'
    ):
        fc.categorical_bags(fc.category_column("c", dtype="str"), pa.array([1.5]))
    with pytest.raises(
        DataError, match=r'column "c" is declared dtype="int" but its data has type timestamp'
    ):
        fc.categorical_bags(fc.category_column("c"), pa.array([0], pa.timestamp("s")))


def test_missing_values_give_empty_bags():
    bags = fc.categorical_bags(fc.category_column("c", dtype="str"), pa.array(["x", None, "", "y"]))
    assert bags.offsets.tolist() == [0, 1, 1, 1, 2]
    assert bags.missing == 2
    ints = fc.categorical_bags(fc.category_column("c"), pa.array([1.0, None, float("nan")]))
    assert ints.offsets.tolist() == [0, 1, 1, 1] and ints.missing == 2 and ints.bad is None
    int64 = fc.categorical_bags(fc.category_column("c"), pa.array([4, None, 5], pa.int64()))
    assert int64.keys.tolist() == [ref_int_key("c", 4), ref_int_key("c", 5)]
    assert int64.offsets.tolist() == [0, 1, 1, 2] and int64.missing == 1


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=30),
    st.sampled_from(["int", "sign", "str"]),
)
def test_a_scalar_column_counts_its_empty_bags_as_missing(values, dtype):
    col = fc.category_column("c", dtype=dtype)
    arr = pa.array(values, pa.int64())
    if dtype == "str":  # text, with empty strings missing too
        arr = pa.array([None if v is None else ("" if v % 3 == 0 else str(v)) for v in values])
    bags = fc.categorical_bags(col, arr)
    empty = int(np.count_nonzero(np.diff(bags.offsets) == 0))
    assert bags.missing == empty
    assert empty == sum(v is None or (dtype == "str" and v % 3 == 0) for v in values)


def test_list_column_bags_keep_duplicates_and_order():
    # rows:  0: [a, b, a]   1: null   2: []   3: [null, c]
    #
    #   keys    [ka kb ka | kc ]
    #   offsets [0,        3, 3, 3, 4]
    col = fc.category_column("t", dtype="str")
    bags = fc.categorical_bags(col, pa.array([["a", "b", "a"], None, [], [None, "c"]]))
    ka, kb, kc = (ref_str_key("t", s) for s in "abc")
    assert bags.keys.tolist() == [ka, kb, ka, kc]
    assert bags.offsets.tolist() == [0, 3, 3, 3, 4]
    assert bags.missing == 2


def test_sequence_keeps_the_most_recent_values():
    # max_length 2, lists oldest first:
    #   row 0: [1, 2, 3]  -> [2, 3]
    #   row 1: [4]        -> [4]
    #   row 2: [5, None, 6, 7] -> [6, 7]   (missing values do not count)
    #
    #   keys    [k2 k3 | k4 | k6 k7]
    #   offsets [0,    2,   3,    5]
    col = fc.sequence_category_column("s", "int", 2)
    bags = fc.categorical_bags(col, pa.array([[1, 2, 3], [4], [5, None, 6, 7]]))
    assert bags.keys.tolist() == [ref_int_key("s", v) for v in (2, 3, 4, 6, 7)]
    assert bags.offsets.tolist() == [0, 2, 3, 5]


def test_value_sep_splits_text():
    col = fc.category_column("t", dtype="str")
    bags = fc.categorical_bags(col, pa.array(["a|b", "", "c"]), value_sep="|")
    assert bags.keys.tolist() == [ref_str_key("t", s) for s in "abc"]
    assert bags.offsets.tolist() == [0, 2, 2, 3]


def test_sliced_arrays_read_their_own_values():
    arr = pa.array(["x", "y", "z", "w"]).slice(1, 2)
    col = fc.category_column("t", dtype="str")
    assert fc.hash_values(col, arr).tolist() == [ref_str_key("t", "y"), ref_str_key("t", "z")]


def test_empty_array():
    bags = fc.categorical_bags(fc.category_column("c"), pa.array([], pa.int64()))
    assert bags.keys.tolist() == [] and bags.offsets.tolist() == [0] and bags.missing == 0


# ----------------------------------------------------------------- numeric


def test_numeric_values_missing_and_bad():
    col = fc.numeric_column("n", default=7.0)
    x, missing, bad = fc.numeric_values(col, pa.array(["1", "", None, "abc", "1e3", "inf", "-2.5"]))
    assert x.tolist() == [1.0, 7.0, 7.0, 7.0, 1000.0, 7.0, -2.5]
    assert missing.tolist() == [False, True, True, False, False, False, False]
    assert bad is not None and bad.tolist() == [False, False, False, True, False, True, False]
    x, missing, bad = fc.numeric_values(col, pa.array([1.0, None, float("nan")]))
    assert x.tolist() == [1.0, 7.0, 7.0] and missing.sum() == 2 and bad is None


def test_transforms():
    col = fc.numeric_column("n", transform=[fc.log1p(), fc.standardize(1.0, 2.0)])
    x = np.array([0.0, np.e - 1, -1.0])
    np.testing.assert_allclose(col.apply(x), [(0 - 1) / 2, (1 - 1) / 2, (-np.log(2) - 1) / 2])
    assert fc.numeric_column("n", transform=fc.log1p).transforms == (fc.Log1p(),)
    b = fc.numeric_column("b", default=5, transform=fc.bucketize([0, 10]))
    assert isinstance(b, fc.BucketizedColumn)
    assert b.bucket(np.array([-1.0, 0.0, 9.9, 10.0])).tolist() == [0, 1, 1, 2]
    bags = fc.categorical_bags(b, pa.array([None, 5.0, 20.0]))
    assert bags.keys[0] == bags.keys[1] != bags.keys[2]  # missing -> default 5 -> bucket 1


# ----------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("make", "match"),
    [
        pytest.param(
            lambda: fc.category_column(""),
            r"category_column: `key` must be a non-empty str",
            id="empty-key",
        ),
        pytest.param(
            lambda: fc.category_column("a", dtype="float"),
            r'Column "a": `dtype` must be one of',
            id="dtype",
        ),
        pytest.param(
            lambda: fc.category_column("a", embedding_share=""),
            r"`embedding_share` must be None",
            id="share",
        ),
        pytest.param(
            lambda: fc.sequence_category_column("s", "int", 0),
            r"`max_length` must be a positive int",
            id="max-length",
        ),
        pytest.param(
            lambda: fc.embedding_column(fc.category_column("a"), 0),
            r'Column "a": `dimension` must be a positive int. Received: dimension=0.',
            id="dimension",
        ),
        pytest.param(
            lambda: fc.embedding_column(fc.category_column("a"), 4, "max"),
            r"`combiner` must be one of",
            id="combiner",
        ),
        pytest.param(
            lambda: fc.embedding_column(fc.numeric_column("n"), 4),
            r"`categorical` must be a category",
            id="embed-numeric",
        ),
        pytest.param(
            lambda: fc.numeric_column("n", default=float("nan")),
            r"`default` must be a finite number",
            id="default",
        ),
        pytest.param(
            lambda: fc.numeric_column("n", transform="log"),
            r"`transform` must be log1p",
            id="transform",
        ),
        pytest.param(
            lambda: fc.numeric_column("n", transform=[fc.bucketize([1]), fc.log1p()]),
            r"bucketize\(...\) must be the last transform",
            id="bucketize-last",
        ),
        pytest.param(lambda: fc.standardize(0.0, 0.0), r"`std` must be > 0", id="std"),
        pytest.param(lambda: fc.bucketize([2, 1]), r"strictly increasing", id="boundaries-order"),
        pytest.param(lambda: fc.bucketize([]), r"strictly increasing", id="boundaries-empty"),
        pytest.param(
            lambda: fc.bucketize("12"), r"`boundaries` must be a sequence", id="boundaries-str"
        ),
    ],
)
def test_invalid_columns(make, match):
    with pytest.raises(SpecError, match=match):
        make()


# ----------------------------------------------------------------- spec


def all_columns() -> list[fc.Column]:
    user = fc.category_column("user_id", dtype="int")
    return [
        fc.embedding_column(user, 8, "mean"),
        fc.category_column("item", dtype="str", embedding_share="items"),
        fc.embedding_column(
            fc.sequence_category_column("clicks", "str", 30, embedding_share="items"), 8
        ),
        fc.numeric_column("I1", 0.5, [fc.log1p(), fc.standardize(0.1, 3.3)]),
        fc.numeric_column("age", 1.0, [fc.log1p(), fc.bucketize([0.1, 1 / 3, 2.5])]),
        fc.embedding_column(
            fc.numeric_column("hour", transform=fc.bucketize([6, 12, 18])), 4, "sqrtn"
        ),
    ]


def test_spec_round_trip_is_exact():
    cols = all_columns()
    spec = fc.to_spec(cols)
    assert spec["format"] == fc.SPEC_FORMAT and spec["format_version"] == 1
    assert fc.from_spec(spec) == cols
    text = json.dumps(spec)
    assert fc.from_spec(text) == cols
    assert fc.to_spec(fc.from_spec(text)) == spec


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(
            {"format_version": 3},
            r"unsupported `format_version` 3; this tnrec reads format versions 1 and 2",
            id="version",
        ),
        pytest.param(
            {"format_version": None}, r"unsupported `format_version` None", id="no-version"
        ),
        pytest.param({"format": "other"}, r"`format` must be 'tnrec.feature_spec'", id="format"),
        pytest.param({"hash": "md5"}, r"unsupported `hash` 'md5'", id="hash"),
        pytest.param({"columns": {}}, r"`columns` must be a list", id="columns"),
        pytest.param(
            {"columns": [{"type": "wide", "key": "a"}]}, r"unknown column type 'wide'", id="type"
        ),
        pytest.param(
            {"columns": [{"type": "category", "key": "a"}]},
            r"column 'a' has no field `dtype`",
            id="field",
        ),
        pytest.param(
            {
                "columns": [
                    {"type": "numeric", "key": "a", "default": 0, "transforms": [{"type": "x"}]}
                ]
            },
            r"unknown transform",
            id="transform",
        ),
    ],
)
def test_spec_refusals(change, match):
    spec = fc.to_spec(all_columns())
    spec.update(change)
    with pytest.raises(SpecError, match=match):
        fc.from_spec(spec)


def test_a_spec_with_the_older_version_key_reads_the_same():
    cols = all_columns()
    spec = fc.to_spec(cols)
    older = {k: v for k, v in spec.items() if k != "format_version"} | {"version": 1}
    assert fc.from_spec(older) == cols
    assert fc.canonical_spec(older) == spec
    with pytest.raises(SpecError, match=r"unsupported `format_version` 3"):
        fc.from_spec({**older, "version": 3})


def test_spec_refuses_bad_documents():
    with pytest.raises(SpecError, match="not valid JSON"):
        fc.from_spec("{")
    with pytest.raises(SpecError, match="`format` must be"):
        fc.from_spec("[]")
    with pytest.raises(SpecError, match='two columns have the key "a"'):
        fc.to_spec([fc.category_column("a"), fc.numeric_column("a")])
